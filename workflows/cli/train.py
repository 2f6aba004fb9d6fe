"""``dsx train smoke``: a short DDP training run among local ranks, judged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from steps.errors import InputError
from steps.readiness.checks import SmokeRequest, run_training_smoke
from steps.readiness.models import Subject
from steps.readiness.thresholds import load_thresholds
from workflows.cli.nccl import RANKS_OPTION, _evidence_dir, print_verdicts, run_ranks
from workflows.cli.output import OUTPUT_OPTION, OutputFormat, check_out_dir, emit, print_table

__all__ = ["register"]

train_app = typer.Typer(name="train", help="Training smoke runs.", no_args_is_help=True)


@train_app.command("smoke")
def smoke_cmd(
    ranks: int = RANKS_OPTION,
    backend: str = typer.Option("gloo", "--backend", help="gloo (CPU processes) or nccl (one GPU per rank)."),
    steps: int | None = typer.Option(None, "--steps", help="Training steps (default: thresholds, else 30)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Sequences per rank per step."),
    seq_len: int = typer.Option(32, "--seq-len", help="Tokens per sequence."),
    d_model: int = typer.Option(64, "--d-model", help="Model width."),
    layers: int = typer.Option(2, "--layers", help="Transformer layers."),
    heads: int = typer.Option(4, "--heads", help="Attention heads."),
    inject: list[str] = typer.Option(
        [], "--inject", help="Fault on one rank: 1:delay=20ms, 1:fail, 1:hang, 0:nan."
    ),
    timeout: float = typer.Option(
        300.0, "--timeout", help="Kill every rank after this many seconds (verdict hang)."
    ),
    thresholds: Path | None = typer.Option(
        None, "--thresholds", help="YAML/JSON with the recipe's thresholds."
    ),
    name: str = typer.Option("local", "--name", help="Name of the group the ranks stand for."),
    nodes: str | None = typer.Option(
        None, "--nodes", help="Comma-separated node name per rank (default: host)."
    ),
    out_dir: Path | None = typer.Option(
        None, "--out-dir", help="Evidence folder (default: $DSX_OUTPUT_DIR or a new temp folder)."
    ),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Train a few transformer layers with DDP on synthetic data: the loss must fall, no NaN on any
    rank, no straggler; on GPU, achieved TFLOP/s against the recipe's peak.

    Exit 0 when every verdict passes, 1 when one fails, hangs or errs, 2 for bad input.
    """

    if backend not in ("gloo", "nccl"):
        raise InputError(f"--backend {backend!r}: use gloo or nccl")
    check_out_dir(out_dir, "--out-dir")
    hosts = [n.strip() for n in nodes.split(",")] if nodes else None
    request = SmokeRequest(
        subject=Subject(kind="group", name=name, members=sorted(set(hosts)) if hosts else []),
        ranks=ranks,
        backend=backend,
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        d_model=d_model,
        layers=layers,
        heads=heads,
        inject=inject,
        timeout_s=timeout,
        thresholds=load_thresholds(thresholds),  # dsx's defaults without --thresholds
        rank_hosts=hosts,
        out_dir=_evidence_dir(out_dir, "dsx-train-smoke-") or None,
    )
    outcome = run_ranks(run_training_smoke, request)

    emit(outcome, output, lambda _: _print_smoke(outcome))
    raise typer.Exit(0 if outcome.status == "pass" else 1)


def _print_smoke(outcome: Any) -> None:
    """A smoke run's figures, its ranks, its verdicts and where its evidence is."""

    result = outcome.result
    if result is not None:
        typer.echo(
            f"{result.world_size} ranks, {result.steps} steps, "
            f"{result.parameters} parameters on {result.device}; "
            f"loss {result.initial_loss} -> {result.final_loss}; {result.throughput_tokens_s:g} tokens/s"
            + (
                f"; {result.tflops_per_gpu} TFLOP/s per GPU, MFU {result.mfu}"
                if result.tflops_per_gpu
                else ""
            )
        )
        rows = [
            [
                r.rank,
                r.host,
                f"{r.median_step_s * 1000:.2f}",
                f"{r.median_own_s * 1000:.2f}",
                f"{r.skew:.3f}",
                r.injected or "",
            ]
            for r in result.ranks
        ]
        print_table("ranks", ["rank", "node", "step (ms)", "own work (ms)", "skew", "injected"], rows)
    print_verdicts(outcome.verdicts)
    typer.echo(f"{outcome.status}; evidence in {outcome.out_dir}")


def register(app: typer.Typer) -> None:
    """Add the ``train`` command group."""
    app.add_typer(train_app, name="train")

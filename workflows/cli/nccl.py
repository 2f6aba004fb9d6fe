"""``dsx nccl parse|sweep``: read nccl-tests logs, run all-reduce sweeps among local ranks."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from steps.cluster import vocabulary as vocab
from steps.errors import InputError
from steps.readiness.check import CheckOutcome
from steps.readiness.checks import SweepRequest, run_allreduce_sweep
from steps.readiness.models import CollectiveRun, Subject, Verdict
from steps.readiness.nccl_tests import exit_code, parse_nccl_tests_file
from steps.readiness.ranks import sweep
from steps.readiness.sizes import format_size
from steps.readiness.thresholds import load_thresholds
from workflows.cli._signals import EXIT_TERMINATED, Terminated, sigterm_as_interrupt
from workflows.cli.output import OUTPUT_OPTION, OutputFormat, check_out_dir, emit, print_table

__all__ = ["MAX_LOCAL_RANKS", "RANKS_OPTION", "register", "run_ranks"]

MAX_LOCAL_RANKS = 64
"""The most rank processes a local run starts. Each is a process on this machine with torch loaded
(hundreds of MB each) and, with nccl, a GPU of its own: past a few dozen, a local run measures the
machine's memory and CPU contention rather than the collective, and a mistyped count (``-n 1000``)
would exhaust the machine before anything is measured. Larger groups run on a cluster."""

RANKS_OPTION = typer.Option(
    2,
    "--ranks",
    "-n",
    min=1,
    max=MAX_LOCAL_RANKS,
    help=f"Rank processes to start on this machine (1 to {MAX_LOCAL_RANKS}).",
)

nccl_app = typer.Typer(
    name="nccl", help="NCCL all-reduce: parse nccl-tests logs, run sweeps.", no_args_is_help=True
)


def _figure(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.2f}"


def _print_run(run: CollectiveRun) -> None:
    typer.echo(
        f"{run.source} {run.collective or 'collective'}: {run.status}; {len(run.results)} rows, "
        f"{len(run.ranks)} ranks on {len(run.hosts)} hosts ({', '.join(run.hosts) or 'not listed'})"
    )
    if run.footer is not None:
        typer.echo(
            f"footer: out-of-bounds {run.footer.out_of_bounds} "
            f"{'OK' if run.footer.out_of_bounds_ok else 'FAILED'}, "
            f"avg busbw {_figure(run.footer.avg_busbw_gbps)} GB/s"
        )
    for label in run.injected:
        typer.echo(f"injected: {label}")
    rows = []
    for row in run.rows:
        oop, inp = row.out_of_place, row.in_place
        rows.append(
            [
                format_size(row.size),
                row.type,
                _figure(oop.time_us if oop else None),
                _figure(oop.busbw_gbps if oop else None),
                _figure(inp.time_us if inp else None),
                _figure(inp.busbw_gbps if inp else None),
                row.wrong(),
            ]
        )
    print_table(
        None, ["size", "type", "oop time (us)", "oop busbw", "ip time (us)", "ip busbw", "#wrong"], rows
    )
    for problem in run.problems:
        typer.echo(f"problem: {problem}", err=True)


def print_verdicts(verdicts: list[Verdict]) -> None:
    """The verdicts as a table: status, subject, test, measured, threshold, message."""
    rows = [
        [
            v.status,
            f"{v.subject.kind} {v.subject.name}",
            v.test,
            "" if v.measured is None else f"{v.measured:g}",
            "" if v.threshold is None else f"{v.threshold:g}",
            v.message,
        ]
        for v in verdicts
    ]
    print_table("verdicts", ["status", "subject", "test", "measured", "threshold", "message"], rows)


def _evidence_dir(out_dir: Path | None, prefix: str) -> str:
    if out_dir is not None or os.environ.get(vocab.ENV_OUTPUT_DIR):
        return str(out_dir) if out_dir is not None else ""
    return tempfile.mkdtemp(prefix=prefix)


def run_ranks(work: Callable[[Any], Any], request: Any) -> Any:
    """Run a local multi-rank check; SIGTERM stops it as Ctrl-C does (ranks killed and reaped, exit 143).

    Raises:
        typer.Exit: with status 143 after SIGTERM, 130 after Ctrl-C, once every rank is gone.
    """

    try:
        with sigterm_as_interrupt():
            return work(request)
    except KeyboardInterrupt as exc:  # the launcher has killed its ranks; its server closes at exit
        why = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        where = f"; evidence so far in {request.out_dir}" if request.out_dir else ""
        typer.secho(f"error: {why}: every rank was stopped{where}", fg=typer.colors.RED, err=True)
        raise typer.Exit(EXIT_TERMINATED if isinstance(exc, Terminated) else 130) from None


@nccl_app.command("parse")
def parse_cmd(
    file: str = typer.Argument(
        ..., help="nccl-tests output (all_reduce_perf and the other *_perf), or - for stdin."
    ),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Read an nccl-tests log: preamble, ranks and hosts, every row, footer, failures.

    Exit 0 for a complete, clean run; 1 for a failed, corrupted (#wrong above 0, out-of-bounds FAILED)
    or incomplete (no footer) run; 2 for input that is not an nccl-tests log.
    """

    run = parse_nccl_tests_file(file)
    emit(run, output, _print_run)
    raise typer.Exit(exit_code(run))


@nccl_app.command("sweep")
def sweep_cmd(
    ranks: int = RANKS_OPTION,
    backend: str = typer.Option("gloo", "--backend", help="gloo (CPU processes) or nccl (one GPU per rank)."),
    min_bytes: str = typer.Option(
        format_size(sweep.DEFAULTS.min_bytes),
        "--min-bytes",
        "-b",
        help="Smallest message (B, KiB, MiB, GiB).",
    ),
    max_bytes: str = typer.Option(
        format_size(sweep.DEFAULTS.max_bytes), "--max-bytes", "-e", help="Largest message."
    ),
    factor: int = typer.Option(
        sweep.DEFAULTS.factor, "--factor", "-f", help="Multiply the size by this between steps."
    ),
    warmup: int = typer.Option(sweep.DEFAULTS.warmup, "--warmup", "-w", help="Warm-up iterations per size."),
    iters: int = typer.Option(sweep.DEFAULTS.iters, "--iters", "-i", help="Timed iterations per size."),
    inject: list[str] = typer.Option(
        [], "--inject", help="Fault on one rank: 3:delay=5ms, 2:fail, 1:hang, 1:corrupt."
    ),
    timeout: float = typer.Option(
        300.0, "--timeout", help="Kill every rank after this many seconds (verdict hang)."
    ),
    thresholds: Path | None = typer.Option(
        None, "--thresholds", help="YAML/JSON with the recipe's thresholds."
    ),
    scope: str = typer.Option("node", "--scope", help="Which thresholds apply: node or multi-node."),
    name: str = typer.Option("local", "--name", help="Name of the group the ranks stand for."),
    nodes: str | None = typer.Option(
        None, "--nodes", help="Comma-separated node name per rank (default: host)."
    ),
    out_dir: Path | None = typer.Option(
        None, "--out-dir", help="Evidence folder (default: $DSX_OUTPUT_DIR or a new temp folder)."
    ),
    torchrun: bool = typer.Option(
        False, "--torchrun", help="Run as one rank started by torchrun (RANK, WORLD_SIZE...)."
    ),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Run an all-reduce sweep among local ranks (or as one torchrun rank) and judge it.

    Exit 0 when every verdict passes, 1 when one fails, hangs or errs, 2 for bad input.
    """

    if backend not in ("gloo", "nccl"):
        raise InputError(f"--backend {backend!r}: use gloo or nccl")
    if scope not in ("node", "multi-node"):
        raise InputError(f"--scope {scope!r}: use node or multi-node")
    check_out_dir(out_dir, "--out-dir")
    if torchrun:
        raise typer.Exit(
            _torchrun_sweep(backend, min_bytes, max_bytes, factor, warmup, iters, timeout, inject, out_dir)
        )

    hosts = [n.strip() for n in nodes.split(",")] if nodes else None
    members = sorted(set(hosts)) if hosts else []
    request = SweepRequest(
        subject=Subject(kind="group", name=name, members=members),
        ranks=ranks,
        backend=backend,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        factor=factor,
        warmup=warmup,
        iters=iters,
        inject=inject,
        timeout_s=timeout,
        thresholds=load_thresholds(thresholds),  # dsx's defaults without --thresholds
        scope=scope,
        rank_hosts=hosts,
        out_dir=_evidence_dir(out_dir, "dsx-nccl-sweep-") or None,
    )
    outcome = run_ranks(run_allreduce_sweep, request)
    emit(outcome, output, lambda _: _print_sweep(outcome))
    raise typer.Exit(0 if outcome.status == "pass" else 1)


def _torchrun_sweep(
    backend: str,
    min_bytes: str,
    max_bytes: str,
    factor: int,
    warmup: int,
    iters: int,
    timeout: float,
    inject: list[str],
    out_dir: Path | None,
) -> int:
    """Run this process as one rank of a sweep started by torchrun; its exit status."""

    args = ["--backend", backend, "--min-bytes", min_bytes, "--max-bytes", max_bytes, "--factor", str(factor)]
    args += ["--warmup", str(warmup), "--iters", str(iters), "--timeout", str(timeout)]
    for spec in inject:
        args += ["--inject", spec]
    if out_dir is not None:
        args += ["--out", str(out_dir / "sweep.json"), "--table", str(out_dir / "sweep.txt")]
    return sweep.main(args)


def _print_sweep(outcome: CheckOutcome[CollectiveRun]) -> None:
    """A sweep's table (nccl-tests layout), its verdicts and where its evidence is."""
    table_file = Path(outcome.out_dir) / "sweep.txt"
    if outcome.result is not None and table_file.exists():
        sys.stdout.write(table_file.read_text(encoding="utf-8"))
    print_verdicts(outcome.verdicts)
    typer.echo(f"{outcome.status}; evidence in {outcome.out_dir}")


def register(app: typer.Typer) -> None:
    """Add the ``nccl`` command group."""
    app.add_typer(nccl_app, name="nccl")

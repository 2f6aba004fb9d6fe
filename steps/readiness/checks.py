"""The readiness checks as workflow steps: plain functions, pydantic in, pydantic out.

Each step writes its evidence under ``$DSX_OUTPUT_DIR`` when set (else the request's ``out_dir``)
and returns an outcome that serialises to JSON, so a workflow can pass it on to the report step.
No step reads workflow variables.

- :func:`run_allreduce_sweep`: a local all-reduce sweep (N ranks on this machine), judged.
- :func:`judge_allreduce_run`: judge a sweep or an nccl-tests log produced elsewhere (torchrun pods).
- :func:`judge_groups_relative`: relative mode over the groups of one certification run.
- :func:`run_training_smoke`: a local DDP training smoke run, judged.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, ValidationError

from steps.errors import InputError
from steps.files import write_text
from steps.models import input_error
from steps.readiness.evidence import output_dir
from steps.readiness.inject import parse_injections
from steps.readiness.judge import judge_collective, judge_launch, judge_relative, straggler_verdicts
from steps.readiness.launch import LaunchResult, launch_local
from steps.readiness.models import CollectiveRun, Model, Subject, Verdict, VerdictStatus, dump_json, worst
from steps.readiness.sizes import parse_size
from steps.readiness.smoke import SmokeConfig, SmokeResult, smoke_args
from steps.readiness.sweep import SweepConfig, sweep_args
from steps.readiness.thresholds import Scope, Thresholds, load_thresholds

__all__ = [
    "GroupRun",
    "RelativeRequest",
    "SmokeOutcome",
    "SmokeRequest",
    "SweepOutcome",
    "SweepRequest",
    "judge_allreduce_run",
    "judge_groups_relative",
    "judge_smoke",
    "run_allreduce_sweep",
    "run_training_smoke",
    "smoke_config",
    "sweep_config",
]


class SweepRequest(Model):
    """A local all-reduce sweep: who it stands for, what to measure, what to judge against."""

    subject: Subject
    ranks: int = Field(default=2, ge=1)
    backend: Literal["gloo", "nccl"] = "gloo"
    min_bytes: int | str = "1KiB"
    max_bytes: int | str = "16MiB"
    factor: int = Field(default=4, ge=2)
    warmup: int = Field(default=5, ge=0)
    iters: int = Field(default=20, ge=1)
    inject: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=300.0, gt=0)
    thresholds: dict[str, Any] | None = Field(default=None, description="the recipe's thresholds mapping")
    scope: Scope = "node"
    rank_hosts: list[str] | None = Field(default=None, description="the node each rank stands for")
    out_dir: str | None = None


class SweepOutcome(Model):
    """A judged sweep: the run (absent when the ranks failed or hung), verdicts and evidence."""

    subject: Subject
    status: VerdictStatus
    run: CollectiveRun | None = None
    verdicts: list[Verdict]
    evidence: list[str]
    out_dir: str
    elapsed_s: float


class GroupRun(Model):
    """One group's all-reduce run, for relative mode."""

    subject: Subject
    run: CollectiveRun


class RelativeRequest(Model):
    """Relative mode over the groups of one certification run."""

    groups: list[GroupRun]
    thresholds: dict[str, Any] | None = None
    size: int | str | None = Field(default=None, description="compare at this size (default: largest common)")


class SmokeRequest(Model):
    """A local DDP training smoke run."""

    subject: Subject
    ranks: int = Field(default=2, ge=1)
    backend: Literal["gloo", "nccl"] = "gloo"
    steps: int | None = Field(default=None, description="default: thresholds.training.steps")
    batch_size: int = 8
    seq_len: int = 32
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    vocab: int = 64
    inject: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=300.0, gt=0)
    min_loss_drop: float = Field(default=0.05, ge=0, lt=1, description="the loss must fall by this fraction")
    thresholds: dict[str, Any] | None = None
    rank_hosts: list[str] | None = None
    out_dir: str | None = None


class SmokeOutcome(Model):
    """A judged smoke run."""

    subject: Subject
    status: VerdictStatus
    result: SmokeResult | None = None
    verdicts: list[Verdict]
    evidence: list[str]
    out_dir: str
    elapsed_s: float


def _thresholds(raw: dict[str, Any] | None) -> Thresholds:
    return load_thresholds(raw)


def _read_json(path: Path, model: type[Model]) -> Any:
    try:
        return model.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError):
        return None


def _rank_files(launch: LaunchResult) -> list[str]:
    return [path for rank in launch.ranks for path in (rank.stdout, rank.stderr)]


_Outcome = TypeVar("_Outcome", SweepOutcome, SmokeOutcome)


def judged(
    kind: type[_Outcome],
    subject: Subject,
    verdicts: list[Verdict],
    evidence: list[str],
    out_dir: str,
    elapsed_s: float,
    **result: Any,
) -> _Outcome:
    """A check's outcome, its status the worst of its verdicts; ``result`` is the run or result read."""
    return kind(
        subject=subject,
        status=worst([v.status for v in verdicts]),
        verdicts=verdicts,
        evidence=evidence,
        out_dir=out_dir,
        elapsed_s=elapsed_s,
        **result,
    )


def _launch_and_read(
    test: str,
    module: str,
    args: list[str],
    request: SweepRequest | SmokeRequest,
    folder: Path,
    result_file: Path,
    model: type[Model],
) -> tuple[Any, list[Verdict], list[str], float]:
    """Run ``module`` as the request's local ranks; rank 0's result read as ``model`` (or None), the
    verdicts on how the ranks ended (hang, error, no readable result), the ranks' log files, the elapsed
    time."""
    subject, timeout_s = request.subject, request.timeout_s
    launch = launch_local(
        module, args, request.ranks, folder / "ranks", timeout_s=timeout_s, rank_hosts=request.rank_hosts
    )
    evidence = _rank_files(launch)
    verdicts = judge_launch(launch, subject, test, timeout_s)
    result = _read_json(result_file, model) if launch.ok else None
    if launch.ok and result is None:
        verdicts.append(
            Verdict(
                subject=subject,
                test=test,
                status="error",
                evidence=evidence,
                message=f"{subject.kind} {subject.name}: rank 0 wrote no readable result",
            )
        )
    return result, verdicts, evidence, launch.elapsed_s


def sweep_config(request: SweepRequest) -> SweepConfig:
    """The sweep program's settings for ``request``.

    Raises:
        InputError: a size or setting is malformed.
    """
    try:
        return SweepConfig(
            backend=request.backend,
            min_bytes=parse_size(request.min_bytes, "min_bytes"),
            max_bytes=parse_size(request.max_bytes, "max_bytes"),
            factor=request.factor,
            warmup=request.warmup,
            iters=request.iters,
            inject=request.inject,
            timeout_s=request.timeout_s,
        )
    except ValidationError as exc:
        raise input_error(exc, "sweep") from None


def smoke_config(request: SmokeRequest, thresholds: Thresholds) -> SmokeConfig:
    """The smoke run program's settings for ``request``, its step count and peak from the thresholds.

    Raises:
        InputError: a model setting is malformed.
    """
    training = thresholds.training
    try:
        config = SmokeConfig(
            backend=request.backend,
            steps=request.steps if request.steps is not None else training.steps,
            batch_size=request.batch_size,
            seq_len=request.seq_len,
            d_model=request.d_model,
            layers=request.layers,
            heads=request.heads,
            vocab=request.vocab,
            peak_tflops=training.peak_tflops,
            inject=request.inject,
            timeout_s=request.timeout_s,
        )
    except ValidationError as exc:
        raise input_error(exc, "smoke run") from None
    if config.d_model % config.heads:
        raise InputError(f"smoke run: d_model {config.d_model} is not a multiple of heads {config.heads}")
    return config


def run_allreduce_sweep(request: SweepRequest) -> SweepOutcome:
    """Run a local all-reduce sweep of ``request.ranks`` processes and judge it.

    Evidence: ``sweep.json`` (the run), ``sweep.txt`` (nccl-tests layout), ``ranks/rank-N.stdout`` and
    ``.stderr``, and ``outcome.json`` (this outcome).

    Raises:
        InputError: a size, fault or threshold in the request is malformed (nothing is written).
    """
    thresholds = _thresholds(request.thresholds)
    config = sweep_config(request)
    config.sizes()
    parse_injections(request.inject, request.ranks, ("delay", "fail", "hang", "corrupt"))
    folder = output_dir(request.out_dir)
    run_file, table_file = folder / "sweep.json", folder / "sweep.txt"
    for stale in (run_file, table_file):
        stale.unlink(missing_ok=True)
    args = [*sweep_args(config), "--out", str(run_file), "--table", str(table_file)]
    run, verdicts, evidence, elapsed = _launch_and_read(
        "allreduce-sweep", "steps.readiness.sweep", args, request, folder, run_file, CollectiveRun
    )
    if run is not None:
        evidence = [str(run_file), str(table_file), *evidence]
        verdicts += judge_collective(run, request.subject, thresholds, request.scope, [str(table_file)])
    outcome = judged(SweepOutcome, request.subject, verdicts, evidence, str(folder), elapsed, run=run)
    write_text(folder / "outcome.json", dump_json(outcome))
    return outcome


def judge_allreduce_run(
    run: CollectiveRun,
    subject: Subject,
    thresholds: dict[str, Any] | None = None,
    scope: Scope = "node",
    evidence: list[str] | None = None,
) -> list[Verdict]:
    """Judge an all-reduce run produced elsewhere: a sweep under torchrun, or a parsed nccl-tests log."""
    return judge_collective(run, subject, _thresholds(thresholds), scope, evidence or [])


def judge_groups_relative(request: RelativeRequest) -> list[Verdict]:
    """Relative mode: groups of equal size compared with their median and MAD (see :func:`judge_relative`)."""
    size = None if request.size is None else parse_size(request.size, "size")
    pairs = [(group.subject, group.run) for group in request.groups]
    return judge_relative(pairs, _thresholds(request.thresholds), size)


def judge_smoke(
    result: SmokeResult, subject: Subject, thresholds: Thresholds, min_loss_drop: float, evidence: list[str]
) -> list[Verdict]:
    """Verdicts of a smoke run: finite losses on every rank, falling loss, stragglers, MFU on GPU."""
    verdicts: list[Verdict] = []
    name = f"{subject.kind} {subject.name}"
    bad = [r for r in result.ranks if r.first_nonfinite_step is not None]
    if bad:
        first = min(r.first_nonfinite_step or 0 for r in bad)
        culprits = [r for r in bad if r.first_nonfinite_step == first]
        who = ", ".join(
            f"rank {r.rank} on node {r.host}" + (f" ({r.injected})" if r.injected else "") for r in culprits
        )
        verdicts.append(
            Verdict(
                subject=subject,
                test="smoke-finite",
                status="error",
                measured=float(first),
                unit="step",
                evidence=evidence,
                message=f"{name}: loss became NaN or Inf at step {first} on {who}; {len(bad)} ranks affected",
                rank=culprits[0].rank if len(culprits) == 1 else None,
                node=culprits[0].host if len(culprits) == 1 else None,
                injected=any(r.injected for r in culprits),
            )
        )
    else:
        verdicts.append(
            Verdict(
                subject=subject,
                test="smoke-finite",
                status="pass",
                evidence=evidence,
                message=f"{name}: every loss on all {result.world_size} ranks is finite",
            )
        )
    if result.initial_loss is not None and result.final_loss is not None:
        limit = result.initial_loss * (1 - min_loss_drop)
        ok = result.final_loss <= limit
        verdicts.append(
            Verdict(
                subject=subject,
                test="smoke-loss",
                status="pass" if ok else "fail",
                measured=result.final_loss,
                threshold=round(limit, 6),
                unit="loss",
                evidence=evidence,
                message=(
                    f"{name}: loss fell from {result.initial_loss:.4f} to {result.final_loss:.4f} over "
                    f"{result.steps} steps" + ("" if ok else f", not below {limit:.4f}")
                ),
            )
        )
    limit = thresholds.training.straggler_skew
    median_own = statistics.median(r.median_own_s for r in result.ranks)
    by_rank = {r.rank: r for r in result.ranks}

    def slow(rank: Any) -> str:
        record = by_rank[rank.rank]
        return (
            f"{record.median_own_s * 1000:.1f} ms "
            f"of its own work per step against {median_own * 1000:.1f} ms for the median rank, "
            f"skew {record.skew:.2f} of a {result.median_step_s * 1000:.1f} ms step > {limit:g}"
        )

    def fine(top: Any) -> str:
        return f"{name}: no straggler among {result.world_size} ranks (largest skew {top.skew:.2f})"

    verdicts += straggler_verdicts(subject, "smoke-straggler", result.ranks, limit, evidence, slow, fine)
    training = thresholds.training
    if result.mfu is not None and training.min_mfu is not None:
        ok = result.mfu >= training.min_mfu
        verdicts.append(
            Verdict(
                subject=subject,
                test="smoke-mfu",
                status="pass" if ok else "fail",
                measured=result.mfu,
                threshold=training.min_mfu,
                unit="MFU",
                evidence=evidence,
                message=(
                    f"{name}: {result.tflops_per_gpu:g} TFLOP/s per GPU is MFU {result.mfu:.3f} of the "
                    f"{training.peak_tflops:g} TFLOP/s peak, "
                    f"{'meeting' if ok else 'below'} {training.min_mfu:g}"
                ),
            )
        )
    return verdicts


def run_training_smoke(request: SmokeRequest) -> SmokeOutcome:
    """Run a local DDP training smoke run of ``request.ranks`` processes and judge it.

    Evidence: ``smoke.json`` (the result), ``ranks/rank-N.stdout`` and ``.stderr``, ``outcome.json``.

    Raises:
        InputError: a fault, model setting or threshold in the request is malformed (nothing is written).
    """
    thresholds = _thresholds(request.thresholds)
    config = smoke_config(request, thresholds)
    parse_injections(request.inject, request.ranks)
    folder = output_dir(request.out_dir)
    result_file = folder / "smoke.json"
    result_file.unlink(missing_ok=True)
    args = [*smoke_args(config), "--out", str(result_file)]
    result, verdicts, evidence, elapsed = _launch_and_read(
        "training-smoke", "steps.readiness.smoke", args, request, folder, result_file, SmokeResult
    )
    if result is not None:
        evidence = [str(result_file), *evidence]
        verdicts += judge_smoke(
            result, request.subject, thresholds, request.min_loss_drop, [str(result_file)]
        )
    outcome = judged(SmokeOutcome, request.subject, verdicts, evidence, str(folder), elapsed, result=result)
    write_text(folder / "outcome.json", dump_json(outcome))
    return outcome

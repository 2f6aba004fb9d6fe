"""The readiness checks, the all-reduce sweep, the training smoke run and DCGM's diagnostics: requests,
runs, and each test's registration.

Each is one :class:`~steps.readiness.check.Check` made from its request
(:func:`allreduce_sweep_check`, :func:`training_smoke_check`, :func:`diag_check`) and run by whichever
launcher the caller gives (:func:`run_sweep`, :func:`run_smoke`, :func:`run_diag`); the outcome is the
same :class:`~steps.readiness.check.CheckOutcome` either way, so the report does not care where the
ranks ran. :data:`KINDS` registers each test's :class:`~steps.readiness.check.CheckKind` (its result
model, its section and plot in the report, the faults its result names): the store, the report and the
labels read every outcome through it.

- :func:`run_allreduce_sweep`, :func:`run_training_smoke`: the local runs (N ranks on this machine) of
  ``dsx nccl sweep`` and ``dsx train smoke``; each writes its evidence under ``$DSX_OUTPUT_DIR`` when set
  (else the request's ``out_dir``), ``outcome.json`` last.
- :func:`judge_allreduce_run`: judge a sweep or an nccl-tests log produced elsewhere (torchrun pods).
- :func:`judge_groups_relative`: relative mode over the groups of one certification run.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError

from steps.errors import InputError
from steps.files import write_text
from steps.models import input_error
from steps.outputs import output_dir
from steps.readiness import check
from steps.readiness.check import CheckKind, CheckOutcome, Plot
from steps.readiness.judge import DIAG_TEST, judge_collective, judge_diag, judge_relative, judge_smoke
from steps.readiness.launchers.base import Launcher, RankProgram
from steps.readiness.launchers.local import RANK_SERVER_PRELOAD, LocalLauncher
from steps.readiness.models import CollectiveRun, Model, Subject, Verdict, dump_json
from steps.readiness.plots import plot_busbw, plot_step_times
from steps.readiness.ranks.diag import DiagResult, diag_args
from steps.readiness.ranks.inject import parse_injections
from steps.readiness.ranks.smoke import SmokeConfig, SmokeResult, smoke_args
from steps.readiness.ranks.sweep import DEFAULTS as SWEEP
from steps.readiness.ranks.sweep import SweepConfig, sweep_args
from steps.readiness.sections import diag_section, smoke_section, sweep_section
from steps.readiness.sizes import parse_size
from steps.readiness.thresholds import Scope, Thresholds

__all__ = [
    "ALLREDUCE_SWEEP",
    "DCGM_DIAG",
    "DIAG_TEST",
    "KINDS",
    "RANK_PRELOAD",
    "SMOKE_PRELOAD",
    "SMOKE_TEST",
    "SWEEP_TEST",
    "TRAINING_SMOKE",
    "DiagRequest",
    "GroupRun",
    "RelativeRequest",
    "SmokeRequest",
    "SweepRequest",
    "allreduce_sweep_check",
    "diag_check",
    "judge_allreduce_run",
    "judge_groups_relative",
    "run_allreduce_sweep",
    "run_diag",
    "run_smoke",
    "run_sweep",
    "run_training_smoke",
    "smoke_config",
    "sweep_config",
    "training_smoke_check",
]

SWEEP_TEST = "allreduce-sweep"
SMOKE_TEST = "training-smoke"


class SweepRequest(Model):
    """A local all-reduce sweep: who it stands for, what to measure, what to judge against."""

    subject: Subject
    ranks: int = Field(default=2, ge=1)
    backend: Literal["gloo", "nccl"] = "gloo"
    min_bytes: int | str = SWEEP.min_bytes
    max_bytes: int | str = SWEEP.max_bytes
    factor: int = Field(default=SWEEP.factor, ge=2)
    warmup: int = Field(default=SWEEP.warmup, ge=0)
    iters: int = Field(default=SWEEP.iters, ge=1)
    inject: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=SWEEP.timeout_s, gt=0)
    thresholds: Thresholds = Field(default_factory=Thresholds, description="the recipe's, parsed")
    scope: Scope = "node"
    rank_hosts: list[str] | None = Field(default=None, description="the node each rank stands for")
    out_dir: str | None = None


class DiagRequest(Model):
    """DCGM's diagnostics on a node: what ``dcgmi diag -r`` runs, against which host engine."""

    subject: Subject
    run: str = Field(description="dcgmi diag -r: a level 1-4 or test names, comma-separated")
    host: str = Field(default="", description="the DCGM host engine; empty: dcgmi's own default, localhost")
    timeout_s: float = Field(default=3600.0, gt=0)


class GroupRun(Model):
    """One group's all-reduce run, for relative mode."""

    subject: Subject
    run: CollectiveRun


class RelativeRequest(Model):
    """Relative mode over the groups of one certification run."""

    groups: list[GroupRun]
    thresholds: Thresholds = Field(default_factory=Thresholds)
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
    thresholds: Thresholds = Field(default_factory=Thresholds)
    rank_hosts: list[str] | None = None
    out_dir: str | None = None


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


def allreduce_sweep_check(request: SweepRequest) -> check.Check[CollectiveRun]:
    """The all-reduce sweep of ``request`` as a check: rank 0 writes the run and its table.

    Raises:
        InputError: a size, fault or threshold in the request is malformed.
    """
    thresholds = request.thresholds
    config = sweep_config(request)
    config.sizes()
    parse_injections(request.inject, request.ranks, ("delay", "fail", "hang", "corrupt"))
    program = RankProgram(
        module="steps.readiness.ranks.sweep",
        args=sweep_args(config),
        outputs=[("--out", "sweep.json"), ("--table", "sweep.txt")],
    )

    def judge(run: CollectiveRun, evidence: list[str]) -> list[Verdict]:
        return judge_collective(run, request.subject, thresholds, request.scope, evidence)

    return check.Check(SWEEP_TEST, request.subject, program, CollectiveRun, judge, request.timeout_s)


#: What a smoke rank imports beyond torch: its own module, DDP, and the optimizer, whose constructor loads
#: torch._dynamo (1.5 s of CPU in every rank when each imports it for itself).
SMOKE_PRELOAD = ("steps.readiness.ranks.smoke", "torch.nn.parallel", "torch.optim", "torch._dynamo")

#: What the ranks of every check import, for a step module running checks to name as its
#: ``FORK_SERVER_PRELOAD``: a local runner's fork server then imports it once for all its steps, and
#: each step's ranks fork from a server that has it (:mod:`steps.forkserver`); a server of each step's own
#: would import torch again (3 to 5 s of CPU per step).
RANK_PRELOAD = (*RANK_SERVER_PRELOAD, "steps.readiness.ranks.sweep", *SMOKE_PRELOAD)


def training_smoke_check(request: SmokeRequest) -> check.Check[SmokeResult]:
    """The training smoke run of ``request`` as a check: rank 0 writes the result.

    Raises:
        InputError: a fault, model setting or threshold in the request is malformed.
    """
    thresholds = request.thresholds
    config = smoke_config(request, thresholds)
    parse_injections(request.inject, request.ranks)
    program = RankProgram(
        module="steps.readiness.ranks.smoke",
        args=smoke_args(config),
        outputs=[("--out", "smoke.json")],
        preload=list(SMOKE_PRELOAD),
    )

    def judge(result: SmokeResult, evidence: list[str]) -> list[Verdict]:
        return judge_smoke(result, request.subject, thresholds, request.min_loss_drop, evidence)

    return check.Check(SMOKE_TEST, request.subject, program, SmokeResult, judge, request.timeout_s)


def diag_check(request: DiagRequest) -> check.Check[DiagResult]:
    """DCGM's diagnostics on the node of ``request`` as a check: rank 0 runs them and writes the result.

    The run is given a minute beyond dcgmi's own deadline, so that a diagnostic past it is reported by
    the rank (with what dcgmi said) rather than cut off as a hang.
    """
    program = RankProgram(
        module="steps.readiness.ranks.diag",
        args=diag_args(request.run, request.host, request.timeout_s),
        outputs=[("--out", "diag.json")],
    )

    def judge(result: DiagResult, evidence: list[str]) -> list[Verdict]:
        return judge_diag(result, request.subject, evidence)

    return check.Check(DIAG_TEST, request.subject, program, DiagResult, judge, request.timeout_s + 60.0)


def run_diag(request: DiagRequest, launcher: Launcher) -> CheckOutcome[DiagResult]:
    """Run DCGM's diagnostics of ``request`` with ``launcher`` and judge them."""
    return check.run(diag_check(request), launcher)


def run_sweep(request: SweepRequest, launcher: Launcher) -> CheckOutcome[CollectiveRun]:
    """Run the all-reduce sweep of ``request`` with ``launcher`` and judge it."""
    return check.run(allreduce_sweep_check(request), launcher)


def run_smoke(request: SmokeRequest, launcher: Launcher) -> CheckOutcome[SmokeResult]:
    """Run the training smoke run of ``request`` with ``launcher`` and judge it."""
    return check.run(training_smoke_check(request), launcher)


def run_allreduce_sweep(request: SweepRequest) -> CheckOutcome[CollectiveRun]:
    """Run a local all-reduce sweep of ``request.ranks`` processes and judge it.

    Evidence: ``sweep.json`` (the run), ``sweep.txt`` (nccl-tests layout), ``ranks/rank-N.stdout`` and
    ``.stderr``, and ``outcome.json`` (this outcome).

    Raises:
        InputError: a size, fault or threshold in the request is malformed (nothing is written).
    """
    allreduce_sweep_check(request)  # refuse a malformed request before the folder is made
    folder = output_dir(request.out_dir)
    outcome = run_sweep(request, LocalLauncher(folder, request.ranks, request.rank_hosts))
    write_text(folder / "outcome.json", dump_json(outcome))
    return outcome


def run_training_smoke(request: SmokeRequest) -> CheckOutcome[SmokeResult]:
    """Run a local DDP training smoke run of ``request.ranks`` processes and judge it.

    Evidence: ``smoke.json`` (the result), ``ranks/rank-N.stdout`` and ``.stderr``, ``outcome.json``.

    Raises:
        InputError: a fault, model setting or threshold in the request is malformed (nothing is written).
    """
    training_smoke_check(request)  # refuse a malformed request before the folder is made
    folder = output_dir(request.out_dir)
    outcome = run_smoke(request, LocalLauncher(folder, request.ranks, request.rank_hosts))
    write_text(folder / "outcome.json", dump_json(outcome))
    return outcome


def judge_allreduce_run(
    run: CollectiveRun,
    subject: Subject,
    thresholds: Thresholds | None = None,
    scope: Scope = "node",
    evidence: list[str] | None = None,
) -> list[Verdict]:
    """Judge an all-reduce run produced elsewhere: a sweep under torchrun, or a parsed nccl-tests log."""
    return judge_collective(run, subject, thresholds or Thresholds(), scope, evidence or [])


def judge_groups_relative(request: RelativeRequest) -> list[Verdict]:
    """Relative mode: groups of equal size compared with their median and MAD (see :func:`judge_relative`)."""
    size = None if request.size is None else parse_size(request.size, "size")
    pairs = [(group.subject, group.run) for group in request.groups]
    return judge_relative(pairs, request.thresholds, size)


ALLREDUCE_SWEEP: CheckKind[CollectiveRun] = CheckKind(
    SWEEP_TEST,
    CollectiveRun,
    "All-reduce sweeps",
    section=sweep_section,
    plot=Plot("busbw.png", "busbw against message size", plot_busbw),
    injected=lambda run: run.injected,
)
TRAINING_SMOKE: CheckKind[SmokeResult] = CheckKind(
    SMOKE_TEST,
    SmokeResult,
    "Training smoke runs",
    section=smoke_section,
    plot=Plot("step-time.png", "step time per rank", lambda runs, _, path: plot_step_times(runs, path)),
    injected=lambda result: result.injected,
)
DCGM_DIAG: CheckKind[DiagResult] = CheckKind(
    DIAG_TEST, DiagResult, "GPU diagnostics (DCGM)", section=diag_section
)

#: Every test's registration, by test name, in the order the report shows them.
KINDS: dict[str, CheckKind[Any]] = {kind.test: kind for kind in (ALLREDUCE_SWEEP, TRAINING_SMOKE, DCGM_DIAG)}

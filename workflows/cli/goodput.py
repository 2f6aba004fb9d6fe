"""``dsx goodput``: what the fleet lost, from the ledger (the group's own command); ``dsx goodput
simulate``: a fleet's lifetime under each policy, side by side."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import typer

from steps.cluster import changes, connect
from steps.errors import InputError
from steps.files import write_text
from steps.sentinel.goodput.ledger_report import EARLIEST, STATES, GoodputReport, parse_since, report
from steps.sentinel.goodput.metrics import exposition
from steps.sentinel.goodput.rates import MIN_CHECKPOINT_MINUTES, FaultRates, load_rates
from steps.sentinel.goodput.simulate import (
    FACTORS,
    BestSpares,
    CheckpointSweep,
    SimulationReport,
    Spread,
    expected_faults,
    simulate,
    spare_candidates,
    sweep_checkpoint,
    sweep_intervals,
)
from workflows.cli.output import OUTPUT_OPTION, OutputFormat, check_out_file, console, emit, print_table

__all__ = ["register"]

_MAX_NODES = 100_000
_MAX_GPUS_PER_NODE = 64
_MAX_DAYS = 3_650
_MAX_SEEDS = 100
#: Faults one command may simulate (expected faults per run x seeds x policies): a few seconds of work.
_MAX_FAULTS = 2_000_000


def _percent(spread: Spread) -> str:
    return (
        f"{spread.mean * 100:.1f}% ±{spread.stdev * 100:.1f} ({spread.min * 100:.1f}-{spread.max * 100:.1f})"
    )


def _count(spread: Spread) -> str:
    return f"{spread.mean:,.1f} ±{spread.stdev:.1f} ({spread.min:,.0f}-{spread.max:,.0f})"


def _best(best: BestSpares | None) -> str:
    return "-" if best is None else f"{best.spares}: {_percent(best.goodput)}"


def _seeds(seeds: list[int]) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}"


def _table(report: SimulationReport) -> None:
    out = console()
    every = report.days * 24 / report.expected_interruptions if report.expected_interruptions else math.inf
    out.print(
        f"{report.nodes:,} nodes x {report.gpus_per_node} GPUs over {report.days:g} days, "
        f"{report.gpu_hours:,.0f} GPU-hours; {_seeds(report.seeds)}; rates {report.rates}"
    )
    out.print(
        f"the rate table expects {report.expected_interruptions:,.1f} interruptions "
        f"(one every {every:.1f} h) and {report.expected_slow_nodes:,.1f} silent slow nodes"
    )
    out.print(
        f"the job: {report.job_nodes:,} nodes in replicas of {report.replica_nodes} "
        f"({'elastic' if report.elastic else 'rigid'}), {report.nodes - report.job_nodes:,} spare; "
        f"checkpoint every {report.checkpoint_minutes:g} min (a save stops it "
        f"{report.checkpoint_save_seconds:g} s), restart {report.restart_minutes:g} min"
    )
    policies = report.policies
    total = report.gpu_hours
    rows: list[list[str]] = [
        ["goodput", *(_percent(p.goodput) for p in policies)],
        *([f"  {factor} goodput", *(_percent(p.factors[factor]) for p in policies)] for factor in FACTORS),
        ["effective training time", *(_percent(p.effective_training_time) for p in policies)],
        ["interruptions", *(_count(p.interruptions) for p in policies)],
        ["job restarts", *(_count(p.restarts) for p in policies)],
        ["slow nodes found", *(_count(p.slow_nodes_found) for p in policies)],
        ["nodes out for repair", *(_count(p.nodes_out) for p in policies)],
    ]
    if all(p.best_spares is not None for p in policies):
        rows.append(["best spares", *(_best(p.best_spares) for p in policies)])
    kinds = list(policies[0].lost_gpu_hours)
    for kind in kinds:
        rows.append(
            [f"lost: {kind}", *(f"{p.lost_gpu_hours[kind]:,.0f}" for p in policies)],
        )
    rows.append(
        [
            "lost GPU-hours",
            *(
                f"{sum(p.lost_gpu_hours.values()):,.0f} ({sum(p.lost_gpu_hours.values()) / total:.1%})"
                for p in policies
            ),
        ]
    )
    rows.append(["useful GPU-hours", *(f"{p.useful_gpu_hours:,.0f}" for p in policies)])
    print_table(
        "policies side by side (mean ±stdev (min-max) over seeds)", ["", *(p.policy for p in policies)], rows
    )
    names = list(policies[0].lost_by_class)
    by_class = [
        [name, *(f"{p.lost_by_class[name]:,.0f}" for p in policies)]
        for name in names
        if any(p.lost_by_class[name] for p in policies)
    ]
    print_table("GPU-hours lost by fault class (mean)", ["class", *(p.policy for p in policies)], by_class)


def _sweep_table(sweep: CheckpointSweep) -> None:
    out = console()
    out.print(
        f"{sweep.nodes:,} nodes x {sweep.gpus_per_node} GPUs over {sweep.days:g} days; "
        f"{_seeds(sweep.seeds)}; rates {sweep.rates}"
    )
    out.print(
        f"one interruption every {sweep.hours_between_interruptions:.2f} h (M) and a save of "
        f"{sweep.checkpoint_save_seconds:g} s (S): Young and Daly's interval sqrt(2 S M) is "
        f"{sweep.young_daly_minutes:.1f} min; restart {sweep.restart_minutes:g} min"
    )
    policies = list(sweep.best_minutes)
    rows = [
        [
            f"{point.checkpoint_minutes:g}",
            *(
                _percent(point.goodput[policy])
                + (" *" if point.checkpoint_minutes == sweep.best_minutes[policy] else "")
                for policy in policies
            ),
        ]
        for point in sweep.points
    ]
    print_table("goodput by checkpoint interval (* the best of each policy)", ["minutes", *policies], rows)


def _duration(seconds: float | None) -> str:
    """``74s``, ``12m 03s``, ``3h 20m``, ``2d 04h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600:02d}h"


def _hours(value: float) -> str:
    return f"{value:,.2f}"


def _fleet_lines(report: GoodputReport) -> None:
    """The report's two opening lines: the fleet's hours, and detection, repair and recertification."""
    fleet = report.fleet
    out = console()
    share = f" ({fleet.availability:.2%} in service)" if fleet.availability is not None else ""
    out.print(
        f"{fleet.nodes:,} nodes, {fleet.gpus:,} GPUs, {report.since} to {report.until} "
        f"({report.period_hours:,.1f} h): {fleet.gpu_hours:,.1f} GPU-hours, "
        f"{fleet.in_service_gpu_hours:,.2f} in service, {fleet.lost_gpu_hours:,.2f} lost{share}"
    )
    rate = f"{fleet.recertification_pass_rate:.0%}" if fleet.recertification_pass_rate is not None else "-"
    out.print(
        f"mean time to detect {_duration(fleet.mean_time_to_detect_s)} (faults: {fleet.detections}, "
        f"observed to quarantine); mean time to repair {_duration(fleet.mean_time_to_repair_s)} "
        f"(repairs: {fleet.repairs}, cordon to uncordon); recertification pass rate {rate} "
        f"({fleet.recertifications_passed} passed, {fleet.recertifications_failed} failed)"
    )


def _ranking_rows(report: GoodputReport, top: int) -> list[list[str]]:
    """The ``top`` nodes that lost the most GPU-hours: hours, time out of service, largest cause."""
    rows = []
    for n in [n for n in report.nodes if n.lost_gpu_hours > 0][:top]:
        largest = max(n.lost_by_cause.items(), key=lambda kv: (kv[1], kv[0]))[0] if n.lost_by_cause else "-"
        time_out = _duration((report.period_hours - n.hours["in-service"]) * 3600)
        rows.append([n.node, str(n.gpus), n.state, _hours(n.lost_gpu_hours), time_out, largest])
    return rows


_REMEDIATION_COLUMNS = [
    "node",
    "attempt",
    "fault",
    "observed",
    "quarantined",
    "back",
    "detect",
    "repair",
    "recert",
    "outcome",
]


def _report_table(report: GoodputReport, top: int) -> None:
    fleet = report.fleet
    _fleet_lines(report)
    print_table(
        "time by state",
        ["state", "node-hours", "GPU-hours", "nodes now"],
        [
            [
                s,
                _hours(fleet.hours_by_state[s]),
                _hours(fleet.gpu_hours_by_state[s]),
                str(fleet.nodes_by_state[s]),
            ]
            for s in STATES
        ],
    )
    lost = fleet.lost_gpu_hours
    print_table(
        "GPU-hours lost by cause",
        ["cause", "GPU-hours", "share"],
        [[c, _hours(v), f"{v / lost:.1%}" if lost else "-"] for c, v in fleet.lost_by_cause.items()],
    )
    print_table(
        f"nodes ranked by GPU-hours lost (top {top})",
        ["node", "GPUs", "state now", "GPU-hours lost", "time out", "largest cause"],
        _ranking_rows(report, top),
    )
    print_table(
        "remediations started in the period",
        _REMEDIATION_COLUMNS,
        [
            [
                r.node,
                str(r.attempt),
                r.cause + (f" (XID {r.xid})" if r.xid else ""),
                r.observed_at or "-",
                r.quarantined_at,
                r.returned_at or "-",
                _duration(r.detect_s),
                _duration(r.repair_s),
                r.recertification or "-",
                r.outcome,
            ]
            for r in report.remediations
        ],
    )


def _period(since: str, until: str | None) -> tuple[dt.datetime, dt.datetime]:
    """The report's period from ``--since`` and ``--until`` (default: now)."""

    end = dt.datetime.now(dt.UTC).replace(microsecond=0)
    if until is not None:
        try:
            end = changes.parse_time(until.strip())
        except ValueError:
            raise InputError(f"--until {until!r}: expected an RFC 3339 time (2025-06-01T00:00:00Z)") from None
        if end.tzinfo is None:
            raise InputError(f"--until {until!r}: an RFC 3339 time needs its offset (Z for UTC)")
        if end <= EARLIEST:
            raise InputError(f"--until {until!r}: not after {changes.format_time(EARLIEST)}")
    return parse_since(since, end), end


def _finite(value: float, option: str, low: float, high: float, *, open_low: bool = False) -> float:
    """``value`` when finite and within bounds, else an input error naming the option."""

    below = value <= low if open_low else value < low
    if not math.isfinite(value) or below or value > high:
        bound = f"more than {low:g}" if open_low else f"at least {low:g}"
        raise InputError(f"{option} {value:g}: must be a number {bound} and at most {high:g}")
    return value


def report_cmd(
    ctx: typer.Context,
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster spec (default $DSX_CLUSTER, kube)."),
    since: str = typer.Option(
        "7d",
        "--since",
        help="Start of the period: a duration back from --until (90m, 36h, 7d, 2w) or RFC 3339.",
    ),
    until: str | None = typer.Option(None, "--until", help="End of the period, RFC 3339 (default: now)."),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="Also draw a PNG: node states over the period and the GPU-hours lost by cause.",
    ),
    metrics: Path | None = typer.Option(
        None, "--metrics", help="Also write the Prometheus metrics (text exposition format) to this file."
    ),
    top: int = typer.Option(10, "--top", min=1, help="Nodes shown in the table's ranking."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """What the fleet lost over a period, read from what remediation and certification wrote: per
    node and for the fleet, GPU-hours in service and out of it by cause (fault class or XID bucket,
    waiting for repair, waiting for recertification, certification failure, slow node found by
    bisection), mean time to detect (fault observed to quarantine) and to repair (cordon to
    uncordon), the recertification pass rate, and the nodes ranked by GPU-hours lost. Every second
    of every node is counted in one state. Subcommand simulate: what each policy would win."""
    if ctx.invoked_subcommand is not None:
        return

    if plot is not None and plot.suffix.lower() != ".png":
        raise InputError(f"--plot {plot}: the plot is a PNG; name the file .png")
    check_out_file(plot, "--plot")
    check_out_file(metrics, "--metrics")
    start, end = _period(since, until)
    result = report(connect(cluster), start, end)
    for warning in result.warnings:
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    if plot is not None:
        from steps.sentinel.goodput.plot import plot_report

        plot_report(result, plot)
    if metrics is not None:
        write_text(metrics, exposition(result))
    emit(result, output, lambda r: _report_table(r, top))


CHECKPOINT_SAVE_OPTION = typer.Option(
    None,
    "--checkpoint-save-seconds",
    help="How long a checkpoint's save stops the job (default: the table's).",
)
SPARES_OPTION = typer.Option(
    0,
    "--spares",
    min=0,
    max=_MAX_NODES,
    help="Nodes the job leaves idle to replace nodes out for repair.",
)
REPLICA_NODES_OPTION = typer.Option(
    None,
    "--replica-nodes",
    min=1,
    max=_MAX_NODES,
    help="Nodes of one data-parallel replica of the job (default: the table's).",
)
BEST_SPARES_OPTION = typer.Option(
    True,
    "--best-spares/--no-best-spares",
    help="Also find each policy's best spare count (1, 2, 4... replicas, to a quarter of the fleet).",
)
SWEEP_OPTION = typer.Option(
    False,
    "--sweep-checkpoint",
    help="Goodput at checkpoint intervals from a quarter to four times Young and Daly's sqrt(2 S M) "
    "instead of the table (needs a save that costs).",
)


def _check_times(
    days: float,
    checkpoint_minutes: float | None,
    restart_minutes: float | None,
    checkpoint_save_seconds: float | None,
    *,
    sweep: bool,
) -> None:
    """Refuse a period or a job time out of range (or one the sweep chooses), naming the option.

    Raises:
        InputError: one is.
    """
    _finite(days, "--days", 0.0, _MAX_DAYS, open_low=True)
    if checkpoint_minutes is not None:
        _finite(checkpoint_minutes, "--checkpoint-minutes", MIN_CHECKPOINT_MINUTES, 10_080)
    if restart_minutes is not None:
        _finite(restart_minutes, "--restart-minutes", 0.0, 10_080)
    if checkpoint_save_seconds is not None:
        _finite(checkpoint_save_seconds, "--checkpoint-save-seconds", 0.0, 86_400)
    if sweep and checkpoint_minutes is not None:
        raise InputError(
            "dsx goodput simulate: --sweep-checkpoint chooses the intervals; drop --checkpoint-minutes"
        )


def _check_size(
    table: FaultRates,
    nodes: int,
    gpus_per_node: int,
    days: float,
    seeds: int,
    replica: int,
    *,
    sweep: bool,
    best_spares: bool,
) -> None:
    """Refuse a simulation that would draw more than :data:`_MAX_FAULTS` faults in all, naming its size.

    Raises:
        InputError: it would.
    """
    runs = seeds * 4 * (len(sweep_intervals(1.0)) if sweep else 1)
    if best_spares and not sweep:
        runs *= 1 + len(spare_candidates(nodes, replica))
    faults = sum(expected_faults(table, nodes, gpus_per_node, days).values()) * runs
    if faults > _MAX_FAULTS:
        raise InputError(
            f"dsx goodput simulate: {nodes:,} nodes x {gpus_per_node} GPUs over {days:g} days and "
            f"{seeds} seed(s){' at each interval of the sweep' if sweep else ''} is about {faults:,.0f} "
            f"simulated faults, over the limit of "
            f"{_MAX_FAULTS:,}: give fewer seeds, nodes or days"
            + ("" if sweep or not best_spares else " (or --no-best-spares)")
        )


def simulate_cmd(
    nodes: int = typer.Option(2048, "--nodes", min=1, max=_MAX_NODES, help="Nodes in the fleet."),
    gpus_per_node: int = typer.Option(
        8, "--gpus-per-node", min=1, max=_MAX_GPUS_PER_NODE, help="GPUs per node."
    ),
    days: float = typer.Option(54.0, "--days", help=f"The period, in days (up to {_MAX_DAYS})."),
    seed: int = typer.Option(0, "--seed", min=0, help="The first seed."),
    seeds: int = typer.Option(
        5, "--seeds", min=1, max=_MAX_SEEDS, help="Seeds to average over (seed, seed+1, ...)."
    ),
    rates: Path | None = typer.Option(
        None, "--rates", help="A FaultRates file (default: the shipped table, from the Llama 3 405B run)."
    ),
    checkpoint_minutes: float | None = typer.Option(
        None, "--checkpoint-minutes", help="The job's checkpoint interval (default: the table's)."
    ),
    restart_minutes: float | None = typer.Option(
        None, "--restart-minutes", help="What a restart of the job costs (default: the table's)."
    ),
    checkpoint_save_seconds: float | None = CHECKPOINT_SAVE_OPTION,
    spares: int = SPARES_OPTION,
    replica_nodes: int | None = REPLICA_NODES_OPTION,
    without_slow: bool = typer.Option(
        False, "--without-slow", help="Leave out the table's slow classes (an assumption of the table's own)."
    ),
    rigid: bool = typer.Option(
        False, "--rigid", help="The job waits whole while any replica lacks nodes (default: the table's)."
    ),
    best_spares: bool = BEST_SPARES_OPTION,
    sweep: bool = SWEEP_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Simulate one synchronous training job across the fleet over the period, with faults drawn
    from the rate table, under each policy: none (a fault is found when the job fails), taint (the
    agent taints the node; repair by hand), remediate (agent and automated repair), full
    (remediation, recertification and periodic certification with bisection, which finds silent
    slow nodes). Prints goodput, effective training time, interruptions, restarts and GPU-hours lost
    by cause per policy, and each policy's best spare count. The defaults are the published run: 2,048
    nodes x 8 GPUs over 54 days.
    With --sweep-checkpoint, each policy's goodput against the checkpoint interval instead."""

    _check_times(days, checkpoint_minutes, restart_minutes, checkpoint_save_seconds, sweep=sweep)
    table = load_rates(rates)
    if rigid:
        table = table.model_copy(update={"job": table.job.model_copy(update={"elastic": False})})
    if without_slow:
        table = table.model_copy(update={"classes": [c for c in table.classes if not c.slow]})
    replica = table.job.replica_nodes if replica_nodes is None else replica_nodes
    if (nodes - spares) // replica < 1:
        raise InputError(
            f"dsx goodput simulate: --nodes {nodes} less --spares {spares} hold no replica of {replica} "
            f"nodes: give more nodes, fewer spares or --replica-nodes"
        )
    _check_size(table, nodes, gpus_per_node, days, seeds, replica, sweep=sweep, best_spares=best_spares)
    common: dict[str, Any] = {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "days": days,
        "seed": seed,
        "seeds": seeds,
        "restart_minutes": restart_minutes,
        "checkpoint_save_seconds": checkpoint_save_seconds,
        "spares": spares,
        "replica_nodes": replica,
        "label": (str(rates) if rates is not None else f"{table.name} (shipped)")
        + (", without its slow classes" if without_slow else ""),
    }
    if sweep:
        emit(sweep_checkpoint(table, **common), output, _sweep_table)
        return
    candidates = spare_candidates(nodes, replica) if best_spares else []
    report = simulate(table, checkpoint_minutes=checkpoint_minutes, spare_counts=candidates, **common)
    emit(report, output, _table)


def register(app: typer.Typer) -> None:
    """Add the ``goodput`` command group: the report is the group's own command, ``simulate`` its
    subcommand."""
    group = typer.Typer(
        name="goodput",
        help="Goodput: what a fleet lost to faults (from the ledger), and what each policy wins back.",
        invoke_without_command=True,
    )
    group.callback()(report_cmd)
    group.command("simulate")(simulate_cmd)
    app.add_typer(group, name="goodput")

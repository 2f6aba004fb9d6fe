"""``dsx bisect``: find the nodes that make a group of nodes fail or slow down together."""

from __future__ import annotations

import enum
from pathlib import Path

import typer

from steps.cluster import connect
from steps.cluster.fabric import fabric_model
from steps.cluster.port import ClusterPort
from steps.cluster.vocabulary import LABEL_RACK
from steps.errors import InputError
from steps.outputs import output_dir
from steps.readiness.bisect import BisectResult, GroupTest, bisect
from steps.readiness.bisect.probes import fabric_test, local_test
from steps.readiness.thresholds import Thresholds
from workflows.cli.output import OUTPUT_OPTION, OutputFormat, console, emit, print_table

__all__ = ["Measure", "StrategyChoice", "register"]

_LOCAL_MAX_NODES = 16
_TABLE_RUNS = 30


class StrategyChoice(enum.StrEnum):
    """``--strategy`` (:data:`steps.readiness.bisect.STRATEGIES`; a test keeps them equal)."""

    auto = "auto"
    halving = "halving"
    pairs = "pairs"


class Measure(enum.StrEnum):
    """How each group test is measured."""

    model = "model"
    local = "local"


def _table(result: BisectResult) -> None:
    out = console()
    if result.healthy:
        verdict = "healthy"
    elif result.suspects:
        verdict = f"{len(result.suspects)} suspect(s)"
    else:
        verdict = "not healthy"
    out.print(
        f"{result.nodes} nodes, strategy {result.strategy} ({result.chosen}): {verdict}; "
        f"{result.tests} tests in {result.rounds} rounds, {result.wall_clock_s:.0f} s, "
        f"{result.node_seconds:.0f} node-seconds"
    )
    out.print(
        f"screening: {result.screening} passes of the nodes left in service ({result.screening_needed} "
        f"needed): would have caught a fault failing {result.caught:.0%} of tests or more; probability a "
        f"fault is left {result.fault_left:.4f} (alpha {result.alpha})"
    )
    if result.suspects:
        print_table(
            "suspects",
            ["node", "fault", "probability", "confirmed with"],
            [
                [s.node, _fault_words(s.fault), f"{s.probability:.4f}", s.confirmed_with or "-"]
                for s in result.suspects
            ],
        )
    if result.unresolved:
        print_table(
            "unresolved",
            ["node", "probability", "tests still needed"],
            [[u.node, f"{u.probability:.4f}", u.tests_needed] for u in result.unresolved[:_TABLE_RUNS]],
        )
    for leaf in result.leaves:
        doubt = f", {len(leaf.unresolved)} unresolved" if leaf.unresolved else ""
        out.print(
            f"leaf {leaf.leaf}: {len(leaf.accused)} of its {leaf.nodes} nodes accused{doubt}: suspect its "
            "switch before the nodes"
        )
    shown = [r for r in result.runs if r.outcome != "pass"][:_TABLE_RUNS]
    if not shown:
        return
    print_table(
        "failing tests",
        ["round", "kind", "nodes", "outcome", "busbw GB/s", "threshold"],
        [
            [r.round, r.kind, _members(r.members), r.outcome, _figure(r.figure), _figure(r.threshold)]
            for r in shown
        ],
    )


def _fault_words(fault: str) -> str:
    return "slow relative to its peers" if fault == "slow-relative" else fault


def _members(members: list[str]) -> str:
    return ", ".join(members) if len(members) <= 4 else f"{members[0]}..{members[-1]} ({len(members)})"


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _group_test(
    port: ClusterPort,
    cluster: str,
    nodes: list[str],
    measure: Measure,
    seed: int | None,
    out_dir: Path | None,
) -> tuple[GroupTest, float]:
    """The group test for ``nodes`` and the noise it measures with.

    Raises:
        InputError: the cluster has no fabric model, is too large for local ranks, or a seed is given
            for them.
    """

    model = fabric_model(port, nodes)
    if model is None:
        raise InputError(
            f"dsx bisect: cluster {cluster!r} has no fabric model; bisection runs on simulated fleets "
            "(sim:... or state:...) for now"
        )
    if seed is not None:
        model = type(model)(model.reports, model.settings.model_copy(update={"seed": seed}))
    if measure is Measure.local:
        if seed is not None:
            raise InputError(
                "dsx bisect: --seed seeds the modelled tests; --measure local measures real ranks, "
                "which no seed repeats"
            )
        if len(nodes) > _LOCAL_MAX_NODES:
            raise InputError(
                f"dsx bisect --measure local: {len(nodes)} nodes is more than {_LOCAL_MAX_NODES} local "
                "ranks can play; use --nodes to select fewer, or --measure model"
            )

        # dsx's default thresholds, as the workflow's steps judge a dsx-bisect of its own
        noise = Thresholds().nccl.noise_band
        return local_test(port, output_dir(str(out_dir) if out_dir else None)), noise
    return fabric_test(model), model.settings.noise


def register(app: typer.Typer) -> None:
    """Add the ``bisect`` command."""

    @app.command("bisect")
    def bisect_cmd(
        cluster: str = typer.Option(..., "--cluster", help="The fleet: sim:... or state:PATH."),
        selector: str | None = typer.Option(
            None, "--nodes", "-l", help="The group: nodes matching this label selector (default: every node)."
        ),
        strategy: StrategyChoice = typer.Option(
            StrategyChoice.auto, "--strategy", help="How to narrow down."
        ),
        seed: int | None = typer.Option(
            None, "--seed", help="Seed of the modelled tests (default: the spec's)."
        ),
        measure: Measure = typer.Option(
            Measure.model,
            "--measure",
            help=f"model: the fleet's fabric model; local: real gloo ranks (up to {_LOCAL_MAX_NODES} nodes).",
        ),
        free: int | None = typer.Option(
            None, "--free", min=2, help="Nodes that may be under test at once (default: the whole group)."
        ),
        alpha: float = typer.Option(
            0.01, "--alpha", help="Accuse a node at probability 1-ALPHA, clear it under ALPHA."
        ),
        p_min: float = typer.Option(
            0.2, "--p-min", help="The least share of tests a faulty node fails (its intermittence)."
        ),
        spurious: float = typer.Option(
            0.005, "--spurious", help="The rate at which a healthy test fails anyway."
        ),
        budget: int = typer.Option(600, "--budget", min=1, help="The most tests to run."),
        out_dir: Path | None = typer.Option(None, "--out", help="Where local tests keep their evidence."),
        output: OutputFormat = OUTPUT_OPTION,
    ) -> None:
        """Screen the group, and if it fails, find the nodes at fault; exit 1 when it is not healthy.

        Every result is evidence: a node is accused at probability 1-ALPHA, and the group is called
        healthy only once a fault failing P-MIN of its tests would have shown with 99%.
        """

        port = connect(cluster)  # once: a simulated fleet of thousands of nodes takes seconds to build
        listed = port.list_nodes(selector)
        nodes = [n.name for n in listed]
        if len(nodes) < 2:
            where = f"--nodes {selector!r}" if selector else f"cluster {cluster!r}"
            raise InputError(
                f"dsx bisect: {where} selects {len(nodes)} node(s); a group test needs two or more"
            )
        test, noise = _group_test(port, cluster, nodes, measure, seed, out_dir)
        result = bisect(
            nodes,
            test,
            strategy.value,
            noise=noise,
            free=free,
            alpha=alpha,
            p_min=p_min,
            spurious=spurious,
            budget=budget,
        )
        racks = {n.name: n.labels[LABEL_RACK] for n in listed if LABEL_RACK in n.labels}
        emit(result.with_leaves(racks), output, _table)
        if not result.healthy:
            raise typer.Exit(1)

"""Each check's section of the certification report, in Markdown: the sweeps' tables, the smoke runs'
figures, DCGM's findings. A check without a section of its own gets a table of its subjects
(:class:`~steps.readiness.check.CheckKind`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from steps.readiness.check import CheckOutcome
from steps.readiness.models import CollectiveRun
from steps.readiness.ranks.diag import DiagResult
from steps.readiness.ranks.smoke import SmokeResult
from steps.readiness.sizes import format_size

__all__ = ["cell", "diag_section", "plain_section", "smoke_section", "sweep_section"]


def cell(value: Any) -> str:
    """``value`` as a Markdown table cell: empty for ``None``, pipes escaped, one line."""
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def plain_section(outcomes: Sequence[CheckOutcome[Any]]) -> list[str]:
    """A test's section when it has none of its own: each subject, its status, time and first finding
    (the first verdict that did not pass)."""
    out = ["| subject | status | seconds | first finding |", "|---|---|---:|---|"]
    for outcome in outcomes:
        found = next((v.message for v in outcome.verdicts if v.status != "pass"), "")
        subject = f"{outcome.subject.kind} {outcome.subject.name}"
        out.append(f"| {cell(subject)} | {outcome.status} | {outcome.elapsed_s:.1f} | {cell(found)} |")
    return [*out, ""]


def diag_section(outcomes: Sequence[CheckOutcome[DiagResult]]) -> list[str]:
    """Each node's run and what DCGM said of each test, or why none ran."""
    out = ["| node | run | status | DCGM | tests |", "|---|---|---|---|---|"]
    for diag in outcomes:
        result = diag.result
        if result is None:
            out.append(f"| {cell(diag.subject.name)} | | {diag.status} | | no result: see the verdicts |")
            continue
        if not result.present:
            tests = f"none ran: DCGM absent ({result.reason})"
        elif result.error is not None:
            tests = f"could not run: {result.error}"
        else:
            tests = ", ".join(f"{t.name} {t.status}" for t in result.tests)
        out.append(
            f"| {cell(diag.subject.name)} | {cell(result.run)} | {diag.status} "
            f"| {cell(result.version)} | {cell(tests)} |"
        )
    return [*out, ""]


def sweep_section(outcomes: Sequence[CheckOutcome[CollectiveRun]]) -> list[str]:
    """Each sweep's ranks and rows, in the nccl-tests layout's columns."""
    out: list[str] = []
    for sweep in outcomes:
        out += [f"### {sweep.subject.kind} {sweep.subject.name}: {sweep.status}", ""]
        if sweep.result is None:
            out += ["No result: see the verdicts and the ranks' stderr.", ""]
            continue
        run = sweep.result
        out += [
            f"{len(run.ranks)} ranks on {', '.join(run.hosts)}, backend {run.backend}"
            + (f"; injected: {', '.join(run.injected)}" if run.injected else ""),
            "",
            "| size | time (us) | algbw (GB/s) | busbw (GB/s) | #wrong |",
            "|---:|---:|---:|---:|---:|",
        ]
        for row in run.rows:
            half = row.in_place or row.out_of_place
            if half is None:
                continue
            out.append(
                f"| {format_size(row.size)} | {cell(half.time_us)} | {cell(half.algbw_gbps)} "
                f"| {cell(half.busbw_gbps)} | {cell(row.wrong())} |"
            )
        out.append("")
    return out


def smoke_section(outcomes: Sequence[CheckOutcome[SmokeResult]]) -> list[str]:
    """Each smoke run's loss, step time, throughput and MFU."""
    out = [
        "| subject | status | ranks | loss first -> last | median step (ms) | tokens/s "
        "| TFLOP/s per GPU | MFU |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for smoke in outcomes:
        result = smoke.result
        if result is None:
            out.append(f"| {cell(smoke.subject.name)} | {smoke.status} | | | | | | |")
            continue
        out.append(
            f"| {cell(smoke.subject.name)} | {smoke.status} | {result.world_size} "
            f"| {cell(result.initial_loss)} -> {cell(result.final_loss)} "
            f"| {result.median_step_s * 1000:.1f} | {result.throughput_tokens_s:g} "
            f"| {cell(result.tflops_per_gpu)} | {cell(result.mfu)} |"
        )
    return [*out, ""]

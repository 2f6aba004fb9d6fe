"""The certification report: JSON for machines, Markdown for the Argo UI, PNG plots beside them.

:func:`build_report` is the workflow's last step: given the outcomes of its checks, whatever their
tests (and any other verdicts, such as relative mode or parsed nccl-tests logs), it derives each node's
status, and writes ``report.json``, ``report.md`` and each registered test's plot (``busbw.png``,
``step-time.png``). Each test's section and plot come from its registration
(:data:`steps.readiness.checks.KINDS`); a test the registry does not know gets a table of its subjects.

A node fails when a verdict that is not a pass names it (the straggler's node, the rank that died) or
when it is the subject of such a verdict. A node that only belongs to a group that failed together, with
no verdict narrowing the fault down to a member, is ``pending``, not failed: the group failed, but which
members are at fault is not known (bisection narrows it). So is a node whose test could not be scheduled
(``unschedulable``: nothing was measured). A pending node is not certified; the report fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from steps.cluster import vocabulary as vocab
from steps.files import write_text
from steps.models import validate
from steps.outputs import output_dir
from steps.readiness.check import CheckKind, CheckOutcome
from steps.readiness.checks import KINDS
from steps.readiness.models import Model, Subject, Verdict, dump_json
from steps.readiness.sections import cell, plain_section
from steps.readiness.thresholds import Thresholds, load_thresholds

__all__ = [
    "INCOMPLETE_TEST",
    "CertificationReport",
    "NodeResult",
    "ReportRequest",
    "build_report",
    "load_report",
    "node_results",
    "recheck_report",
    "render_markdown",
]


INCOMPLETE_TEST = "check-incomplete"
"""The test of a verdict saying a planned check never stored its outcome (its step crashed or was stopped):
nothing was measured, so its nodes are ``pending``, not failed."""


class NodeResult(Model):
    """One node's certification status and the reasons for it."""

    name: str
    status: Literal["passed", "failed", "pending"]
    reasons: list[str] = Field(default_factory=list)


class Screening(Model):
    """How long a group was screened: a group is called healthy only after enough passes to have seen an
    intermittent fault of the least intermittence reckoned with (``ceil(ln delta / ln(1 - P_min))``).

    Attributes:
        group: the group.
        passes: passing tests of its members left in service (the fewest any of them took part in).
        needed: the passes that would see a fault failing ``P_min`` of tests with 99%.
        caught: the least intermittence (share of tests a faulty node fails) these passes would have
            caught with 99%.
        bisected: whether its failure was bisected (the passes are then the search's screening).
    """

    group: str
    passes: int
    needed: int
    caught: float
    bisected: bool = False


class CertificationReport(Model):
    """Everything a certification run found, with its evidence."""

    api_version: vocab.ApiVersion = vocab.API_VERSION
    kind: Literal["CertificationReport"] = "CertificationReport"
    status: Literal["passed", "failed"]
    summary: str
    recipe_digest: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    groups: list[Subject] = Field(default_factory=list)
    nodes: list[NodeResult] = Field(default_factory=list)
    verdicts: list[Verdict] = Field(default_factory=list)
    outcomes: list[CheckOutcome[Any]] = Field(
        default_factory=list, description="every check's outcome, each naming its test"
    )
    thresholds: dict[str, Any] | None = None
    screening: list[Screening] = Field(default_factory=list, description="how long each group was screened")
    injected: list[str] = Field(default_factory=list, description="faults injected on purpose")
    files: list[str] = Field(default_factory=list, description="report files, relative to the report folder")


class ReportRequest(Model):
    """What the certification workflow gathered, to be reported."""

    nodes: list[str] = Field(default_factory=list)
    groups: list[Subject] = Field(default_factory=list)
    outcomes: list[CheckOutcome[Any]] = Field(default_factory=list, description="the checks' outcomes")
    verdicts: list[Verdict] = Field(default_factory=list, description="further verdicts (relative mode...)")
    screening: list[Screening] = Field(default_factory=list, description="how long each group was screened")
    recipe_digest: str | None = None
    started_at: str | None = None
    finished_at: str | None = Field(default=None, description="default: now")
    thresholds: dict[str, Any] | None = None
    out_dir: str | None = None


def node_results(nodes: list[str], verdicts: list[Verdict]) -> list[NodeResult]:
    """Each node's status from the verdicts (see the module text for the rule), sorted by name."""
    failing: dict[str, list[str]] = {name: [] for name in nodes}
    unsure: dict[str, list[str]] = {}
    for verdict in verdicts:
        if verdict.status == "pass":
            continue
        what = f"{verdict.test} {verdict.status}: {verdict.message}"
        named = verdict.node or (verdict.subject.name if verdict.subject.kind == "node" else None)
        if named is not None and verdict.status != "unschedulable" and verdict.test != INCOMPLETE_TEST:
            failing.setdefault(named, []).append(what)
        elif named is not None:
            unsure.setdefault(named, []).append(what)
        else:
            for member in verdict.subject.members:
                unsure.setdefault(member, []).append(f"member of group {verdict.subject.name}: {what}")
    results = []
    for name in sorted(set(failing) | set(unsure)):
        if failing.get(name):
            results.append(NodeResult(name=name, status="failed", reasons=failing[name]))
        elif unsure.get(name):
            results.append(NodeResult(name=name, status="pending", reasons=unsure[name]))
        else:
            results.append(NodeResult(name=name, status="passed"))
    return results


def render_markdown(report: CertificationReport) -> str:
    """The report as Markdown, with the plots linked by their file names."""
    out: list[str] = [f"# dsx certification: {report.status.upper()}", "", report.summary, ""]
    facts = [
        ("recipe digest", report.recipe_digest),
        ("started", report.started_at),
        ("finished", report.finished_at),
    ]
    out += [f"- {name}: `{value}`" for name, value in facts if value]
    if report.injected:
        out += ["", "> **Faults were injected on purpose** (this run plays faulty nodes):"]
        out += [f"> - {label}" for label in report.injected]
    out += ["", "## Nodes", "", "| node | status | reasons |", "|---|---|---|"]
    for node in report.nodes:
        out.append(f"| {cell(node.name)} | {node.status} | {cell('; '.join(node.reasons))} |")
    out += [
        "",
        "## Verdicts",
        "",
        "| status | subject | test | measured | threshold | message |",
        "|---|---|---|---|---|---|",
    ]
    for verdict in report.verdicts:
        measured = "" if verdict.measured is None else f"{verdict.measured:g} {verdict.unit or ''}".strip()
        if verdict.probability is not None:
            measured = f"{measured} (probability {verdict.probability:.4f})".strip()
        threshold = "" if verdict.threshold is None else f"{verdict.threshold:g} {verdict.unit or ''}".strip()
        out.append(
            f"| {verdict.status} | {cell(verdict.subject.kind + ' ' + verdict.subject.name)} "
            f"| {verdict.test} "
            f"| {cell(measured)} | {cell(threshold)} | {cell(verdict.message)} |"
        )
    if report.screening:
        out += _screening_markdown(report)
    for test, outcomes in _by_test(report.outcomes):
        out += _section(test, outcomes, report.files)
    return "\n".join(out).rstrip() + "\n"


def _by_test(outcomes: Sequence[CheckOutcome[Any]]) -> list[tuple[str, list[CheckOutcome[Any]]]]:
    """The outcomes grouped by test: the registered tests in the registry's order, then any other."""
    tests = list(KINDS) + sorted({o.test for o in outcomes} - set(KINDS))
    grouped = [(test, [o for o in outcomes if o.test == test]) for test in tests]
    return [(test, found) for test, found in grouped if found]


def _section(test: str, outcomes: list[CheckOutcome[Any]], files: Sequence[str]) -> list[str]:
    """One test's section: its heading, its plot when drawn, its own Markdown (a table of subjects for a
    test without one, or one this dsx does not know)."""
    kind = KINDS.get(test)
    out = ["", f"## {kind.title if kind is not None else test}", ""]
    if kind is not None and kind.plot is not None and kind.plot.file in files:
        out += [f"![{kind.plot.caption}]({kind.plot.file})", ""]
    if kind is None or kind.section is None:
        return out + plain_section(outcomes)
    return out + kind.section([kind.typed(o) for o in outcomes])


def _screening_markdown(report: CertificationReport) -> list[str]:
    out = [
        "",
        "## Screening",
        "",
        "| group | passes | needed | would have caught, with 99% | bisected |",
        "|---|---|---|---|---|",
    ]
    for screen in report.screening:
        bisected = "yes" if screen.bisected else "no"
        out.append(
            f"| {cell(screen.group)} | {screen.passes} | {screen.needed} "
            f"| a fault failing {screen.caught:.0%} of tests or more | {bisected} |"
        )
    return out


def build_report(request: ReportRequest) -> CertificationReport:
    """Assemble, write and return the certification report.

    Files (in ``$DSX_OUTPUT_DIR`` or ``request.out_dir``): ``report.json``, ``report.md``, and where
    there is data, ``busbw.png`` and ``step-time.png``.

    Raises:
        InputError: the thresholds are malformed (nothing is written).
    """
    thresholds = load_thresholds(request.thresholds)
    verdicts = [v for o in request.outcomes for v in o.verdicts] + list(request.verdicts)
    nodes = node_results(request.nodes, verdicts)
    by_test = [(KINDS.get(test), outcomes) for test, outcomes in _by_test(request.outcomes)]
    known = [(kind, [kind.typed(o) for o in outcomes]) for kind, outcomes in by_test if kind is not None]
    injected = sorted(
        {label for kind, outcomes in known for o in outcomes if o.result for label in kind.injected(o.result)}
    )
    bad = [v for v in verdicts if v.status != "pass"]
    status: Literal["passed", "failed"] = "passed" if verdicts and not bad else "failed"
    summary = summarise(verdicts, nodes)
    folder = output_dir(request.out_dir)
    files = [drawn for kind, outcomes in known if (drawn := _plot(kind, outcomes, thresholds, folder))]
    files += ["report.json", "report.md"]
    report = CertificationReport(
        status=status,
        summary=summary,
        recipe_digest=request.recipe_digest,
        started_at=request.started_at,
        finished_at=request.finished_at or datetime.now(UTC).isoformat(timespec="seconds"),
        groups=request.groups,
        nodes=nodes,
        verdicts=verdicts,
        outcomes=request.outcomes,
        screening=request.screening,
        thresholds=request.thresholds,
        injected=injected,
        files=sorted(files),
    )
    write_text(folder / "report.md", render_markdown(report))
    write_text(folder / "report.json", dump_json(report))
    return report


def _plot(kind: CheckKind[Any], outcomes: list[CheckOutcome[Any]], limits: Thresholds, folder: Path) -> str:
    """Draw ``kind``'s plot of the outcomes that have a result; its file name, or empty when none has."""
    results = [(o.subject, o.result) for o in outcomes if o.result is not None]
    if kind.plot is None or not results:
        return ""
    kind.plot.draw(results, limits, folder / kind.plot.file)
    return kind.plot.file


def summarise(verdicts: Sequence[Verdict], nodes: Sequence[NodeResult]) -> str:
    """The report's headline, from its verdicts and node results."""
    failed_nodes = [n.name for n in nodes if n.status == "failed"]
    pending_nodes = [n.name for n in nodes if n.status == "pending"]
    bad = [v for v in verdicts if v.status != "pass"]
    if not verdicts:
        return "Nothing was checked: no verdicts."
    if not bad:
        return f"All {len(verdicts)} checks passed on {len(nodes)} nodes."
    return (
        f"{len(bad)} of {len(verdicts)} checks did not pass; failed nodes: "
        f"{', '.join(failed_nodes) or 'none named'}"
        + (f"; not certified (pending): {', '.join(pending_nodes)}" if pending_nodes else "")
        + f". First: {bad[0].message}"
    )


def load_report(path: str | Path) -> CertificationReport:
    """Read a ``report.json``.

    Raises:
        InputError: the file is missing, not UTF-8, not strict JSON (``NaN`` and ``Infinity`` are not
            numbers in JSON), or not a certification report (naming the field; a check's result is
            checked against its test's model where the test is registered).
    """
    from steps.yamlio import parse_json, read_text

    file = Path(path)
    data = parse_json(read_text(file, str(file), "a report file"), str(file))
    report = validate(CertificationReport, data, str(file), what="certification report")
    for index, outcome in enumerate(report.outcomes):
        kind = KINDS.get(outcome.test)
        if kind is not None:
            where = f"{file}: outcomes[{index}]"
            validate(
                kind.outcome, outcome.model_dump(mode="json"), where, what=f"valid {outcome.test} outcome"
            )
    return report


def recheck_report(report: CertificationReport) -> tuple[CertificationReport, list[str]]:
    """The report with its status and node results derived again from its verdicts, and every place
    where the report's own words disagree with them.

    A report file is evidence a person or a later step may have edited, or a bug may have written
    wrongly; its ``status`` field is what a gate would trust. The status shown is ``passed`` only when
    there are verdicts, every one passed, no node failed, and the report itself says ``passed``: a report
    that disagrees with its own verdicts is never taken as a pass.

    Returns:
        The report with the derived status and nodes (a node failed by either its recorded result or
        the verdicts), and one line per disagreement (empty when the report is consistent).
    """
    derived = {node.name: node for node in node_results([n.name for n in report.nodes], report.verdicts)}
    recorded = {node.name: node for node in report.nodes}
    nodes: list[NodeResult] = []
    problems: list[str] = []
    for name in sorted(derived):
        mine, theirs = derived[name], recorded.get(name)
        failed = mine.status == "failed" or (theirs is not None and theirs.status == "failed")
        reasons = list(dict.fromkeys([*(theirs.reasons if theirs else []), *mine.reasons]))
        nodes.append(NodeResult(name=name, status="failed" if failed else "passed", reasons=reasons))
        if theirs is not None and theirs.status != mine.status:
            problems.append(f"node {name}: the report says {theirs.status}, its verdicts say {mine.status}")
    bad = [v for v in report.verdicts if v.status != "pass"]
    failed_nodes = [n.name for n in nodes if n.status == "failed"]
    derived_status = "passed" if report.verdicts and not bad and not failed_nodes else "failed"
    if derived_status != report.status:
        if not report.verdicts:
            why = "it holds no verdicts"
        elif bad:
            why = f"{len(bad)} of {len(report.verdicts)} verdicts did not pass"
        elif failed_nodes:
            why = f"nodes failed: {', '.join(failed_nodes)}"
        else:
            why = f"all {len(report.verdicts)} verdicts passed"
        problems.insert(0, f"the report says {report.status}, but {why}")
    status: Literal["passed", "failed"] = (
        "passed" if derived_status == "passed" and not problems else "failed"
    )
    summary = report.summary
    if problems:  # the headline the verdicts give, never the report's own words when they disagree
        summary = (
            f"The report disagrees with its verdicts ({problems[0]}). {summarise(report.verdicts, nodes)}"
        )
    return report.model_copy(update={"status": status, "nodes": nodes, "summary": summary}), problems

"""After ``check.run`` a check is generic: a test registered once is stored, summed up in one line,
reported and labelled as the sweep is, and a report too big for a ConfigMap drops results, not verdicts.

The new test here (an NVLink figure, played by the echo rank program) touches no module of dsx: it is a
rank program, a judge, and one entry in ``checks.KINDS``.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from steps.cluster import connect
from steps.cluster import vocabulary as vocab
from steps.readiness import check, checks
from steps.readiness.check import CheckKind, CheckOutcome
from steps.readiness.judge import verdict
from steps.readiness.launchers.base import RankProgram
from steps.readiness.launchers.local import LocalLauncher
from steps.readiness.models import Model, Subject, Verdict
from steps.readiness.outcomes import MAX_STORED_BYTES, OutcomeStore, RunRef, check_result, keep_report
from steps.readiness.report import ReportRequest, build_report, load_report

ECHO = "tests.steps.readiness.launchers.echo_rank"
TEST = "nvlink-bandwidth"


class Links(Model):
    """What the new test's rank 0 writes: the slowest NVLink's bandwidth, and faults played."""

    slowest_gbps: float
    injected: list[str] = Field(default_factory=list)


def _judge(subject: Subject) -> Callable[[Links, list[str]], list[Verdict]]:
    def judge(result: Links, evidence: list[str]) -> list[Verdict]:
        status = "pass" if result.slowest_gbps >= 300 else "fail"
        message = f"node {subject.name}: slowest NVLink {result.slowest_gbps:g} GB/s"
        node = subject.name
        return [
            verdict(
                subject, TEST, status, message, measured=result.slowest_gbps, node=node, evidence=evidence
            )
        ]

    return judge


NVLINK: CheckKind[Links] = CheckKind(TEST, Links, "NVLink bandwidth", injected=lambda r: r.injected)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(checks.KINDS, TEST, NVLINK)


def _nvlink(node: str, text: str, folder: Path) -> CheckOutcome[Links]:
    subject = Subject(kind="node", name=node, members=[node])
    program = RankProgram(module=ECHO, args=[text], outputs=[("--out", "links.json")])
    links = check.Check(TEST, subject, program, Links, _judge(subject), timeout_s=60)
    return check.run(links, LocalLauncher(folder, ranks=1, method="spawn"))


def test_a_registered_check_is_stored_summed_up_reported_and_labelled(
    registered: None, tmp_path: Path
) -> None:
    port = connect("sim:nodes=2,gpu=h100")
    store = OutcomeStore(port, RunRef.local(port.namespace))
    slow = _nvlink(
        "node-00", '{"slowest_gbps": 120, "injected": ["link 3: slow (injected)"]}', tmp_path / "a"
    )
    fine = _nvlink("node-01", '{"slowest_gbps": 450}', tmp_path / "b")
    store.put(slow)
    store.put(fine)

    assert [o.result for o in store.outcomes(NVLINK)] == [
        Links(slowest_gbps=120, injected=["link 3: slow (injected)"]),
        Links(slowest_gbps=450),
    ]
    assert [o.test for o in store.every_outcome()] == [TEST, TEST]
    assert store.every_outcome(but=TEST) == []
    line = check_result(slow)
    assert (line.test, line.subject, line.status) == (TEST, "node-00", "fail")
    assert line.message == "node node-00: slowest NVLink 120 GB/s"

    report = build_report(
        ReportRequest(nodes=["node-00", "node-01"], outcomes=store.every_outcome(), out_dir=str(tmp_path))
    )
    assert {n.name: n.status for n in report.nodes} == {"node-00": "failed", "node-01": "passed"}
    assert report.injected == ["link 3: slow (injected)"]
    markdown = (tmp_path / "report.md").read_text()
    section = markdown.split("## NVLink bandwidth\n", 1)[1]
    assert "| node node-00 | fail | " in section and "slowest NVLink 120 GB/s |" in section
    again = load_report(tmp_path / "report.json")
    assert [NVLINK.read(o) for o in again.outcomes] == [o.result for o in store.outcomes(NVLINK)]


def test_a_test_this_dsx_does_not_know_is_still_reported_by_its_verdicts(tmp_path: Path) -> None:
    """A report written by a later dsx with a check this one lacks: its verdicts still decide the nodes,
    and its section is a table of subjects headed by the test's name."""
    subject = Subject(kind="node", name="node-00", members=["node-00"])
    failed = verdict(subject, "pcie-replay", "fail", "node node-00: 40 PCIe replays", node="node-00")
    outcome = CheckOutcome[Any](
        test="pcie-replay",
        subject=subject,
        status="fail",
        verdicts=[failed],
        evidence=[],
        out_dir="",
        elapsed_s=2.0,
        result={"replays": 40},
    )
    report = build_report(ReportRequest(nodes=["node-00"], outcomes=[outcome], out_dir=str(tmp_path)))
    assert report.status == "failed" and report.nodes[0].status == "failed"
    assert (
        "## pcie-replay\n\n| subject | status | seconds | first finding |"
        in (tmp_path / "report.md").read_text()
    )
    assert load_report(tmp_path / "report.json").outcomes[0].result == {"replays": 40}


def _noisy(name: str, noise_bytes: int) -> CheckOutcome[Any]:
    subject = Subject(kind="node", name=name, members=[name])
    passed = verdict(subject, TEST, "pass", f"node {name}: fine", node=name)
    return CheckOutcome[Any](
        test=TEST,
        subject=subject,
        status="pass",
        verdicts=[passed],
        evidence=[],
        out_dir="",
        elapsed_s=1.0,
        result={"noise": base64.b64encode(os.urandom(noise_bytes)).decode()},  # does not compress much
    )


def test_a_report_too_big_to_keep_drops_the_biggest_results_no_more_than_needed() -> None:
    port = connect("sim:nodes=1,gpu=h100")
    run = RunRef(name="dsx-certify-big", uid="big", namespace=port.namespace)
    outcomes = [_noisy("node-00", 700_000), _noisy("node-01", 600_000), _noisy("node-02", 1_000)]
    text = json.dumps({"outcomes": [o.model_dump(mode="json") for o in outcomes], "verdicts": ["kept"]})
    assert len(gzip.compress(text.encode())) > MAX_STORED_BYTES
    name = keep_report(port, run, text, "# report")
    kept = port.get_object("v1", "ConfigMap", name, port.namespace)
    assert kept is not None
    contents = kept["metadata"]["annotations"][vocab.ANNOTATION_REPORT_CONTENTS]
    assert contents.startswith("results of 1 of 3 checks dropped")
    stored = json.loads(gzip.decompress(base64.b64decode(kept["binaryData"]["report.json.gz"])))
    assert [o["result"] is None for o in stored["outcomes"]] == [True, False, False]
    assert stored["verdicts"] == ["kept"] and [o["verdicts"] for o in stored["outcomes"]] == [
        o.model_dump(mode="json")["verdicts"] for o in outcomes
    ]


@pytest.mark.parametrize("name", ["", "NVLink bandwidth", "x" * 64, "-nvlink"])
def test_a_test_named_as_no_label_value_can_be_is_refused_when_registered(name: str) -> None:
    with pytest.raises(ValueError, match="must be a Kubernetes label value"):
        CheckKind(name, Links, "NVLink bandwidth")

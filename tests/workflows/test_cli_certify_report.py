"""``dsx certify report FILE``: status and exit code come from the verdicts, not from the file's word.

A report is a file someone may have edited, or a defect may have written wrongly; a CI gate that trusts
its ``status`` field would pass a certification whose every check failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steps.readiness.models import Subject, Verdict
from steps.readiness.report import CertificationReport, NodeResult
from workflows.cli.main import run

NODE_1 = Subject(kind="node", name="node-1")
NODE_2 = Subject(kind="node", name="node-2")


def _report(tmp_path: Path, status: str, verdicts: list[Verdict], nodes: dict[str, str]) -> Path:
    report = CertificationReport(
        status=status,  # type: ignore[arg-type]
        summary="as written",
        nodes=[NodeResult(name=name, status=value) for name, value in nodes.items()],  # type: ignore[arg-type]
        verdicts=verdicts,
    )
    path = tmp_path / "report.json"
    path.write_text(report.model_dump_json(indent=2))
    return path


def _show(capsys: pytest.CaptureFixture[str], path: Path, fmt: str = "table") -> tuple[int, str, str]:
    code = run(["certify", "report", str(path), "-o", fmt])
    out, err = capsys.readouterr()
    return code, out, err


def _verdict(subject: Subject, status: str) -> Verdict:
    return Verdict(subject=subject, test="allreduce-run", status=status, message=f"{subject.name} {status}")  # type: ignore[arg-type]


def test_a_report_that_says_passed_while_every_verdict_failed_fails_and_is_flagged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _report(
        tmp_path,
        "passed",
        [_verdict(NODE_1, "fail"), _verdict(NODE_2, "error")],
        {"node-1": "passed", "node-2": "passed"},
    )
    code, out, err = _show(capsys, path, "json")
    assert code == 1
    data = json.loads(out)
    assert data["status"] == "failed"
    assert {n["name"]: n["status"] for n in data["nodes"]} == {"node-1": "failed", "node-2": "failed"}
    assert data["disagreements"][0] == "the report says passed, but 2 of 2 verdicts did not pass"
    assert (
        f"warning: {path}: the report says passed, but 2 of 2 verdicts did not pass; shown as failed" in err
    )
    assert "node node-1: the report says passed, its verdicts say failed" in err
    assert data["summary"] == (
        "The report disagrees with its verdicts (the report says passed, but 2 of 2 verdicts did not "
        "pass). 2 of 2 checks did not pass; failed nodes: node-1, node-2. First: node-1 fail"
    )
    code, out, _ = _show(capsys, path)
    assert code == 1 and out.startswith("certification FAILED: The report disagrees with its verdicts")
    assert "checks passed" not in out.splitlines()[0]  # a FAILED headline never says all passed
    code, out, _ = _show(capsys, path, "markdown")
    assert code == 1 and out.startswith("# dsx certification: FAILED")


def test_a_failed_node_result_fails_the_report_even_when_its_verdicts_passed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _report(tmp_path, "passed", [_verdict(NODE_1, "pass")], {"node-1": "passed", "node-2": "failed"})
    code, out, err = _show(capsys, path, "json")
    assert code == 1 and json.loads(out)["status"] == "failed"
    assert "nodes failed: node-2" in err


def test_a_report_without_verdicts_never_passes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _report(tmp_path, "passed", [], {"node-1": "passed"})
    code, _, err = _show(capsys, path)
    assert code == 1 and "it holds no verdicts" in err


def test_a_report_that_says_failed_with_every_verdict_passing_is_flagged_and_not_passed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _report(tmp_path, "failed", [_verdict(NODE_1, "pass")], {"node-1": "passed"})
    code, out, err = _show(capsys, path, "json")
    assert code == 1 and json.loads(out)["status"] == "failed"
    assert "the report says failed, but all 1 verdicts passed" in err


def test_a_consistent_report_is_shown_as_written(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _report(
        tmp_path, "passed", [_verdict(NODE_1, "pass"), _verdict(NODE_2, "pass")], {"node-1": "passed"}
    )
    code, out, err = _show(capsys, path, "json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert data["status"] == "passed" and "disagreements" not in data
    assert [n["name"] for n in data["nodes"]] == ["node-1"]
    path = _report(tmp_path, "failed", [_verdict(NODE_1, "fail")], {"node-1": "failed"})
    code, _, err = _show(capsys, path)
    assert (code, err) == (1, "")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_report_with_non_json_numbers_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, constant: str
) -> None:
    path = _report(tmp_path, "passed", [_verdict(NODE_1, "pass")], {"node-1": "passed"})
    data = json.loads(path.read_text())
    data["verdicts"][0]["measured"] = "__X__"
    path.write_text(json.dumps(data).replace('"__X__"', constant))
    code, out, err = _show(capsys, path)
    assert code == 2 and out == ""
    assert err.strip() == f"error: {path}: not strict JSON: {constant} is not a number JSON allows"

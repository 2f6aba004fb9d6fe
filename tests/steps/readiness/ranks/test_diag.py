"""DCGM's diagnostics: dcgmi diag's JSON read and judged, DCGM absent said, the check through a launcher.

The stand-in ``dcgmi`` prints what DCGM 4's ``dcgmi diag -j`` prints, in its layout (``Diag::
HelperJsonBuildOutput`` in NVIDIA/DCGM's dcgmi/Diag.cpp: ``entity_groups``, ``metadata``, ``"DCGM
Diagnostic"`` -> ``test_categories`` -> ``tests`` with ``results`` per entity and a ``test_summary``), and
what it prints when no host engine answers (dcgmi/Command.cpp).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from steps.readiness.checks import DiagRequest, run_diag
from steps.readiness.judge import DIAG_TEST, judge_diag
from steps.readiness.launchers.local import LocalLauncher
from steps.readiness.models import Subject
from steps.readiness.ranks.diag import DiagResult, read_dcgmi, run_dcgmi

NODE = Subject(kind="node", name="node-01", members=["node-01"])
NO_HOST_ENGINE = "Error: unable to establish a connection to the specified host: localhost\n"


def dcgm_json(tests: dict[str, list[tuple[str, list[str]]]], runtime_error: str | None = None) -> str:
    """``dcgmi diag -j`` output: for each test, each GPU's status and warnings (in that GPU's order)."""
    categories: dict[str, list[dict[str, Any]]] = {}
    for name, results in tests.items():
        entries = []
        summary_warnings = []
        for gpu, (status, warnings) in enumerate(results):
            entry: dict[str, Any] = {
                "entity_group": "GPU",
                "entity_group_id": 1,
                "entity_id": gpu,
                "status": status,
            }
            if warnings:
                entry["warnings"] = [
                    {"warning": w, "error_id": 83, "error_category": 4, "error_severity": 2} for w in warnings
                ]
                summary_warnings += entry["warnings"]
            entries.append(entry)
        worst = next((s for s in ("Fail", "Warn", "Pass", "Skip") if any(r[0] == s for r in results)), "Pass")
        summary: dict[str, Any] = {"status": worst}
        if summary_warnings:
            summary["warnings"] = summary_warnings
        category = "Deployment" if name == "software" else "Hardware"
        categories.setdefault(category, []).append(
            {"name": name, "results": entries, "test_summary": summary}
        )
    body: dict[str, Any] = {"test_categories": [{"category": c, "tests": t} for c, t in categories.items()]}
    if runtime_error is not None:
        body = {"runtime_error": runtime_error, "version": "4.6.0"}
    gpus = max((len(r) for r in tests.values()), default=0)
    output = {
        "entity_groups": [
            {
                "entity_group": "GPU",
                "entity_group_id": 1,
                "entities": [
                    {"entity_id": i, "serial_num": f"165232000{i}", "device_id": "2330"} for i in range(gpus)
                ],
            }
        ],
        "metadata": {"version": "4.6.0", "Driver Version Detected": "580.95.05"},
        "DCGM Diagnostic": body,
    }
    return json.dumps(output, indent=3)


def stand_in(folder: Path, by_node: dict[str, tuple[str, int]]) -> Path:
    """A ``dcgmi`` on a folder to put first on PATH: it prints the output given for the node its rank
    stands for (``DSX_NODE_NAME``), exits with the code given, and records its arguments."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "outputs.json").write_text(json.dumps(by_node))
    program = folder / "dcgmi"
    program.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import json, os, sys
            here = {str(folder)!r}
            with open(os.path.join(here, "argv"), "a") as log:
                log.write(json.dumps(sys.argv[1:]) + "\\n")
            outputs = json.load(open(os.path.join(here, "outputs.json")))
            text, code = outputs[os.environ.get("DSX_NODE_NAME", "")]
            sys.stdout.write(text)
            sys.exit(code)
            """
        )
    )
    program.chmod(0o755)
    return folder


def _on_path(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DSX_NODE_NAME", "node-01")


PASSED = dcgm_json({"software": [("Pass", [])], "pcie": [("Pass", []), ("Pass", [])]})
MEMORY_FAILED = dcgm_json(
    {
        "software": [("Pass", [])],
        "memory": [("Pass", []), ("Fail", ["A DBE occurred on GPU 1 in the memory test"])],
    }
)


def test_no_dcgmi_on_the_image_is_dcgm_absent_and_passes_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run_dcgmi("3", "node-01")
    assert not result.present and result.reason == "dcgmi is not on this image's PATH"
    (verdict,) = judge_diag(result, NODE)
    assert verdict.status == "pass" and verdict.test == DIAG_TEST
    assert "no DCGM diagnostics ran: dcgmi is not on this image's PATH" in verdict.message


def test_no_host_engine_answering_is_dcgm_absent_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _on_path(monkeypatch, stand_in(tmp_path / "bin", {"node-01": (NO_HOST_ENGINE, 255)}))
    result = run_dcgmi("1", "node-01", host="10.0.0.7:5555")
    assert not result.present and result.exit_code == 255
    assert result.reason is not None and result.reason.startswith(
        "no DCGM host engine answers at 10.0.0.7:5555"
    )
    argv = json.loads((tmp_path / "bin" / "argv").read_text())
    assert argv == ["diag", "-r", "1", "-j", "--host", "10.0.0.7:5555"]
    assert judge_diag(result, NODE)[0].status == "pass"


def test_every_test_read_from_dcgms_json_and_a_pass_names_them() -> None:
    fields = read_dcgmi(PASSED, 0)
    assert fields["version"] == "4.6.0" and fields["driver"] == "580.95.05"
    assert fields["gpus"] == ["GPU 0 (serial 1652320000)", "GPU 1 (serial 1652320001)"]
    assert [(t.category, t.name, t.status) for t in fields["tests"]] == [
        ("Deployment", "software", "Pass"),
        ("Hardware", "pcie", "Pass"),
    ]
    assert "error" not in fields


def test_a_failed_memory_test_fails_the_node_naming_the_gpu_and_dcgms_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _on_path(monkeypatch, stand_in(tmp_path / "bin", {"node-01": (MEMORY_FAILED, 226)}))
    result = run_dcgmi("memory,memtest", "node-01")
    assert result.present and result.exit_code == 226 and result.error is None
    (verdict,) = judge_diag(result, NODE, ["diag.json"])
    assert verdict.status == "fail" and verdict.node == "node-01" and verdict.evidence == ["diag.json"]
    assert verdict.message == (
        "node node-01: dcgmi diag -r memory,memtest: memory failed "
        "(GPU 1: A DBE occurred on GPU 1 in the memory test)"
    )


def test_dcgm_3s_layout_is_read_too() -> None:
    """DCGM 3.3's ``dcgmi diag -j`` (dcgmi/Diag.cpp of 3.3.9): the body named "DCGM GPU Diagnostic", each
    result a ``gpu_id`` (a string) with its status, warnings and one info string, no test summary; the
    driver and the GPUs' serials at the top."""
    output = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Hardware",
                    "tests": [
                        {
                            "name": "Memory",
                            "results": [
                                {"gpu_id": "0", "status": "Pass", "info": "Allocated 95% of memory"},
                                {
                                    "gpu_id": "1",
                                    "status": "Fail",
                                    "warnings": [
                                        {
                                            "warning": "A DBE occurred on GPU 1",
                                            "error_id": 83,
                                            "error_category": 4,
                                            "error_severity": 2,
                                        }
                                    ],
                                },
                            ],
                        }
                    ],
                }
            ],
            "version": "3.3.9",
        },
        "Driver Version Detected": "550.90.07",
        "GPU Device Serials": {"0": "1652320000", "1": "1652320001"},
    }
    fields = read_dcgmi(json.dumps(output), 226)
    assert (fields["version"], fields["driver"]) == ("3.3.9", "550.90.07")
    assert fields["gpus"] == ["GPU 0 (serial 1652320000)", "GPU 1 (serial 1652320001)"]
    (test,) = fields["tests"]
    assert (test.name, test.status) == ("Memory", "Fail")
    assert [(e.group, e.id, e.status, e.info) for e in test.entities] == [
        ("GPU", 0, "Pass", ["Allocated 95% of memory"]),
        ("GPU", 1, "Fail", []),
    ]
    result = DiagResult(node="node-01", run="2", present=True, exit_code=226, **fields)
    (verdict,) = judge_diag(result, NODE)
    assert verdict.status == "fail" and "Memory failed (GPU 1: A DBE occurred on GPU 1)" in verdict.message


def test_warnings_pass_and_are_said() -> None:
    warned = dcgm_json({"targeted_power": [("Warn", ["Clocks are being throttled for GPU 0"])]})
    result = DiagResult(node="node-01", run="3", present=True, exit_code=0, **read_dcgmi(warned, 0))
    (verdict,) = judge_diag(result, NODE)
    assert verdict.status == "pass"
    assert (
        "targeted_power warn" in verdict.message and "Clocks are being throttled for GPU 0" in verdict.message
    )


@pytest.mark.parametrize(
    ("output", "code", "said"),
    [
        (
            dcgm_json({}, runtime_error="Error: Diagnostic could not be run while DCGM is paused."),
            1,
            "paused",
        ),
        ("Segmentation fault\n", 139, "dcgmi exited 139 without DCGM's diagnostic JSON: Segmentation fault"),
        ('{"DCGM Diagnostic": {"test_categories": []}}', 0, "dcgmi exited 0 and reported no test"),
    ],
    ids=["runtime-error", "not-json", "no-test"],
)
def test_a_diagnostic_that_could_not_run_is_an_error_not_a_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str, code: int, said: str
) -> None:
    _on_path(monkeypatch, stand_in(tmp_path / "bin", {"node-01": (output, code)}))
    result = run_dcgmi("2", "node-01")
    assert result.present and result.error is not None and said in result.error
    (verdict,) = judge_diag(result, NODE)
    assert verdict.status == "error" and "dcgmi diag -r 2 could not give a verdict" in verdict.message


def test_a_diagnostic_past_its_deadline_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "dcgmi").write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    (folder / "dcgmi").chmod(0o755)
    _on_path(monkeypatch, folder)
    result = run_dcgmi("4", "node-01", timeout_s=0.5)
    assert result.present and result.error == "dcgmi diag -r 4 did not finish within 0.5 s"
    assert judge_diag(result, NODE)[0].status == "error"


def test_the_check_runs_dcgmi_on_rank_zero_and_judges_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _on_path(monkeypatch, stand_in(tmp_path / "bin", {"node-01": (MEMORY_FAILED, 226)}))
    request = DiagRequest(subject=NODE, run="memory,memtest", host="dcgm.example:5555")
    outcome = run_diag(request, LocalLauncher(tmp_path / "out", 2, ["node-01", "node-01"]))
    assert outcome.status == "fail" and outcome.result is not None
    assert outcome.result.node == "node-01" and [t.name for t in outcome.result.tests] == [
        "software",
        "memory",
    ]
    assert str(tmp_path / "out" / "diag.json") in outcome.evidence
    # rank 0 alone ran dcgmi, with the request's run and host engine
    runs = (tmp_path / "bin" / "argv").read_text().splitlines()
    assert [json.loads(line) for line in runs] == [
        ["diag", "-r", "memory,memtest", "-j", "--host", "dcgm.example:5555"]
    ]

"""The fault history's XID counting, and its rules as data: shipped, replaced by a cluster's overrides,
and refused with the file and line of a mistake."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from steps.errors import InputError
from steps.sentinel.catalogue import default_faults_dir, load_catalogue
from steps.sentinel.events import HealthEvent
from steps.sentinel.history import FaultHistory, XidHistory, XidRule, load_history

RULE = XidRule(
    name="repeated", codes=[13, 31], count=3, within_minutes=10, severity="fatal", action="reset-gpu"
)
PCI = "0000:58:00"


def _counts(lines: int, code: int = 13) -> dict[tuple[str, str, int], tuple[int, float, float]]:
    return {("xid", PCI, code): (lines, 0.0, 0.0)}


def _reading(code: str = "13") -> HealthEvent:
    return HealthEvent(
        node="n", check="xid", component="gpu", entity="GPU-4", code=code, healthy=False, message="GPU 4: XID"
    )


def test_lines_count_from_the_first_pass_within_the_window() -> None:
    history = XidHistory([RULE])
    history.observe(_counts(7), 0)  # lines written before the agent watched never count
    assert history.lines_within(PCI, 13, 600, 0) == 0
    history.observe(_counts(9), 60)
    assert history.lines_within(PCI, 13, 600, 60) == 2
    assert history.escalate(_reading(), PCI, 60).severity == "info"
    history.observe(_counts(10), 120)
    escalated = history.escalate(_reading(), PCI, 120)
    assert (escalated.severity, escalated.action) == ("fatal", "reset-gpu")
    assert escalated.message == "GPU 4: XID (3 times within 10 min: history rule repeated)"
    # ten minutes after the second pass, only the last line is within the window
    history.observe(_counts(10), 670)
    assert history.lines_within(PCI, 13, 600, 670) == 1
    assert history.escalate(_reading(), PCI, 670).severity == "info"


def test_a_gpu_first_counted_after_the_first_pass_had_no_lines_before() -> None:
    history = XidHistory([RULE])
    history.observe({}, 0)
    history.observe(_counts(3), 30)
    assert history.fired(PCI, 13, 30) == (RULE, 3)
    # codes no rule counts, and readings of other checks or healthy ones, are left as they are
    history.observe(_counts(9, code=79), 40)
    assert history.lines_within(PCI, 79, 600, 40) == 0
    healthy = _reading().model_copy(update={"healthy": True, "code": ""})
    assert history.escalate(healthy, PCI, 40) is healthy


def test_a_snapshot_carries_the_count_to_a_restarted_agent() -> None:
    history = XidHistory([RULE])
    history.observe(_counts(0), 0)
    history.observe(_counts(2), 10)
    restarted = XidHistory([RULE])
    restarted.restore(history.snapshot())
    restarted.observe(_counts(3), 20)
    assert restarted.fired(PCI, 13, 20) == (RULE, 3)
    with pytest.raises(ValueError, match="not an XID history snapshot"):
        XidHistory([RULE]).restore({"seen": [["pci", "x", [[0, 1]]]]})


def test_the_shipped_rules_and_a_clusters_own(tmp_path: Path) -> None:
    shipped = load_catalogue().history
    assert [(r.name, r.codes, r.count, r.within_minutes) for r in shipped.xid] == [
        ("repeated-application-xid", [13, 31, 43], 5, 10.0)
    ]
    assert shipped.lemon is not None and (shipped.lemon.count, shipped.lemon.within_days) == (3, 30.0)
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(
        "apiVersion: dsx.dev/v1alpha1\nkind: FaultOverrides\n"
        "history:\n  xid: []\n  lemon: {count: 5, withinDays: 60}\n"
    )
    mine = load_catalogue(overrides=overrides).history
    assert mine == FaultHistory(xid=[], lemon={"count": 5, "withinDays": 60})


def test_a_mistake_in_a_history_file_names_the_file_and_line(tmp_path: Path) -> None:
    text = (default_faults_dir() / "history.yaml").read_text()
    broken = tmp_path / "history.yaml"
    broken.write_text(text.replace("    count: 5\n", "    count: 1\n"))
    line = next(i for i, row in enumerate(broken.read_text().splitlines(), 1) if "count: 1" in row)
    with pytest.raises(
        InputError, match=rf"history\.yaml:{line}: not a FaultHistory: .*greater than or equal to 2"
    ):
        load_history(broken)
    twice = tmp_path / "twice.yaml"
    rule = "  - {name: a, codes: [13], count: 2, withinMinutes: 1, severity: fatal, action: reset-gpu}\n"
    twice.write_text("apiVersion: dsx.dev/v1alpha1\nkind: FaultHistory\nxid:\n" + rule + rule)
    with pytest.raises(InputError, match="XID rule 'a' is listed twice"):
        load_history(twice)


def test_timestamps_of_readings_are_untouched_by_the_history() -> None:
    reading = _reading().model_copy(update={"observed_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)})
    history = XidHistory([RULE])
    history.observe({}, 0)
    history.observe(_counts(5), 1)
    assert history.escalate(reading, PCI, 1).observed_at == reading.observed_at

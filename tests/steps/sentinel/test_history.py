"""The fault history's XID counting, and its rules as data: shipped, replaced by a cluster's overrides,
and refused with the file and line of a mistake."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest

from steps.cluster import shareable
from steps.cluster.sim import FileStore, SimCluster
from steps.errors import InputError
from steps.sentinel import ledger
from steps.sentinel.catalogue import default_faults_dir, load_catalogue
from steps.sentinel.events import HealthEvent
from steps.sentinel.history import FaultHistory, XidHistory, XidRule, load_history
from steps.sentinel.kernel_log import Boot
from steps.sentinel.node import build_sentinel
from tests.cli import dsx_here
from tests.steps.sentinel.fake_nvml import FakeNvml, gpus

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


def test_dsx_sentinel_history_shows_the_counts_the_agent_keeps_and_the_lemon_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = shareable("sim:nodes=2,gpu=h100,workloads=false", tmp_path)
    port = SimCluster(FileStore(tmp_path / "fleet.json"))
    for n in (1, 2, 3):
        for state in ("requested", "in-service"):
            ledger.record(port, "node-01", state, workflow=f"w{n}", attempt=1, check="xid")
    this_boot = Boot.read()
    assert this_boot is not None
    log, state_dir = tmp_path / "kern.log", tmp_path / "state"
    log.write_text("")
    sentinel = build_sentinel(
        port,
        "node-01",
        load_catalogue(),
        source="nvml",
        nvml_module=FakeNvml(gpus(8)),
        sysfs="/nonexistent",
        kernel_log=str(log),
        state_dir=state_dir,
        boot=Boot(this_boot.id, time.time() - 3600),
    )
    sentinel.run_once()
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
    with log.open("a") as handle:
        for i in range(5):
            handle.write(f"{stamp} gpu-7 kernel: [{3500 + i:12.6f}] NVRM: Xid (PCI:{PCI}): 13, pid=7\n")
    sentinel.run_once()

    args = ("sentinel", "history", "node-01", "--state-dir", str(state_dir), "--cluster", spec)
    code, out, err = dsx_here(capsys, *args, "-o", "json")
    assert code == 0, err
    seen = json.loads(out)
    assert seen["boot_id"] == this_boot.id and seen["state_file"].endswith("sentinel-state.json")
    assert [(x["pci"], x["code"], x["lines"], x["fired"]) for x in seen["xid"]] == [(PCI, 13, 5, True)]
    assert [r["workflow"] for r in seen["returned"]] == ["w1", "w2", "w3"] and seen["lemon_fired"] is True
    code, table, _ = dsx_here(capsys, *args)
    assert code == 0
    assert "5 of 5 within 10 min" in table and "lemon rule fired" in table
    # without the state directory: the ledger's part only
    code, out, _ = dsx_here(capsys, "sentinel", "history", "node-02", "--cluster", spec, "-o", "json")
    assert code == 0 and json.loads(out)["xid"] == [] and json.loads(out)["lemon_fired"] is False

"""The agent over a node's life: the kernel log of this boot only, a restart that changes nothing, a
reboot that clears, probes that hang, the GPU count from the API server, and every XID reported."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import RetryPolicy, load_fleet
from steps.cluster import vocabulary as vocab
from steps.cluster.sim import MemoryStore, SimCluster
from steps.sentinel.agent import Agent
from steps.sentinel.catalogue import load_catalogue
from steps.sentinel.events import HealthEvent
from steps.sentinel.kernel_log import Boot
from steps.sentinel.node import Sentinel, build_sentinel
from steps.sentinel.probes import NodeProbes
from steps.sentinel.state import FILE_NAME
from tests.cli import dsx_here
from tests.steps.sentinel.fake_nvml import FakeNvml, gpus

FAST = RetryPolicy(
    attempts=2, base_delay=0.0, max_delay=0.0, jitter=0.0, conflict_attempts=2, conflict_delay=0.0
)
NODE = "node-01"
FLEET = "sim:nodes=2,gpu=h100,workloads=false"


def _fleet(faults: str = "") -> SimCluster:
    return SimCluster(MemoryStore(load_fleet(FLEET + (f",faults={faults}" if faults else ""))), retry=FAST)


def _events(port: SimCluster) -> list[dict[str, Any]]:
    return list(port.list_objects("v1", "Event", namespace="default"))


def _stamp(t: float) -> str:
    """rsyslog's stamp in /var/log/kern.log (RFC 3339, Ubuntu's default)."""
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="microseconds")


def _xid(t: float, pci: str, code: int, uptime: float, detail: str = "pid=7, name=python") -> str:
    return f"{_stamp(t)} gpu-7 kernel: [{uptime:12.6f}] NVRM: Xid (PCI:{pci}): {code}, {detail}"


def _linux(t: float) -> str:
    return f"{_stamp(t)} gpu-7 kernel: [    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02)"


# ------------------------------------------------------------------ 11. the kernel log from this boot


class Node:
    """One real-looking node: a fake NVML with 8 GPUs, /var/log/kern.log, a state directory, a boot."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = _fleet()
        self.log = tmp_path / "kern.log"
        self.state_dir = tmp_path / "state"
        self.devices = gpus(8)
        now = time.time()
        self.boot = Boot("5c1e7a2b-93d4-4f1e-8a6b-0c9d8e7f6a5b", now - 3600)
        earlier = now - 3 * 86400
        self.log.write_text(
            "\n".join(
                [
                    _linux(earlier + 20),
                    _xid(self.boot.time - 900, "0000:18:00", 79, 3 * 86400 - 4500),  # GPU 0, last boot
                    _linux(self.boot.time + 25),
                    _xid(now - 60, "0000:38:00", 79, 3540.0),  # GPU 2, this boot
                ]
            )
            + "\n"
        )

    def agent(self, nvml: FakeNvml | None = None) -> Sentinel:
        """The agent as the DaemonSet runs it: NVML, the kernel-log file, the state directory."""
        return build_sentinel(
            self.port,
            NODE,
            load_catalogue(),
            source="nvml",
            nvml_module=nvml or FakeNvml(self.devices),
            sysfs="/nonexistent",
            kernel_log=str(self.log),
            state_dir=self.state_dir,
            boot=self.boot,
        )


def test_a_kern_log_gives_only_this_boots_xids(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = node.agent().run_once()
    assert [(e.check, e.entity, e.code) for e in result.changed] == [("xid", "GPU-fake-2", "79")]
    condition = node.port.get_node(NODE).condition("DsxGpuXid")
    assert condition.status == "True" and "GPU 2" in condition.message and "GPU 0" not in condition.message


def _append(node: Node, code: int, times: int, pci: str = "0000:58:00") -> None:
    with node.log.open("a") as handle:
        for i in range(times):
            handle.write(_xid(time.time(), pci, code, 3600.0 + i) + "\n")


def _xid13(result: Any) -> list[HealthEvent]:
    return [e for e in result.changed if e.check == "xid" and e.code == "13"]


def test_an_application_xid_over_and_over_on_one_gpu_is_escalated_by_the_history_rule(tmp_path: Path) -> None:
    """XID 13 (a graphics engine exception) is the application's, once; five times within ten minutes
    on GPU 4 it is the GPU's: the rule of recipes/faults/history.yaml makes it fatal, reset-gpu."""
    node = Node(tmp_path)
    sentinel = node.agent()
    sentinel.run_once()  # the first reading: GPU 2's XID 79 of this boot
    _append(node, 13, 4)
    (first,) = _xid13(sentinel.run_once())
    assert (first.entity, first.severity, first.action) == ("GPU-fake-4", "info", "restart-app")
    _append(node, 13, 1)
    (fifth,) = _xid13(sentinel.run_once())
    assert (fifth.entity, fifth.severity, fifth.action) == ("GPU-fake-4", "fatal", "reset-gpu")
    assert "5 times within 10 min: history rule repeated-application-xid" in fifth.message
    condition = node.port.get_node(NODE).condition("DsxGpuXid")
    assert "history rule repeated-application-xid" in condition.message
    # the count goes on across a restart of the agent in this boot (its state file)
    restarted = node.agent()
    assert restarted.probes.xid_history.lines_within("0000:58:00", 13, 600, time.time()) == 5


def test_application_xids_already_in_the_log_when_the_agent_starts_escalate_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path)
    _append(node, 13, 6)  # written before this agent (and its state) existed
    (reading,) = _xid13(node.agent().run_once())
    assert reading.severity == "info"


def test_after_a_reboot_the_old_xid_is_not_reported_and_its_condition_clears(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.agent().run_once()
    assert (node.state_dir / FILE_NAME).is_file()
    # The node reboots: a new boot id and boot time, after every line of the log; its state file is
    # of the old boot, and the kern.log still holds both boots' XIDs.
    node.boot = Boot("9f8e7d6c-5b4a-4321-8fed-cba987654321", time.time() - 30)
    result = node.agent().run_once()
    assert [e for e in result.events if e.check == "xid" and not e.healthy] == []
    assert node.port.get_node(NODE).condition("DsxGpuXid").status == "False"
    assert json.loads((node.state_dir / FILE_NAME).read_text())["boot_id"] == node.boot.id


def test_a_restarted_agent_of_the_same_boot_reports_nothing_new_and_writes_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path)
    fake = FakeNvml(node.devices)
    fake.pending_events = [(4, 48)]  # an XID only NVML's event set delivered
    first = node.agent(fake)
    first.wait(0.01)
    first.run_once()
    events, state = _events(node.port), node.state_dir / FILE_NAME
    before = (state.stat().st_ino, state.stat().st_mtime_ns, state.read_bytes())
    condition = node.port.get_node(NODE).condition("DsxGpuXid")
    assert "GPU 2" in condition.message and "GPU 4" in condition.message
    restarted = node.agent()  # the pod restarted: a fresh process, the same boot, the same log
    result = restarted.run_once()
    assert result.changed == [] and result.written == 0 and result.queued == 0
    assert _events(node.port) == events  # no Event again
    assert node.port.get_node(NODE).condition("DsxGpuXid") == condition  # NVML's XID 48 not forgotten
    assert (state.stat().st_ino, state.stat().st_mtime_ns, state.read_bytes()) == before
    # a new XID after the restart is reported, once
    with node.log.open("a") as handle:
        handle.write(_xid(time.time(), "0000:78:00", 48, 3600.0) + "\n")
    assert [(e.entity, e.code) for e in restarted.run_once().changed] == [("GPU-fake-6", "48")]


def test_a_taint_queued_while_the_api_server_was_away_survives_a_restart(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.port.inject_api(errors=10_000)
    first = node.agent()
    result = first.run_once()
    assert not result.api_up and [w.kind for w in first.agent.queue][:1] == ["taint"]
    restarted = node.agent()  # the pod restarted before the API server came back
    assert [w.kind for w in restarted.agent.queue][:1] == ["taint"]
    with node.port.store.transaction() as fleet:
        fleet.api.errors = 0
    assert restarted.run_once().queued == 0
    assert node.port.get_node(NODE).has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")


def test_a_node_that_vanished_and_came_back_gets_its_taint_and_condition_again(tmp_path: Path) -> None:
    """The node object is gone while the XID arrives (deleted, re-registering): the writes find no node.
    Once it is back, bare, the agent writes its condition and taint again; it once believed them set."""
    node = Node(tmp_path)
    with node.port.store.transaction() as fleet:
        kept = fleet.nodes.pop(NODE)
    agent = node.agent()
    agent.run_once()  # the XID 79 of this boot: the taint and the condition find no node
    with node.port.store.transaction() as fleet:
        fleet.nodes[NODE] = kept  # back, as it was before the fault
    assert not node.port.get_node(NODE).has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    agent.run_once()
    back = node.port.get_node(NODE)
    assert back.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    condition = back.condition(vocab.CONDITION_GPU_XID)
    assert condition is not None and condition.status == "True"


def test_a_state_file_that_does_not_parse_is_said_and_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = Node(tmp_path)
    node.state_dir.mkdir()
    (node.state_dir / FILE_NAME).write_text("{not json")
    result = node.agent().run_once()
    assert [(e.entity, e.code) for e in result.changed] == [("GPU-fake-2", "79")]
    assert "ignored, not JSON" in capsys.readouterr().err
    assert json.loads((node.state_dir / FILE_NAME).read_text())["boot_id"] == node.boot.id


# ------------------------------------------------------------------ 12. probes that cannot hang


@pytest.mark.story
def test_a_probe_that_hangs_gives_a_degraded_reading_and_the_passes_go_on() -> None:
    port = _fleet(f"{NODE}:xid=79@3")
    catalogue = load_catalogue()
    probes = NodeProbes(NODE, catalogue, port, lambda: dt.datetime.now(dt.UTC), 8)
    release, calls = threading.Event(), []

    def hung() -> list[HealthEvent]:
        calls.append(1)
        release.wait()  # a wedged driver call: never returns on its own
        return []

    agent = Agent(NODE, port, [("hung", hung), *probes.probes()], catalogue)
    # 3 s: a pass that waited for the hung call would take that long; one that did not takes milliseconds,
    # and the bounds below leave a loaded machine (the suite's workers share its CPUs) room between
    agent.probe_timeout = 3.0
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(agent.run_once()), daemon=True)
    worker.start()
    worker.join(5)  # the old agent blocks here for good
    try:
        assert done, "the pass hung with its probe"
        first = done[0]
        readings = {(e.check, e.entity, e.code, e.severity) for e in first.changed}
        assert ("probe", "hung", "probe-timeout", "degraded") in readings
        assert ("xid", port.node_report(NODE).gpus[3].uuid, "79", "fatal") in readings  # the others ran
        node = port.get_node(NODE)
        assert node.condition("DsxSentinelProbeFailed").status == "True"
        assert "probe hung did not return within 3 s" in node.condition("DsxSentinelProbeFailed").message
        assert node.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
        started = time.monotonic()
        second = agent.run_once()  # the call still hangs: no second call, no wait for it
        assert time.monotonic() - started < 2.5 and calls == [1]
        assert [t.name for t in threading.enumerate()].count("sentinel-probe-hung") == 1
        (stuck,) = [e for e in second.events if e.entity == "hung"]
        assert stuck.code == "probe-timeout" and "still has not returned" in stuck.message
        assert agent.healthy(interval=1.0)
        assert 'dsx_sentinel_probe_timeouts_total{probe="hung"} 1.0' in agent.metrics.exposition().decode()
    finally:
        release.set()
    time.sleep(0.05)  # it returns at last: the next pass calls it again, and it clears
    third = agent.run_once()
    assert calls == [1, 1] and ("probe", "hung", True) in [
        (e.check, e.entity, e.healthy) for e in third.changed
    ]
    assert port.get_node(NODE).condition("DsxSentinelProbeFailed").status == "False"


class _WedgedNvml(FakeNvml):
    """NVML whose ECC query and event wait never return once ``wedged`` is set (a degrading GPU stalling
    the driver)."""

    def __init__(self) -> None:
        super().__init__(gpus(8))
        self.wedged, self.release = threading.Event(), threading.Event()

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter: int) -> int:
        if self.wedged.is_set():
            self.release.wait()
        return super().nvmlDeviceGetTotalEccErrors(handle, error_type, counter)

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> Any:
        if self.wedged.is_set():
            self.release.wait()
        return super().nvmlEventSetWait(event_set, timeout_ms)


@pytest.mark.story
def test_nvml_that_stops_answering_is_a_degraded_nvml_reading_and_healthz_stays_up(tmp_path: Path) -> None:
    (tmp_path / "class/net/eth0").mkdir(parents=True)
    (tmp_path / "class/net/eth0/operstate").write_text("up\n")
    (tmp_path / "class/net/eth0/device").mkdir()
    port, fake = _fleet(), _WedgedNvml()
    sentinel = build_sentinel(
        port, NODE, load_catalogue(), source="nvml", nvml_module=fake, sysfs=str(tmp_path), probe_timeout=3.0
    )  # a pass that waited for NVML takes 3 s; one that did not, milliseconds (bounds with room for load)
    sentinel.run_once()
    fake.wedged.set()
    try:
        result = sentinel.run_once()
        readings = {(e.check, e.entity, e.code) for e in result.changed}
        assert {("nvml", "nvml", "nvml-timeout"), ("probe", "gpu", "probe-timeout")} <= readings
        assert ("nic", "eth0", True) in [(e.check, e.entity, e.healthy) for e in result.events]  # still read
        condition = port.get_node(NODE).condition("DsxNvmlUnavailable")
        assert condition.status == "True" and "NVML did not answer within 3 s" in condition.message
        assert condition.reason == "DegradedReboot"
        for _ in range(2):  # the wait between passes does not hang on NVML either, nor start twice
            started = time.monotonic()
            sentinel.wait(0.01)
            assert time.monotonic() - started < 5.0  # the first waits out the 3 s, never twice that
        assert [t.name for t in threading.enumerate()].count("sentinel-nvml-wait") == 1
        started = time.monotonic()
        sentinel.run_once()
        assert time.monotonic() - started < 2.5 and sentinel.agent.healthy(interval=1.0)
    finally:
        fake.release.set()


def test_the_expected_gpu_count_is_the_nodes_capacity_not_what_nvml_or_gfd_list_at_start() -> None:
    port = _fleet()
    # GPU Feature Discovery relabelled the node after a GPU was lost; the API server still reports the
    # node's capacity of 8 (the device plugin registered 8), and NVML lists 7 when the agent starts.
    port.set_labels(NODE, {"nvidia.com/gpu.count": "7"})
    sentinel = build_sentinel(
        port, NODE, load_catalogue(), source="nvml", nvml_module=FakeNvml(gpus(7)), sysfs="/x"
    )
    result = sentinel.run_once()
    (missing,) = [e for e in result.changed if e.check == "gpu-missing"]
    assert (missing.entity, missing.code, missing.severity) == ("gpus", "count-below-expected", "fatal")
    assert missing.message == "7 of 8 GPUs visible to NVML"
    # a number given wins over the node's
    named = build_sentinel(
        _fleet(),
        NODE,
        load_catalogue(),
        source="nvml",
        nvml_module=FakeNvml(gpus(8)),
        sysfs="/x",
        expected_gpus=9,
    )
    assert [e.message for e in named.run_once().changed if e.check == "gpu-missing"] == [
        "8 of 9 GPUs visible to NVML"
    ]


def test_cli_probe_timeout_and_expected_gpus_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    spec = f"{FLEET},faults={NODE}:xid=79@3"
    for flag in ("--probe-timeout=0", "--expected-gpus=0"):
        code, _, err = dsx_here(
            capsys, "sentinel", "agent", "--cluster", spec, "--node", NODE, "--once", flag
        )
        assert code == 2 and flag.split("=")[0] in err, err


# ------------------------------------------------------------------ 13. every XID reported


def _kernel_log(tmp_path: Path, *codes: int) -> Path:
    log = tmp_path / "kern.log"
    now = time.time()
    log.write_text(
        "".join(_xid(now - 10 + i, "0000:38:00", c, 100.0 + i) + "\n" for i, c in enumerate(codes))
    )
    return log


def test_cli_probe_lists_every_xid_of_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _kernel_log(tmp_path, 31, 95)
    code, out, _ = dsx_here(
        capsys,
        "sentinel",
        "probe",
        "--cluster",
        FLEET,
        "--node",
        NODE,
        "--kernel-log",
        str(log),
        "-o",
        "json",
    )
    assert code == 1
    xids = [
        (e["entity"], e["code"], e["severity"])
        for e in json.loads(out)
        if e["check"] == "xid" and not e["healthy"]
    ]
    gpu2 = _fleet().node_report(NODE).gpus[2].uuid
    assert xids == [(gpu2, "31", "info"), (gpu2, "95", "fatal")]


@pytest.mark.parametrize(
    ("first", "second", "reason"),
    [
        (31, 95, "FatalResetGpu"),
        (95, 31, "FatalResetGpu"),
        (62, 64, "FatalResetGpu"),
        (79, 48, "FatalReboot"),
    ],
)
def test_the_agent_reports_each_xid_of_a_gpu_and_the_condition_keeps_the_worst(
    first: int, second: int, reason: str
) -> None:
    port = _fleet()
    catalogue = load_catalogue()
    probes = NodeProbes(NODE, catalogue, port, lambda: dt.datetime.now(dt.UTC), 8)
    agent = Agent(NODE, port, probes.probes(), catalogue)
    port.inject(NODE, f"xid={first}@2")
    agent.run_once()
    port.inject(NODE, f"xid={second}@2")
    changed = agent.run_once().changed
    assert [(e.check, e.code) for e in changed] == [("xid", str(second))]
    written = [(e["type"], e["reason"], e["message"]) for e in _events(port)]
    kinds = {c: catalogue.rule("xid", str(c)).severity for c in (first, second)}
    assert [(t, r) for t, r, _ in written] == [
        ("Normal" if kinds[c] == "info" else "Warning", "DsxGpuXid") for c in (first, second)
    ]
    assert [f"XID {c} " in m for (_, _, m), c in zip(written, (first, second), strict=True)] == [True, True]
    condition = port.get_node(NODE).condition("DsxGpuXid")
    assert (condition.status, condition.reason) == ("True", reason)
    # the node reboots (the simulated repair clears the GPU's XIDs): one healthy reading clears both
    with port.store.transaction() as fleet:
        fleet.health[NODE].gpus[2] = fleet.health[NODE].gpus[2].model_copy(update={"xids": ()})
    cleared = agent.run_once().changed
    assert sorted(e.code for e in cleared if e.check == "xid" and e.healthy) == sorted(
        [str(first), str(second)]
    )
    assert port.get_node(NODE).condition("DsxGpuXid").status == "False"


def test_sigterm_writes_what_is_queued_saves_the_state_and_exits_143(tmp_path: Path) -> None:
    """The kubelet stops the agent's pod with SIGTERM: the pass under way ends, the writes queued while
    the API server was away are made, the state file is saved, and the agent exits 143 at once instead of
    at the end of its interval (it once died on the spot, its queue lost to the next agent's start)."""
    import os
    import signal
    import subprocess
    import sys

    from steps.cluster import shareable
    from steps.cluster.sim import FileStore
    from tests.paths import REPO

    spec = shareable("sim:nodes=2,gpu=h100,workloads=false,faults=node-01:xid=79", tmp_path / "fleet")
    port = SimCluster(FileStore(tmp_path / "fleet" / "fleet.json"))
    port.inject_api(errors=10_000)  # the API server is away at the first pass: its writes are queued
    state = tmp_path / "state"
    agent = subprocess.Popen(
        [sys.executable, "-m", "workflows.cli", "sentinel", "agent", "--node", NODE, "--cluster", spec,
         "--interval", "600", "--metrics-port", "0", "--state-dir", str(state)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, vocab.ENV_RETRY_ATTEMPTS: "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (state / FILE_NAME).exists():  # the first pass ended (its state saved)
            assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()
            time.sleep(0.1)
        with port.store.transaction() as fleet:
            fleet.api.errors = 0  # back; the agent waits out its 600 s interval
        assert not port.get_node(NODE).has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")  # still queued
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    finally:
        agent.kill()
    assert agent.returncode == 143, err
    assert "stopped by SIGTERM" in err and "left queued" in err
    node = port.get_node(NODE)
    assert node.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    assert node.condition(vocab.CONDITION_GPU_XID) is not None
    saved = json.loads((state / FILE_NAME).read_text())
    assert saved["agent"]["queue"] == [], saved["agent"]  # what a restarted agent would take up: nothing


def test_healthz_stays_up_while_a_pass_waits_on_a_slow_api_server() -> None:
    """A pass whose writes wait on a slow API server is no stuck agent: /healthz stays up past the
    passes' budget while a call is under way (a liveness probe once restarted it in every brownout)."""
    port = _fleet("node-01:xid=79")
    agent = build_sentinel(port, NODE, load_catalogue(), source="auto").agent
    agent.run_once()
    agent.last_pass = time.time() - 3600  # long past 3 intervals: no pass ended for an hour
    assert not agent.healthy(10)
    entered, release = threading.Event(), threading.Event()
    slow = port.set_condition

    def set_condition(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(30)
        return slow(*args, **kwargs)

    port.set_condition = set_condition  # type: ignore[method-assign]
    agent._conditions = {}  # every condition to be written again: the pass will call the server
    worker = threading.Thread(target=agent.run_once)
    worker.start()
    try:
        assert entered.wait(30)
        assert agent.healthy(10)  # waiting on the server
    finally:
        release.set()
        worker.join(30)
    assert agent.healthy(10)  # and the pass ended

"""The agent's acceptance: each fault gives its condition, Event, metric and, when fatal, the taint; a
healthy reading clears exactly its own condition; an API outage is survived and replayed in order.
Run on a simulated node, on the kubernetes adapter over the emulated API server, and with a fake NVML."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from steps.cluster import RetryPolicy, load_fleet
from steps.cluster import vocabulary as vocab
from steps.cluster.port import ClusterPort
from steps.cluster.sim import MemoryStore, SimCluster
from steps.sentinel.agent import Agent
from steps.sentinel.catalogue import load_catalogue
from steps.sentinel.node import Sentinel, build_sentinel
from steps.sentinel.probes import NodeProbes
from tests.cli import dsx_here
from tests.emulator.apiserver import Emulator
from tests.steps.sentinel.conftest import Fleet
from tests.steps.sentinel.fake_nvml import FakeNvml, gpus

FAST = RetryPolicy(  # two tries at a conflict: the tests below run them out
    attempts=2, base_delay=0.0, max_delay=0.0, jitter=0.0, conflict_attempts=2, conflict_delay=0.0
)
NODE = "node-01"
CASES = [
    # fault, check, fatal
    ("xid=79@3", "xid", True),
    ("ecc=2@5", "ecc", True),
    ("failing-gpu=6", "gpu-missing", True),
    ("pcie-degraded@2", "pcie", False),
    ("nvlink-down@1", "nvlink", True),
]


def _events(port: ClusterPort) -> list[dict[str, object]]:
    return [o for o in port.list_objects("v1", "Event", namespace="default")]


@pytest.fixture
def ports(fleet: Fleet) -> Fleet:
    """Builds (cluster port, sim health source, emulator or None) for a two-node fleet with ``faults``."""
    return lambda faults: fleet(
        "sim:nodes=2,gpu=h100,workloads=false" + (f",faults={faults}" if faults else ""), FAST
    )


def _sentinel(port: ClusterPort, hardware: SimCluster, **kwargs: object) -> Sentinel:
    class Source:  # the fleet's hardware behind whichever port the writes go through
        def node_report(self, node: str) -> object:
            return hardware.node_report(node)

    catalogue = load_catalogue(overrides=kwargs.pop("overrides", None))  # type: ignore[arg-type]
    probes = NodeProbes(NODE, catalogue, Source(), lambda: dt.datetime.now(dt.UTC), 8)  # type: ignore[arg-type]
    agent = Agent(NODE, port, probes.probes(), catalogue, **kwargs)  # type: ignore[arg-type]
    return Sentinel(agent, probes, None)


@pytest.mark.parametrize(("fault", "check", "fatal"), CASES, ids=[c[0] for c in CASES])
def test_each_fault_gives_condition_event_metric_and_taint_when_fatal(
    ports, fault: str, check: str, fatal: bool
) -> None:
    port, hardware, _ = ports(f"{NODE}:{fault}")
    sentinel = _sentinel(port, hardware)
    result = sentinel.run_once()
    node = port.get_node(NODE)
    condition = node.condition(vocab.CONDITION_SENTINEL[check])
    assert condition is not None and condition.status == "True"
    assert [c.type for c in node.conditions if c.type.startswith("Dsx") and c.status == "True"] == [
        vocab.CONDITION_SENTINEL[check]
    ]
    assert node.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule") is fatal
    reasons = [e["reason"] for e in _events(port)]
    assert reasons == [vocab.CONDITION_SENTINEL[check]]
    metrics = sentinel.agent.metrics.exposition().decode()
    assert f'dsx_sentinel_unhealthy{{check="{check}"' in metrics
    assert [(e.check, e.healthy) for e in result.changed] == [(check, False)]
    # set once: a second pass with the same fault writes nothing new
    again = sentinel.run_once()
    assert again.changed == [] and again.written == 0


def test_a_healthy_reading_clears_exactly_its_own_condition(ports) -> None:
    port, hardware, _ = ports(f"{NODE}:xid=79@3;{NODE}:pcie-degraded@2")
    sentinel = _sentinel(port, hardware)
    sentinel.run_once()
    # the PCIe link retrains: GPU 2 reports a full link again; the XID stays
    with hardware.store.transaction() as fleet:
        gpu = fleet.health[NODE].gpus[2]
        fleet.health[NODE].gpus[2] = gpu.model_copy(update={"pcie_generation": 5, "pcie_width": 16})
    result = sentinel.run_once()
    assert [(e.check, e.healthy) for e in result.changed] == [("pcie", True)]
    node = port.get_node(NODE)
    assert node.condition("DsxGpuPcieDegraded").status == "False"
    assert node.condition("DsxGpuXid").status == "True"
    assert node.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    assert [e["reason"] for e in _events(port)][-1] == "DsxGpuPcieDegradedCleared"


def test_two_entities_of_one_check_each_clear_only_themselves(ports) -> None:
    port, hardware, _ = ports(f"{NODE}:pcie-degraded@2;{NODE}:pcie-degraded@4")
    sentinel = _sentinel(port, hardware)
    sentinel.run_once()
    with hardware.store.transaction() as fleet:
        gpu = fleet.health[NODE].gpus[2]
        fleet.health[NODE].gpus[2] = gpu.model_copy(update={"pcie_generation": 5, "pcie_width": 16})
    sentinel.run_once()
    condition = port.get_node(NODE).condition("DsxGpuPcieDegraded")
    assert condition.status == "True" and "GPU 4" in condition.message and "GPU 2" not in condition.message


def test_api_outage_is_survived_and_every_write_replayed_in_order(ports) -> None:
    port, hardware, emulator = ports("")
    sentinel = _sentinel(port, hardware)
    sentinel.run_once()  # healthy: nothing to write
    if emulator is not None:
        emulator.fail(10_000, 503)
    else:
        hardware.inject_api(errors=10_000)
    hardware.inject(NODE, "pcie-degraded@2")
    first = sentinel.run_once()
    hardware.inject(NODE, "xid=79@3")
    second = sentinel.run_once()
    assert not first.api_up and not second.api_up
    assert [w.kind for w in sentinel.agent.queue] == ["taint", "event", "condition", "event", "condition"]
    _heal(emulator, hardware)
    third = sentinel.run_once()
    assert third.api_up and third.queued == 0
    node = port.get_node(NODE)
    assert node.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    assert node.condition("DsxGpuPcieDegraded").status == "True"
    assert node.condition("DsxGpuXid").status == "True"
    assert [e["reason"] for e in _events(port)] == ["DsxGpuPcieDegraded", "DsxGpuXid"]


@pytest.mark.parametrize("fleet", ["kube"], indirect=True)  # 409s come from the emulated API server
def test_a_taint_that_keeps_conflicting_stays_queued_until_it_lands(ports) -> None:
    port, hardware, emulator = ports("")
    sentinel = _sentinel(port, hardware)
    sentinel.run_once()
    emulator.conflict(4)  # the fast path's taint and its replay each find the node changed, retries and all
    hardware.inject(NODE, "xid=79@3")
    first = sentinel.run_once()
    assert [w.kind for w in sentinel.agent.queue][:1] == ["taint"]
    assert not port.get_node(NODE).has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    second = sentinel.run_once()
    assert not first.api_up and second.api_up and second.queued == 0
    node = port.get_node(NODE)
    assert node.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    assert node.condition("DsxGpuXid").status == "True"


def _heal(emulator: Emulator | None, hardware: SimCluster) -> None:
    if emulator is not None:  # the API server is back: the failures still pending end
        emulator.recover()
    else:
        with hardware.store.transaction() as fleet:
            fleet.api.errors = 0


def test_a_failing_probe_becomes_an_event_about_the_probe_and_the_pass_goes_on(ports) -> None:
    port, hardware, _ = ports(f"{NODE}:xid=79@3")
    sentinel = _sentinel(port, hardware)

    def broken() -> list[object]:
        raise OSError("/dev/kmsg: permission denied")

    sentinel.agent.probes.insert(0, ("kernel-log", broken))
    result = sentinel.run_once()
    assert ("probe", "kernel-log", False) in [(e.check, e.entity, e.healthy) for e in result.changed]
    node = port.get_node(NODE)
    assert node.condition("DsxSentinelProbeFailed").status == "True"
    assert node.condition("DsxGpuXid").status == "True"


def test_debounce_and_observe_mode(tmp_path: Path) -> None:
    hardware = SimCluster(
        MemoryStore(load_fleet(f"sim:nodes=2,gpu=h100,faults={NODE}:pcie-degraded@2")), retry=FAST
    )
    sentinel = _sentinel(hardware, hardware, debounce=3)
    assert sentinel.run_once().changed == [] and sentinel.run_once().changed == []
    assert [e.check for e in sentinel.run_once().changed] == ["pcie"]
    overrides = tmp_path / "o.yaml"
    overrides.write_text("apiVersion: dsx.dev/v1alpha1\nkind: FaultOverrides\nmodes: {xid: observe}\n")
    fresh = SimCluster(MemoryStore(load_fleet(f"sim:nodes=2,gpu=h100,faults={NODE}:xid=79@3")), retry=FAST)
    observed = _sentinel(fresh, fresh, overrides=overrides)
    assert [e.check for e in observed.run_once().changed] == ["xid"]
    node = fresh.get_node(NODE)
    assert node.condition("DsxGpuXid") is None and not node.taints
    assert [e["reason"] for e in _events(fresh)] == ["DsxGpuXid"]


def test_fake_nvml_node_through_the_agent() -> None:
    devices = gpus(8)
    devices[3].lost = True
    devices[1].links[0] = False
    port = SimCluster(MemoryStore(load_fleet("sim:nodes=2,gpu=h100,workloads=false")), retry=FAST)
    fake = FakeNvml(devices)
    fake.pending_events = [(0, 79)]
    sentinel = build_sentinel(
        port, NODE, load_catalogue(), source="nvml", nvml_module=fake, sysfs="/nonexistent"
    )
    sentinel.wait(0.01)
    result = sentinel.run_once()
    assert {(e.check, e.entity) for e in result.changed} == {
        ("gpu-missing", "GPU-fake-3"),
        ("nvlink", "GPU-fake-1"),
        ("xid", "GPU-fake-0"),
    }
    node = port.get_node(NODE)
    assert node.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    assert {c.type for c in node.conditions if c.status == "True" and c.type.startswith("Dsx")} == {
        "DsxGpuMissing",
        "DsxNvlinkDegraded",
        "DsxGpuXid",
    }


def test_cli_catalog_and_agent_once(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = dsx_here(capsys, "sentinel", "catalog", "-o", "json")
    assert code == 0
    entries = json.loads(out)
    assert {
        "check": "xid",
        "code": "79",
        "severity": "fatal",
        "action": "reboot",
        "mode": "enforce",
    }.items() <= next(e for e in entries if e["code"] == "79").items()
    assert next(e for e in entries if e["check"] == "xid" and e["code"] == "*")["severity"] == "degraded"
    spec = f"sim:nodes=2,gpu=h100,faults={NODE}:xid=79@3"
    code, out, _ = dsx_here(
        capsys, "sentinel", "agent", "--cluster", spec, "--node", NODE, "--once", "-o", "json"
    )
    assert code == 1
    assert [e["code"] for e in json.loads(out)] == ["79"]


def test_the_http_server_answers_healthz_and_metrics_over_a_real_socket() -> None:
    import urllib.error
    import urllib.request

    from steps.sentinel.agent import serve

    hardware = SimCluster(MemoryStore(load_fleet(f"sim:nodes=2,gpu=h100,faults={NODE}:xid=79@3")), retry=FAST)
    sentinel = _sentinel(hardware, hardware)
    server = serve(sentinel.agent, "127.0.0.1", 0, interval=1.0)
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def get(path: str) -> tuple[int, str, str]:
        try:
            with urllib.request.urlopen(base + path, timeout=5) as answer:
                return answer.status, answer.headers["Content-Type"], answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()

    try:
        assert get("/healthz")[:1] == (200,)  # no pass due yet: alive
        sentinel.run_once()
        status, kind, body = get("/healthz")
        assert (status, body) == (200, "ok\n")
        status, kind, body = get("/metrics")
        assert status == 200 and kind.startswith("text/plain") and "version=" in kind
        (line,) = [ln for ln in body.splitlines() if ln.startswith('dsx_sentinel_unhealthy{check="xid"')]
        assert 'entity="GPU-' in line and 'severity="fatal"' in line and line.endswith(" 1.0")
        assert "dsx_sentinel_api_up 1.0" in body
        assert get("/nothing")[0] == 404
        sentinel.agent.last_pass = 0.0  # the loop stalled: the kubelet's liveness probe sees 503
        assert get("/healthz")[0::2] == (503, "stalled\n")
    finally:
        server.shutdown()
        server.server_close()

"""The agent's own safety rails on the taint: a node that opts out is observed and never tainted, and the
agents of a fleet share a budget of taints, so a fault that reads fatal everywhere at once (a bad driver
roll-out, a misread kernel log) cannot make every GPU node unschedulable. Run with one agent per node over
one simulated fleet, and over the kubernetes client speaking to the emulated API server."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import changes, connect, load_fleet, shareable
from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ClusterError
from steps.cluster.port import ClusterPort
from steps.cluster.sim import MemoryStore, SimCluster
from steps.sentinel.agent import Agent
from steps.sentinel.budget import (
    BUDGET_CONFIGMAP,
    GpuNodes,
    TaintBudget,
    TaintBudgetSettings,
    parse_daemonset,
)
from steps.sentinel.catalogue import load_catalogue
from steps.sentinel.probes import NodeProbes
from tests.cli import dsx_here
from tests.steps.sentinel.conftest import FAST

TAINT = vocab.TAINT_UNHEALTHY


def _agents(port: ClusterPort, hardware: SimCluster, nodes: list[str], **kwargs: Any) -> dict[str, Agent]:
    """One agent per node, each reading its node's hardware from the fleet and writing through ``port``."""

    class Source:
        def node_report(self, node: str) -> Any:
            return hardware.node_report(node)

    catalogue = load_catalogue()
    now = lambda: dt.datetime.now(dt.UTC)  # noqa: E731
    agents = {}
    for node in nodes:
        probes = NodeProbes(node, catalogue, Source(), now, 8)  # type: ignore[arg-type]
        agents[node] = Agent(node, port, probes.probes(), catalogue, probe_timeout=None, **kwargs)
    return agents


def _events(port: ClusterPort, node: str) -> list[dict[str, Any]]:
    found = port.list_objects("v1", "Event", namespace="default")
    return [e for e in found if e["involvedObject"]["name"] == node]


def _tainted(port: ClusterPort) -> list[str]:
    return [n.name for n in port.list_nodes() if n.has_taint(TAINT, "NoSchedule")]


def _withheld(agent: Agent, reason: str) -> float:
    value = agent.metrics.registry.get_sample_value("dsx_sentinel_taint_withheld_total", {"reason": reason})
    return value or 0.0


def _all_at_once(agents: dict[str, Agent]) -> None:
    """Every agent's pass at the same moment, on its own thread, as a fleet's agents run; then passes
    until no write waits for the API server (a budget write that kept conflicting is queued and retried)."""
    threads = [threading.Thread(target=a.run_once) for a in agents.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for _ in range(5):
        if not any(a.run_once().queued for a in agents.values()):
            return
    raise AssertionError("writes still queued after 5 passes")


def test_twenty_nodes_faulted_at_once_taint_at_most_the_budget_the_rest_say_why(fleet: Any) -> None:
    faults = ";".join(f"node-{i:02d}:xid=79@3" for i in range(20))
    port, hardware, _ = fleet(f"sim:nodes=20,gpu=h100,workloads=false,faults={faults}")
    agents = _agents(port, hardware, [f"node-{i:02d}" for i in range(20)], budget_retry_s=0)
    _all_at_once(agents)
    tainted = _tainted(port)
    assert len(tainted) == 2  # 10% of 20 GPU nodes
    status = TaintBudget(port).status()
    assert status.state == "held" and sorted(status.tainted) == tainted
    for name, agent in agents.items():
        node = port.get_node(name)
        assert node.condition(vocab.CONDITION_GPU_XID).status == "True", name
        held = [e for e in _events(port, name) if e["reason"] == "DsxTaintBudgetHeld"]
        if name in tainted:
            assert held == [] and _withheld(agent, "budget") == 0
            continue
        ((event,),) = [held]
        assert event["type"] == "Warning"
        assert BUDGET_CONFIGMAP in event["message"] and "2 nodes in its window" in event["message"]
        assert "2 of 20 GPU nodes (10%)" in event["message"]
        assert _withheld(agent, "budget") == 1
        assert [w.kind for w in agent.queue] == ["taint"] and agent.queue[0].withheld
    # asked again and again while it holds: nothing more is tainted, nothing said twice
    for agent in agents.values():
        assert agent.run_once().written == 0
    assert _tainted(port) == tainted
    # a person resets it: the withheld taints land, as many as the budget allows, and it holds again
    reset = TaintBudget(port).reset("oncall")
    assert (reset.state, reset.tainted, reset.reset_by) == ("ok", {}, "oncall")
    for agent in agents.values():
        agent.run_once()
    assert len(_tainted(port)) == 4
    again = TaintBudget(port).status()
    assert again.state == "held" and len(again.tainted) == 2 and again.reset_by == "oncall"


def test_an_opted_out_node_with_a_fatal_xid_gets_its_condition_and_no_taint(fleet: Any) -> None:
    port, hardware, _ = fleet(
        "sim:nodes=4,gpu=h100,workloads=false,faults=node-01:unmanaged;node-01:xid=79@3"
    )
    assert not port.get_node("node-01").managed
    (agent,) = _agents(port, hardware, ["node-01"]).values()
    result = agent.run_once()
    assert [(e.check, e.severity) for e in result.changed] == [("xid", "fatal")]
    node = port.get_node("node-01")
    assert node.condition(vocab.CONDITION_GPU_XID).status == "True"
    assert not node.has_taint(TAINT, "NoSchedule")
    reasons = [(e["reason"], e["type"]) for e in _events(port, "node-01")]
    assert reasons == [(vocab.CONDITION_GPU_XID, "Warning"), ("DsxTaintOptedOut", "Normal")]
    assert _withheld(agent, "opted-out") == 1
    assert port.get_state(BUDGET_CONFIGMAP) == {}  # it never asked the budget for a slot
    assert 'dsx_sentinel_unhealthy{check="xid"' in agent.metrics.exposition().decode()
    assert agent.run_once().written == 0 and not port.get_node("node-01").has_taint(TAINT, "NoSchedule")


def test_a_label_set_by_the_operator_opts_the_node_out_too(fleet: Any) -> None:
    port, hardware, _ = fleet("sim:nodes=4,gpu=h100,workloads=false,faults=node-02:ecc=2@5")
    port.set_labels("node-02", {vocab.LABEL_MANAGED: "false"})
    (agent,) = _agents(port, hardware, ["node-02"]).values()
    agent.run_once()
    node = port.get_node("node-02")
    assert node.condition("DsxGpuEcc").status == "True" and not node.taints


def test_while_the_api_server_is_away_the_taint_waits_to_ask_the_budget(fleet: Any) -> None:
    port, hardware, emulator = fleet("sim:nodes=10,gpu=h100,workloads=false")
    agents = _agents(port, hardware, ["node-03", "node-04"], budget_retry_s=0)
    hardware.inject("node-03", "xid=79@1")
    agents["node-03"].run_once()
    assert _tainted(port) == ["node-03"]  # the budget's one slot (10% of 10, at least 1)
    if emulator is not None:
        emulator.fail(10_000, 503)
    else:
        hardware.inject_api(errors=10_000)
    hardware.inject("node-04", "xid=79@1")
    away = agents["node-04"].run_once()
    assert not away.api_up and [w.kind for w in agents["node-04"].queue][:1] == ["taint"]
    if emulator is not None:
        emulator.recover()
    else:
        with hardware.store.transaction() as state:
            state.api.errors = 0
    back = agents["node-04"].run_once()
    assert back.api_up and back.queued == 0 and back.withheld == 1
    node = port.get_node("node-04")
    assert not node.has_taint(TAINT, "NoSchedule")  # the queued taint asked the budget, which held
    assert node.condition(vocab.CONDITION_GPU_XID).status == "True"
    assert [e["reason"] for e in _events(port, "node-04")] == [vocab.CONDITION_GPU_XID, "DsxTaintBudgetHeld"]


def test_a_small_fleet_still_taints_its_one_faulty_node() -> None:
    port = SimCluster(MemoryStore(load_fleet("sim:nodes=3,gpu=h100,workloads=false,faults=node-01:xid=79")))
    (agent,) = _agents(port, port, ["node-01"]).values()
    agent.run_once()
    assert _tainted(port) == ["node-01"]
    assert TaintBudget(port).status().state == "ok"


def test_a_node_already_tainted_or_in_the_window_takes_no_second_slot() -> None:
    port = SimCluster(MemoryStore(load_fleet("sim:nodes=10,gpu=h100,workloads=false")), retry=FAST)
    agents = _agents(port, port, ["node-01", "node-02"], budget_retry_s=0)
    port.add_taint("node-01", TAINT, "", "NoSchedule")  # tainted already (by remediation, by hand)
    port.inject("node-01", "xid=79")
    agents["node-01"].run_once()
    assert port.get_state(BUDGET_CONFIGMAP) == {}
    port.inject("node-02", "xid=48")
    agents["node-02"].run_once()
    assert sorted(TaintBudget(port).status().tainted) == ["node-02"]
    # remediation lifts node-02's taint; a new fatal fault within the window puts it back, same slot
    port.remove_taint("node-02", TAINT)
    port.inject("node-02", "xid=79@1")
    agents["node-02"].run_once()
    assert port.get_node("node-02").has_taint(TAINT, "NoSchedule")
    status = TaintBudget(port).status()
    assert status.state == "ok" and sorted(status.tainted) == ["node-02"]


def test_a_withheld_taint_goes_when_its_fault_clears_and_never_lands_after_a_reset() -> None:
    port = SimCluster(MemoryStore(load_fleet("sim:nodes=10,gpu=h100,workloads=false")), retry=FAST)
    agents = _agents(port, port, ["node-01", "node-02"], budget_retry_s=0)
    for name in agents:
        port.inject(name, "xid=79@2")
        agents[name].run_once()
    assert _tainted(port) == ["node-01"] and agents["node-02"].queue[0].withheld
    with port.store.transaction() as state:  # node-02's GPU reports no XID any more (a parser fixed)
        gpu = state.health["node-02"].gpus[2]
        state.health["node-02"].gpus[2] = gpu.model_copy(update={"xids": ()})
    cleared = agents["node-02"].run_once()
    assert [(e.check, e.healthy) for e in cleared.changed] == [("xid", True)]
    assert not agents["node-02"].queue
    TaintBudget(port).reset("oncall")
    agents["node-02"].run_once()
    assert _tainted(port) == ["node-01"]


def test_a_budget_that_cannot_be_read_withholds_the_taint_and_says_why() -> None:
    port = SimCluster(
        MemoryStore(load_fleet("sim:nodes=4,gpu=h100,workloads=false,forbid=get configmaps")), retry=FAST
    )
    (agent,) = _agents(port, port, ["node-01"]).values()
    port.inject("node-01", "xid=79")
    result = agent.run_once()
    node = port.get_node("node-01")
    assert not node.taints and node.condition(vocab.CONDITION_GPU_XID).status == "True"
    assert result.withheld == 1 and _withheld(agent, "budget-unreadable") == 1
    (event,) = [e for e in _events(port, "node-01") if e["reason"] == "DsxTaintBudgetUnreadable"]
    assert event["type"] == "Warning" and "forbidden" in event["message"]


def test_the_budget_counts_the_nodes_the_sentinel_daemonset_runs_on() -> None:
    port = SimCluster(MemoryStore(load_fleet("sim:nodes=4,gpu=h100,workloads=false")), retry=FAST)
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "dsx-sentinel", "namespace": "gpu-ops"},
        "spec": {
            "selector": {"matchLabels": {"app": "s"}},
            "template": {"metadata": {"labels": {"app": "s"}}},
        },
        "status": {"desiredNumberScheduled": 40},
    }
    port.create_object(daemonset)
    assert GpuNodes(port, ("gpu-ops", "dsx-sentinel"))() == 40
    assert GpuNodes(port)() == 4
    budget = TaintBudget(
        port, TaintBudgetSettings(max_share=0.05), GpuNodes(port, ("gpu-ops", "dsx-sentinel"))
    )
    assert [budget.admit(n)[0] for n in ("node-00", "node-01", "node-02")] == [True, True, False]
    assert "2 of 40 GPU nodes (5%)" in budget.status().held_reason
    missing = TaintBudget(port, gpu_nodes=GpuNodes(port, ("gpu-ops", "nope")))
    missing.reset("test")  # counted only when a slot is to be taken: not while it holds
    with pytest.raises(ClusterError, match="daemonset/gpu-ops/nope: the sentinel's DaemonSet does not exist"):
        missing.admit("node-00")
    assert parse_daemonset("gpu-ops/dsx-sentinel") == ("gpu-ops", "dsx-sentinel")


def test_the_cli_shows_a_held_budget_and_a_person_resets_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = shareable("sim:nodes=4,gpu=h100,workloads=false", tmp_path)
    budget = TaintBudget(connect(spec))
    assert budget.admit("node-00")[0] and not budget.admit("node-01")[0]
    code, out, _ = dsx_here(capsys, "sentinel", "budget", "status", "--cluster", spec, "-o", "json")
    shown = json.loads(out)
    assert code == 0 and shown["state"] == "held" and list(shown["tainted"]) == ["node-00"]
    assert "node-01 would have been node 2 tainted" in shown["held_reason"]
    code, _, err = dsx_here(capsys, "sentinel", "budget", "reset", "--by", " ", "--cluster", spec)
    assert code == 2 and "--by: name who resets the taint budget" in err
    assert TaintBudget(connect(spec)).status().state == "held"  # nothing changed
    code, out, _ = dsx_here(capsys, "sentinel", "budget", "reset", "--by", "oncall", "--cluster", spec)
    assert code == 0 and "taint budget reset by oncall at " in out
    after = TaintBudget(connect(spec)).status()
    assert (after.state, after.tainted, after.reset_by) == ("ok", {}, "oncall") and after.reset_at


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--taint-budget", "0"], "--taint-budget 0: a share of the GPU nodes, more than 0 and at most 1"),
        (["--taint-budget", "1.5"], "--taint-budget 1.5: a share of the GPU nodes"),
        (["--taint-budget-window", "soon"], "--taint-budget-window 'soon': invalid duration"),
        (["--taint-budget-window", "0s"], "--taint-budget-window '0s': the window must be longer than 0 s"),
        (["--fleet-daemonset", "dsx-sentinel"], "--fleet-daemonset 'dsx-sentinel': expected NAMESPACE/NAME"),
        (["--fabric-nics", "mlx5_*,,ib0"], "--fabric-nics 'mlx5_*,,ib0': '' is not a NIC name or glob"),
        (["--fabric-nics", "eth 0"], "--fabric-nics 'eth 0': 'eth 0' is not a NIC name or glob"),
        (
            ["--reboot-command", "systemctl 'reboot"],
            '--reboot-command "systemctl \'reboot": No closing quotation',
        ),
        (["--reboot-command", " "], "--reboot-command: no command given"),
        (
            ["--reboot-command", "systemctl reboot", "--kured-sentinel", "/run/reboot-required"],
            "--reboot-command and --kured-sentinel: a reboot goes through one of them, not both",
        ),
    ],
)
def test_bad_agent_options_exit_2_naming_them_and_change_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], said: str
) -> None:
    spec = shareable("sim:nodes=2,gpu=h100,workloads=false,faults=node-01:xid=79", tmp_path)
    code, _, err = dsx_here(
        capsys, "sentinel", "agent", "--once", "--cluster", spec, "--node", "node-01", *option
    )
    assert code == 2 and said in " ".join(err.split()), err
    node = connect(spec).get_node("node-01")
    assert not node.taints and node.condition(vocab.CONDITION_GPU_XID) is None


def test_the_agent_command_takes_the_budget_from_its_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    faults = "node-01:xid=79;node-02:xid=79;node-03:xid=79"
    spec = shareable(f"sim:nodes=4,gpu=h100,workloads=false,faults={faults}", tmp_path)
    old = changes.format_time(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10))
    connect(spec).update_state(
        BUDGET_CONFIGMAP, lambda _: {"state": "ok", "tainted": f'{{"node-00": "{old}"}}'}
    )
    args = ["sentinel", "agent", "--once", "--cluster", spec, "--taint-budget", "0.5"]
    for node in ("node-01", "node-02", "node-03"):
        code, _, _ = dsx_here(capsys, *args, "--taint-budget-window", "5m", "--node", node)
        assert code == 1
    # 50% of 4 GPU nodes: two slots; node-00's taint of 10 minutes ago is out of the 5-minute window
    assert _tainted(connect(spec)) == ["node-01", "node-02"]
    status = TaintBudget(connect(spec)).status()
    assert status.state == "held" and sorted(status.tainted) == ["node-01", "node-02"]
    assert "2 of 4 GPU nodes (50%) within 5m00s" in status.held_reason

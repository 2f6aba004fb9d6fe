"""The NIC probe watches the fabric's ports only: a management or onboard port nobody cabled is never a fault
(it would taint, quarantine, reboot and escalate a healthy node), a fabric port that was up and goes down
is. Read from a fake sysfs tree through the agent as the DaemonSet runs it, and on the simulated fleet."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import RetryPolicy, load_fleet
from steps.cluster import vocabulary as vocab
from steps.cluster.health import NicReport
from steps.cluster.sim import MemoryStore, SimCluster
from steps.errors import InputError
from steps.sentinel.catalogue import load_catalogue
from steps.sentinel.node import Sentinel, build_sentinel
from steps.sentinel.probes import NicScope, parse_fabric_nics
from tests.steps.sentinel.fake_nvml import FakeNvml, gpus

FAST = RetryPolicy(attempts=2, base_delay=0.0, max_delay=0.0, jitter=0.0)
NODE = "node-01"


class Sysfs:
    """A fake ``/sys``: eight RDMA ports, an onboard management uplink and a second onboard port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for i in range(8):
            self.ib(f"mlx5_{i}", True)
        self.eth("eno1", True)  # the management uplink
        self.eth("eno2", False)  # onboard, never cabled

    def ib(self, device: str, up: bool) -> None:
        port = self.root / "class/infiniband" / device / "ports/1"
        port.mkdir(parents=True, exist_ok=True)
        (port / "state").write_text("4: ACTIVE\n" if up else "1: DOWN\n")
        (port / "phys_state").write_text("5: LinkUp\n" if up else "3: Disabled\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")

    def eth(self, name: str, up: bool) -> None:
        iface = self.root / "class/net" / name
        (iface / "device").mkdir(parents=True, exist_ok=True)
        (iface / "operstate").write_text("up\n" if up else "down\n")
        (iface / "speed").write_text("25000\n" if up else "-1\n")
        (iface / "type").write_text("1\n")


def _agent(root: Path, fabric: tuple[str, ...] = ()) -> tuple[Sentinel, SimCluster]:
    port = SimCluster(MemoryStore(load_fleet("sim:nodes=2,gpu=h100,workloads=false")), retry=FAST)
    sentinel = build_sentinel(
        port,
        NODE,
        load_catalogue(),
        source="nvml",
        nvml_module=FakeNvml(gpus(8)),
        sysfs=str(root),
        kernel_log=None,
        fabric_nics=fabric,
    )
    return sentinel, port


def _nic(result: Any) -> list[tuple[str, bool]]:
    return [(e.entity, e.healthy) for e in result.changed if e.check == "nic"]


def _nic_condition(port: SimCluster) -> str | None:
    condition = port.get_node(NODE).condition(vocab.CONDITION_NIC_DEGRADED)
    return None if condition is None else condition.status


def test_an_uncabled_onboard_port_gives_no_nic_fault_and_no_condition(tmp_path: Path) -> None:
    Sysfs(tmp_path)
    sentinel, port = _agent(tmp_path)
    for _ in range(3):
        result = sentinel.run_once()
        assert [e for e in result.events if e.check == "nic" and not e.healthy] == []
    watched = {e.entity for e in result.events if e.check == "nic"}
    assert watched == {f"mlx5_{i}/1" for i in range(8)} | {"eno1"}  # eno2 never up: not watched
    assert _nic_condition(port) is None
    assert not port.get_node(NODE).taints


def test_a_fabric_port_that_goes_down_after_being_up_is_a_fault(tmp_path: Path) -> None:
    tree = Sysfs(tmp_path)
    sentinel, port = _agent(tmp_path)
    sentinel.run_once()
    tree.ib("mlx5_3", False)
    result = sentinel.run_once()
    ((event,),) = [[e for e in result.changed if e.check == "nic"]]
    assert (event.entity, event.code, event.severity) == ("mlx5_3/1", "port-down", "fatal")
    assert _nic_condition(port) == "True"
    assert port.get_node(NODE).has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
    tree.ib("mlx5_3", True)  # re-cabled: the fault clears
    assert _nic(sentinel.run_once()) == [("mlx5_3/1", True)]
    assert _nic_condition(port) == "False"


def test_a_port_down_from_the_start_is_a_fault_only_once_it_was_up(tmp_path: Path) -> None:
    tree = Sysfs(tmp_path)
    tree.ib("mlx5_7", False)  # not cabled yet when the agent starts
    sentinel, port = _agent(tmp_path)
    assert _nic(sentinel.run_once()) == []
    tree.ib("mlx5_7", True)
    sentinel.run_once()
    tree.ib("mlx5_7", False)
    assert _nic(sentinel.run_once()) == [("mlx5_7/1", False)]
    assert _nic_condition(port) == "True"


def test_without_a_fabric_list_an_interface_up_at_start_is_watched_and_one_up_later_is_not(
    tmp_path: Path,
) -> None:
    tree = Sysfs(tmp_path)
    sentinel, _ = _agent(tmp_path)
    sentinel.run_once()
    tree.eth("eno2", True)  # cabled after the agent started (a laptop on the service port)
    sentinel.run_once()
    tree.eth("eno2", False)
    assert _nic(sentinel.run_once()) == []
    tree.eth("eno1", False)  # the uplink that was up at start goes down
    assert _nic(sentinel.run_once()) == [("eno1", False)]


def test_with_a_fabric_list_a_port_not_listed_going_down_gives_nothing(tmp_path: Path) -> None:
    tree = Sysfs(tmp_path)
    sentinel, port = _agent(tmp_path, parse_fabric_nics("mlx5_*"))
    first = sentinel.run_once()
    assert {e.entity for e in first.events if e.check == "nic"} == {f"mlx5_{i}/1" for i in range(8)}
    tree.eth("eno1", False)
    assert _nic(sentinel.run_once()) == []
    assert _nic_condition(port) is None and not port.get_node(NODE).taints
    tree.ib("mlx5_1", False)
    assert _nic(sentinel.run_once()) == [("mlx5_1/1", False)]


def test_a_fabric_list_names_devices_ports_or_globs_of_any_kind() -> None:
    def nic(name: str, kind: str = "infiniband", up: bool = True) -> NicReport:
        return NicReport(name=name, kind=kind, up=up)

    nics = [nic("mlx5_0/1"), nic("mlx5_0/2"), nic("efa_0"), nic("ens5", "ethernet"), nic("eno1", "ethernet")]
    names = lambda scope: [n.name for n in scope.watched(nics)]  # noqa: E731
    assert names(NicScope(("mlx5_0/1", "efa*", "ens*"))) == ["mlx5_0/1", "efa_0", "ens5"]
    assert names(NicScope(("mlx5_0",))) == ["mlx5_0/1", "mlx5_0/2"]
    assert names(NicScope()) == ["mlx5_0/1", "mlx5_0/2", "efa_0", "ens5", "eno1"]
    assert parse_fabric_nics(" mlx5_*, ib0 ,mlx5_*") == ("mlx5_*", "ib0")
    with pytest.raises(InputError, match="'' is not a NIC name or glob"):
        parse_fabric_nics("mlx5_*,")


def test_on_the_simulated_fleet_an_unused_port_is_quiet_and_a_fabric_port_down_is_fatal() -> None:
    port = SimCluster(
        MemoryStore(load_fleet(f"sim:nodes=2,gpu=h100,workloads=false,faults={NODE}:nic-unused=eth1")),
        retry=FAST,
    )
    nics = {n.name: n for n in port.node_report(NODE).nics}
    assert not nics["eth1"].up and nics["eth1"].kind == "ethernet" and port.health(NODE).healthy
    sentinel = build_sentinel(port, NODE, load_catalogue(), clock=lambda: dt.datetime.now(dt.UTC))
    first = sentinel.run_once()
    assert [e for e in first.events if e.check == "nic" and not e.healthy] == []
    assert "eth1" not in {e.entity for e in first.events}
    assert _nic_condition(port) is None
    port.inject(NODE, "nic-down=mlx5_3")
    assert _nic(sentinel.run_once()) == [("mlx5_3/1", False)]
    assert _nic_condition(port) == "True"


def test_a_repair_brings_the_cabled_ports_back_and_leaves_the_uncabled_one_down() -> None:
    faults = f"{NODE}:nic-unused=eth1;{NODE}:nic-down=mlx5_2"
    spec = f"sim:nodes=2,gpu=h100,workloads=false,repair-delay=0,faults={faults}"
    port = SimCluster(MemoryStore(load_fleet(spec)), retry=FAST)
    boot = port.get_node(NODE).node_info.boot_id
    port.set_annotations(NODE, {vocab.ANNOTATION_REPAIR_REQUESTED_AT: "2026-01-01T00:00:00Z"})
    assert port.get_node(NODE).node_info.boot_id != boot
    nics = {n.name: n for n in port.node_report(NODE).nics}
    assert nics["mlx5_2/1"].up and nics["mlx5_2/1"].state == "ACTIVE"
    assert not nics["eth1"].up and nics["eth1"].state == "down"


def test_nic_faults_of_the_simulated_fleet_are_checked() -> None:
    with pytest.raises(InputError, match="node already has port mlx5_0/1; nic-unused adds a port"):
        load_fleet(f"sim:nodes=2,gpu=h100,faults={NODE}:nic-unused=mlx5_0")
    with pytest.raises(InputError, match="nic-unused needs an interface name"):
        load_fleet(f"sim:nodes=2,gpu=h100,faults={NODE}:nic-unused=")
    with pytest.raises(InputError, match="unmanaged takes no value"):
        load_fleet(f"sim:nodes=2,gpu=h100,faults={NODE}:unmanaged=1")

"""Faults that can be injected into a simulated node, written as in ``sim:faults=node-17:slow-nic``.

========================  ==============================================================================
``slow-nic[=GBPS]``       the node's scale-out links give GBPS (default a quarter of nominal)
``flaky-nic=P``           a collective spanning the node and others fails with probability P (0 < P <= 1)
``hang``                  a collective spanning the node and others never completes
``slow-nvlink[=GBPS@I]``  NVLink of GPU I (default every GPU) gives GBPS (default a quarter of nominal)
``xid=N[@I]``             GPU I (default 0) reported XID N
``failing-gpu[=I]``       GPU I (default 0) is unhealthy: the device plugin stops offering it
``ecc=N[@I]``             GPU I (default 0) has N uncorrectable ECC errors
``not-ready``             the kubelet stops posting ready status (Ready condition False; the node
                          lifecycle controller's not-ready taints, NoSchedule and NoExecute)
``api-errors=N``          the next N API requests about this node fail with HTTP 500
``reading:NAME=VALUE``    any further figure another part models (kept in ``health.readings``)
``pcie-degraded[@I]``     GPU I (default 0) runs its PCIe link a generation lower on half its lanes
``nvlink-down[@I]``       every NVLink of GPU I (default 0) is down (inactive, no NVLink bandwidth)
``nic-down=NAME``         network port NAME (``mlx5_3/1``, or ``mlx5_3`` for its first port) is down; its
                          GPUs share another rail's port, so a ring through the node runs at half rate
``slow-rail:NAME=GBPS``   InfiniBand port NAME (``mlx5_3``) runs at GBPS: the slowest rail caps a ring
                          through the node (eight rails at its rate), though the node's other ports are fine
``slow-gpu[=F][@I]``      GPU I (default 0) delivers F (default 0.5) of its compute, with nothing NVML
                          reports: a training run's step time shows it, an all-reduce never does
``nic-unused=NAME``       the node has one more port, Ethernet NAME (``eth1``), that is down and never was
                          up: an onboard port nobody cabled (a repair leaves it down too)
``thermal[@I]``           GPU I (default 0) runs above its slowdown temperature, thermally throttled
``driver=VERSION``        the node runs driver VERSION: GPU Feature Discovery's driver labels (both
                          forms) say so, and its CUDA labels give that driver branch's CUDA version
``kernel=VERSION``        the kubelet reports kernel VERSION (``status.nodeInfo.kernelVersion``)
``kubelet=VERSION``       the node's kubelet is VERSION (``v1.30.8``)
``os=IMAGE``              the node's OS image (``Ubuntu 20.04.6 LTS``)
``runtime=VERSION``       the node's container runtime (``containerd://1.7.20``)
``busy``                  a workload holds every GPU of the node: Job pod ``busy-NODE`` (namespace
                          ``research``), so no test pod that asks for its GPUs can be scheduled there
``unmanaged``             the operator opted the node out: it carries ``dsx.dev/managed=false``, so dsx
                          observes it (the sentinel's conditions, Events, metrics) and never acts on it
========================  ==============================================================================

The NIC faults (``slow-nic``, ``slow-rail``, ``flaky-nic``, ``hang``) show only in tests that span two or
more nodes:
traffic inside a node never crosses its NICs, so the node's own test passes. The others show in the node's
own test too.

The five before ``busy`` are software-version skews, as a patched or a replaced node shows them: they change
only what the node reports (its labels and ``status.nodeInfo``), not its physical health, so they are not
listed in ``health.faults``; nor are ``busy``, a healthy node doing its job, ``unmanaged``, a label, and
``nic-unused``, a port a healthy node does not use.
"""

from __future__ import annotations

import datetime as dt
import re

from steps.cluster import vocabulary as vocab
from steps.cluster.changes import format_time
from steps.cluster.health import NicReport
from steps.cluster.port import GPU_RESOURCE, Condition, Node, Pod
from steps.cluster.sim.gpus import cuda_for_driver, driver_labels
from steps.cluster.sim.model import Fleet, NodeHealth, owner_key
from steps.cluster.sim.repair import not_ready_taints
from steps.errors import InputError

__all__ = ["FAULT_KINDS", "VERSION_FAULTS", "apply_fault"]

VERSION_FAULTS = ("driver", "kernel", "kubelet", "os", "runtime")
"""Faults that set a software version the node reports (``KIND=VERSION``)."""

FAULT_KINDS = (
    "slow-nic",
    "slow-nvlink",
    "xid",
    "failing-gpu",
    "ecc",
    "not-ready",
    "api-errors",
    "reading",
    "pcie-degraded",
    "nvlink-down",
    "nic-down",
    "slow-rail",
    "slow-gpu",
    "thermal",
    *VERSION_FAULTS,
    "flaky-nic",
    "hang",
    "busy",
    "nic-unused",
    "unmanaged",
)

_NODE_INFO_FIELDS = {
    "kernel": "kernel_version",
    "kubelet": "kubelet_version",
    "os": "os_image",
    "runtime": "container_runtime_version",
}

_FAULT = re.compile(
    r"^(?P<kind>[a-z-]+)(?::(?P<name>[A-Za-z0-9_.-]+))?(?:=(?P<value>\d+(?:\.\d*)?|\.\d+))?(?:@(?P<gpu>\d+))?$"
)


def _gpu(health: NodeHealth, index: int, node: str, fault: str) -> int:
    if not 0 <= index < len(health.gpus):
        raise InputError(f"fault {fault!r} on {node}: the node has GPUs 0..{len(health.gpus) - 1}")
    return index


def _update_gpu(health: NodeHealth, index: int, **changes: object) -> None:
    """Replace GPU ``index``'s report by one with ``changes`` (reports are frozen)."""
    health.gpus[index] = health.gpus[index].model_copy(update=changes)


def _set_version(fleet: Fleet, state: Node, kind: str, value: str, fault: str) -> None:
    """Apply a :data:`VERSION_FAULTS` fault: the node reports ``value``."""
    if not value:
        raise InputError(f"fault {fault!r} on {state.name}: {kind} needs a value ({kind}=VERSION)")
    if kind == "driver":
        if state.labels.get("nvidia.com/gpu.present") != "true":
            raise InputError(f"fault {fault!r} on {state.name}: the node has no GPUs, so no driver labels")
        try:
            cuda = cuda_for_driver(value)
        except InputError as exc:
            raise InputError(f"fault {fault!r} on {state.name}: {exc}") from None
        state.labels.update(driver_labels(value, cuda))
    else:
        setattr(state.node_info, _NODE_INFO_FIELDS[kind], value)
    state.resource_version = fleet.next_revision()


def _nic_fault(health: NodeHealth, kind: str, value: str | None, node: str, fault: str) -> None:
    """Apply ``flaky-nic=P`` or ``hang``: what multi-node collectives through the node's links do."""
    if kind == "hang":
        if value is not None:
            raise InputError(f"fault {fault!r} on {node}: hang takes no value")
        health.link_hangs = True
        return
    rate = float(str(value))
    if not 0.0 < rate <= 1.0:
        raise InputError(f"fault {fault!r} on {node}: flaky-nic=P needs a probability 0 < P <= 1")
    health.link_failure_rate = rate


def _nic_down(fleet: Fleet, node: str, name: str, fault: str) -> None:
    """Apply ``nic-down=NAME``: the port goes down, as sysfs then shows it."""
    health = fleet.health[node]
    names = [n.name for n in health.nics]
    matches = [i for i, nic in enumerate(health.nics) if name in (nic.name, nic.name.partition("/")[0])]
    if not name or not matches:
        raise InputError(
            f"fault {fault!r} on {node}: no such port; the node has {', '.join(names) or 'none'}"
        )
    index = matches[0]
    down = "DOWN" if health.nics[index].kind == "infiniband" else "down"
    phys = "Disabled" if health.nics[index].kind == "infiniband" else ""
    health.nics[index] = health.nics[index].model_copy(
        update={"up": False, "state": down, "phys_state": phys, "speed_gbps": None}
    )
    fleet.nodes[node].resource_version = fleet.next_revision()
    health.faults.append(fault.strip())


def _slow_rail(health: NodeHealth, name: str, gbps: float, node: str, fault: str) -> None:
    """Apply ``slow-rail:NAME=GBPS``: one InfiniBand port runs at GBPS (it is up; sysfs shows its rate)."""
    rails = [i for i, nic in enumerate(health.nics) if nic.kind == "infiniband"]
    matches = [i for i in rails if name in (health.nics[i].name, health.nics[i].name.partition("/")[0])]
    if not matches:
        names = ", ".join(health.nics[i].name for i in rails) or "none"
        raise InputError(f"fault {fault!r} on {node}: no InfiniBand port {name!r}; the node has {names}")
    if gbps <= 0:
        raise InputError(
            f"fault {fault!r} on {node}: slow-rail needs GBPS > 0 (for a port down, use nic-down)"
        )
    health.nics[matches[0]] = health.nics[matches[0]].model_copy(update={"speed_gbps": gbps})


def _nic_unused(fleet: Fleet, node: str, name: str, fault: str) -> None:
    """Apply ``nic-unused=NAME``: one more Ethernet port, down since the node booted (never cabled)."""
    health = fleet.health[node]
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise InputError(f"fault {fault!r} on {node}: nic-unused needs an interface name (nic-unused=eth1)")
    taken = [n.name for n in health.nics if name in (n.name, n.name.partition("/")[0])]
    if taken:
        raise InputError(
            f"fault {fault!r} on {node}: the node already has port {taken[0]}; nic-unused adds a port "
            "that was never cabled (to take a port down, use nic-down)"
        )
    health.nics.append(NicReport(name=name, kind="ethernet", up=False, state="down"))
    health.uncabled.append(name)
    fleet.nodes[node].resource_version = fleet.next_revision()


def _hardware_fault(health: NodeHealth, kind: str, index: int, node: str, fault: str) -> None:
    """Apply ``pcie-degraded``, ``nvlink-down`` or ``thermal`` to GPU ``index``."""
    gpu = health.gpus[_gpu(health, index, node, fault)]
    if kind == "pcie-degraded":
        top_gen, top_width = gpu.pcie_max_generation or 5, gpu.pcie_max_width or 16
        _update_gpu(
            health,
            index,
            pcie_max_generation=top_gen,
            pcie_max_width=top_width,
            pcie_generation=max(1, top_gen - 1),
            pcie_width=max(1, top_width // 2),
        )
    elif kind == "nvlink-down":
        if not gpu.nvlinks:
            raise InputError(f"fault {fault!r} on {node}: GPU {index} has no NVLink")
        links = tuple(link.model_copy(update={"active": False}) for link in gpu.nvlinks)
        _update_gpu(health, index, nvlinks=links, nvlink_gbps=0.0)
    else:  # thermal
        slowdown = gpu.slowdown_temperature_c or 87.0
        reasons = tuple(sorted({*gpu.throttle_reasons, "hw-thermal"}))
        _update_gpu(health, index, temperature_c=slowdown + 3.0, throttle_reasons=reasons)


def _busy(fleet: Fleet, node: Node) -> None:
    """A training Job's pod holding every GPU the node offers."""
    pod = Pod(
        name=f"busy-{node.name}",
        namespace="research",
        uid=fleet.new_uid(),
        node=node.name,
        owner_kind="Job",
        owner_name=f"busy-{node.name}",
        labels={"job-name": f"busy-{node.name}"},
        gpus=node.gpu_count,
    )
    fleet.pods[pod.ref] = pod
    fleet.owner_next[owner_key(pod)] = 1


def apply_fault(fleet: Fleet, node: str, fault: str) -> None:
    """Inject one fault into ``node``.

    Raises:
        InputError: the node does not exist, or the fault is not one of :data:`FAULT_KINDS` or is malformed.
    """
    if node not in fleet.nodes:
        raise InputError(f"fault {fault!r}: node {node!r} is not in the fleet")
    if _apply_named(fleet, node, fault):
        return
    kind, value, name, gpu = _read_fault(node, fault)
    health = fleet.health[node]
    state = fleet.nodes[node]
    if kind in ("flaky-nic", "hang"):
        _nic_fault(health, kind, value, node, fault)
    elif kind == "slow-nic":
        _slow_nic(health, value, node, fault)
    elif kind == "slow-nvlink":
        targets = [_gpu(health, gpu, node, fault)] if gpu is not None else range(len(health.gpus))
        for index in targets:
            nominal = health.gpus[index].nvlink_gbps
            _update_gpu(health, index, nvlink_gbps=float(value) if value else nominal / 4)
    elif kind == "xid":
        index = _gpu(health, gpu or 0, node, fault)
        _update_gpu(health, index, xids=(*health.gpus[index].xids, int(float(str(value)))))
    elif kind == "ecc":
        index = _gpu(health, gpu or 0, node, fault)
        errors = health.gpus[index].ecc_uncorrectable + int(float(str(value)))
        _update_gpu(health, index, ecc_uncorrectable=errors)
    elif kind == "failing-gpu":
        index = _gpu(health, int(float(value)) if value else (gpu or 0), node, fault)
        if health.gpus[index].healthy:
            _update_gpu(health, index, healthy=False)
            offered = int(state.allocatable.get(GPU_RESOURCE, "0"))
            state.allocatable[GPU_RESOURCE] = str(max(0, offered - 1))
    elif kind == "not-ready":
        health.ready = False
        _not_ready(state)
    elif kind in ("pcie-degraded", "nvlink-down", "thermal"):
        if value is not None:
            raise InputError(f"fault {fault!r} on {node}: {kind} takes a GPU, not a value ({kind}@I)")
        _hardware_fault(health, kind, gpu or 0, node, fault)
    elif kind == "api-errors":
        fleet.api.node_errors[node] = fleet.api.node_errors.get(node, 0) + int(float(str(value)))
    elif kind == "slow-rail":
        _slow_rail(health, str(name), float(str(value)), node, fault)
    elif kind == "slow-gpu":
        _slow_gpu(health, value, gpu, node, fault)
    else:  # reading
        health.readings[str(name)] = float(str(value))
    if kind != "api-errors":
        state.resource_version = fleet.next_revision()
    health.faults.append(fault.strip())


def _apply_named(fleet: Fleet, node: str, fault: str) -> bool:
    """Apply the faults named by a word and a free-form value (a version, a NIC, ``busy``, ``unmanaged``);
    whether ``fault`` was one."""
    kind, sep, version = fault.strip().partition("=")
    if kind in VERSION_FAULTS:
        _set_version(fleet, fleet.nodes[node], kind, version.strip() if sep else "", fault)
    elif kind == "nic-down":
        _nic_down(fleet, node, version.strip(), fault)
    elif kind == "nic-unused":
        _nic_unused(fleet, node, version.strip(), fault)
    elif fault.strip() == "busy":
        _busy(fleet, fleet.nodes[node])
    elif kind.strip() == "unmanaged":
        if sep:
            raise InputError(f"fault {fault!r} on {node}: unmanaged takes no value")
        state = fleet.nodes[node]
        state.labels[vocab.LABEL_MANAGED] = vocab.MANAGED_FALSE
        state.resource_version = fleet.next_revision()
    else:
        return False
    return True


def _read_fault(node: str, fault: str) -> tuple[str, str | None, str | None, int | None]:
    """``KIND[:NAME][=NUMBER][@GPU]`` read and checked: (kind, value, name, GPU index)."""
    kind = fault.strip().partition("=")[0]
    match = _FAULT.match(fault.strip())
    if not match and kind.partition(":")[0].partition("@")[0] in FAULT_KINDS:
        raise InputError(
            f"fault {fault!r} on {node}: cannot read it as KIND[:NAME][=NUMBER][@GPU] "
            "(a value is a number such as 2240 or 0.25; see sim docs)"
        )
    kind = match.group("kind") if match else ""
    if not match or kind not in FAULT_KINDS:
        raise InputError(
            f"fault {fault!r} on {node}: expected one of {', '.join(FAULT_KINDS)} (see sim docs)"
        )
    value, name = match.group("value"), match.group("name")
    gpu = int(match.group("gpu")) if match.group("gpu") else None
    needs_value = kind in ("xid", "ecc", "api-errors", "reading", "flaky-nic", "slow-rail")
    if needs_value and value is None:
        raise InputError(f"fault {fault!r} on {node}: {kind} needs a value ({kind}=N)")
    if (kind in ("reading", "slow-rail")) != (name is not None):
        raise InputError(
            f"fault {fault!r} on {node}: only reading and slow-rail take a name (reading:NAME=VALUE, "
            "slow-rail:PORT=GBPS)"
        )
    return kind, value, name, gpu


def _slow_nic(health: NodeHealth, value: str | None, node: str, fault: str) -> None:
    if value is not None and float(value) <= 0:
        raise InputError(
            f"fault {fault!r} on {node}: slow-nic=GBPS needs GBPS > 0 (for links that pass nothing, use hang)"
        )
    health.link_gbps = float(value) if value else health.nominal_link_gbps / 4


def _slow_gpu(health: NodeHealth, value: str | None, gpu: int | None, node: str, fault: str) -> None:
    share = float(value) if value is not None else 0.5
    if not 0.0 < share < 1.0:
        raise InputError(f"fault {fault!r} on {node}: slow-gpu=F needs a share 0 < F < 1 (0.5: half speed)")
    _update_gpu(health, _gpu(health, gpu or 0, node, fault), compute_share=share)


def _not_ready(state: Node) -> None:
    """The kubelet reports the node not ready (its runtime down): Ready False since now, unless it already
    was, and the node lifecycle controller's not-ready taints."""
    now = format_time(dt.datetime.now(dt.UTC))
    state.conditions = [
        Condition(
            type="Ready",
            status="False",
            reason="KubeletNotReady",
            message="container runtime is down",
            last_transition_time=c.last_transition_time if c.status == "False" else now,
            last_heartbeat_time=now,
        )
        if c.type == "Ready"
        else c
        for c in state.conditions
    ]
    state.taints = not_ready_taints(state.taints, ready=False)

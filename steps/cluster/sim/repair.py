"""The simulated repair system: a node whose repair was requested reboots after a delay.

Remediation asks for a repair by writing ``dsx.dev/repair-requested-at`` on the node. The simulated fleet
answers as a provider's repair service would, by the fleet's ``repair`` key:

- ``ok`` (default): after ``repair-delay`` seconds the node reboots (a new ``status.nodeInfo.bootID``,
  ``Ready``), its hardware is healthy again (every fault's effect gone, GPUs offered again) and the
  sentinel's conditions read ``False`` (a fresh agent finds nothing);
- ``fail``: the node reboots and looks repaired (new boot id, Ready, conditions cleared), but GPU 0
  stays broken (the device plugin stops offering it), so recertification fails;
- ``never``: nothing happens; the node keeps its boot id.

A real node comes back in stages, and so does this one when the fleet says so: the new boot id at once,
``Ready`` ``reboot-ready`` seconds later (``NotReady`` until then), and the sentinel's conditions cleared
``reboot-clear`` seconds after that (the agent's first reading of the new boot; until then they say what
they said before the reboot). Both default to 0: everything lands in the reboot's one write.

Each stage happens on the first read of the fleet after it is due, so it works across the processes that
share a ``state:`` fleet, with the wall clock as the time.
"""

from __future__ import annotations

import datetime as dt
import uuid

from steps.cluster import vocabulary as vocab
from steps.cluster.changes import format_time
from steps.cluster.health import GpuReport, GpuResetError, NvlinkReport
from steps.cluster.port import GPU_RESOURCE, Node, Taint
from steps.cluster.sim.model import Fleet

__all__ = [
    "NOT_READY_TAINT",
    "REPAIR_MODES",
    "boot_id",
    "due",
    "healed",
    "holding_gpus",
    "not_ready_taints",
    "reboot_due",
    "reset_gpu",
    "schedule",
    "settle",
]

REPAIR_MODES = ("ok", "fail", "never")


def boot_id(node: str, previous: str = "") -> str:
    """The boot id of ``node``'s next boot (deterministic: derived from the node and the last boot)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"https://dsx.dev/sim/boot/{node}/{previous}"))


def schedule(fleet: Fleet, before: Node | None, after: Node, now: float) -> None:
    """Note a repair when a write adds or changes the node's repair request (never for ``repair=never``)."""
    wanted = after.annotations.get(vocab.ANNOTATION_REPAIR_REQUESTED_AT, "")
    had = before.annotations.get(vocab.ANNOTATION_REPAIR_REQUESTED_AT, "") if before else ""
    if wanted and wanted != had and fleet.repair != "never":
        fleet.repairs_due[after.name] = now + fleet.repair_delay_s


def due(fleet: Fleet, now: float) -> bool:
    """Whether a reboot, or a later stage of one, is due to happen."""
    return any(
        at <= now for stage in (fleet.repairs_due, fleet.ready_due, fleet.clear_due) for at in stage.values()
    )


def settle(fleet: Fleet, now: float) -> list[str]:
    """Every stage that is due: reboots, then Ready, then the cleared conditions; the nodes rebooted."""
    rebooted = reboot_due(fleet, now)
    for stage, apply in ((fleet.ready_due, _ready), (fleet.clear_due, _clear)):
        for name, at in sorted(stage.items()):
            if at <= now:
                del stage[name]
                if name in fleet.nodes:
                    node = apply(fleet.nodes[name], now)
                    fleet.nodes[name] = node.model_copy(update={"resource_version": fleet.next_revision()})
    return rebooted


def _stamp(now: float) -> str:
    return format_time(dt.datetime.fromtimestamp(now, dt.UTC))


NOT_READY_TAINT = "node.kubernetes.io/not-ready"
"""The taint Kubernetes' node lifecycle controller puts on a node whose Ready condition is False, with both
effects (``NoSchedule`` by condition, ``NoExecute`` for taint-based eviction), and takes off once it is
True."""


def not_ready_taints(taints: list[Taint], ready: bool) -> list[Taint]:
    """``taints`` with the node lifecycle controller's not-ready taints on (``ready`` False) or off."""
    kept = [t for t in taints if t.key != NOT_READY_TAINT]
    if ready:
        return kept
    return [
        *kept,
        Taint(key=NOT_READY_TAINT, effect="NoSchedule"),
        Taint(key=NOT_READY_TAINT, effect="NoExecute"),
    ]


def _ready(node: Node, now: float, status: bool = True) -> Node:
    """The kubelet's Ready condition, True (or False: the node is still starting), with the taints the
    node lifecycle controller sets by it."""
    wanted = "True" if status else "False"
    conditions = [
        c.model_copy(
            update={
                "status": wanted,
                "reason": "KubeletReady" if status else "KubeletNotReady",
                "message": "kubelet is posting ready status"
                if status
                else "container runtime status check may not have completed yet",
                "last_heartbeat_time": _stamp(now),
                "last_transition_time": c.last_transition_time if c.status == wanted else _stamp(now),
            }
        )
        if c.type == "Ready"
        else c
        for c in node.conditions
    ]
    return node.model_copy(update={"conditions": conditions, "taints": not_ready_taints(node.taints, status)})


def _clear(node: Node, now: float) -> Node:
    """The sentinel's first reading of the new boot: its True conditions written False."""
    sentinel = set(vocab.CONDITION_SENTINEL.values())
    conditions = [
        c.model_copy(
            update={
                "status": "False",
                "reason": "Repaired",
                "message": "healthy after the repair",
                "last_heartbeat_time": _stamp(now),
                "last_transition_time": _stamp(now),
            }
        )
        if c.type in sentinel and c.status == "True"
        else c
        for c in node.conditions
    ]
    return node.model_copy(update={"conditions": conditions})


def healed(gpu: GpuReport) -> GpuReport:
    """``gpu`` as a successful repair leaves it: healthy, no XID, error or throttle, at its full links."""
    return gpu.model_copy(
        update={
            "healthy": True,
            "xids": (),
            "ecc_uncorrectable": 0,
            "nvlink_gbps": gpu.nominal_nvlink_gbps,
            "retired_pages_pending": False,
            "remap_pending": False,
            "throttle_reasons": (),
            "temperature_c": 42.0,
            "pcie_generation": gpu.pcie_max_generation,
            "pcie_width": gpu.pcie_max_width,
            "nvlinks": tuple(NvlinkReport(link=link.link) for link in gpu.nvlinks),
            "reset_required": False,
        }
    )


_GPU_FAULTS = ("xid", "ecc", "failing-gpu", "pcie-degraded", "nvlink-down", "thermal", "slow-nvlink")
"""The fault kinds that are about one GPU (``KIND=VALUE@I``; GPU 0 without ``@I``)."""


def _about_gpu(fault: str, index: int) -> bool:
    kind, _, rest = fault.partition("@")
    name = kind.split("=", 1)[0].split(":", 1)[0]
    if name not in _GPU_FAULTS:
        return False
    return int(rest) == index if rest.isdigit() else index == 0 and name != "slow-nvlink"


def reset_gpu(fleet: Fleet, node: str, gpu_uuid: str) -> str:
    """Reset the GPU ``gpu_uuid`` of ``node`` as the driver's reset would leave it: what a reset clears is
    gone (its XIDs, volatile errors, a pending remap, a stuck link) and its faults leave the node's list;
    the node keeps its boot. What the reset says. Refused as the driver refuses it: for a GPU that is lost
    (fallen off the bus: the reset cannot reach it, a reboot must) and while a pod holds GPUs on the node.

    Raises:
        GpuResetError: no such GPU on the node, or the reset refused.
    """
    health = fleet.health[node]
    position = next((i for i, g in enumerate(health.gpus) if g.uuid == gpu_uuid), None)
    if position is None:
        raise GpuResetError(f"{node} has no GPU {gpu_uuid}")
    gpu = health.gpus[position]
    if not gpu.healthy:
        raise GpuResetError(f"GPU {gpu.index} ({gpu_uuid}) is lost: a reset cannot reach it")
    holders = holding_gpus(fleet, node)
    if holders:
        raise GpuResetError(f"GPU {gpu.index} ({gpu_uuid}) is in use by {', '.join(holders)}")
    health.gpus[position] = healed(gpu)
    health.faults = [f for f in health.faults if not _about_gpu(f, gpu.index)]
    fleet.nodes[node] = fleet.nodes[node].model_copy(update={"resource_version": fleet.next_revision()})
    return f"GPU {gpu.index} ({gpu_uuid}) was reset"


def holding_gpus(fleet: Fleet, node: str) -> list[str]:
    """The pods on ``node`` that hold GPUs (``pod NAMESPACE/NAME``): which of them holds which GPU the
    fleet does not say, so each holds every one."""
    return [f"pod {p.ref}" for _, p in sorted(fleet.pods.items()) if p.node == node and p.holds_gpus]


def reboot_due(fleet: Fleet, now: float) -> list[str]:
    """Reboot every node whose repair is due; the nodes rebooted."""
    done = []
    for name, at in sorted(fleet.repairs_due.items()):
        if at > now or name not in fleet.nodes:
            continue
        del fleet.repairs_due[name]
        node, health = fleet.nodes[name], fleet.health[name]
        info = node.node_info.model_copy(update={"boot_id": boot_id(name, node.node_info.boot_id)})
        allocatable = dict(node.allocatable)
        health.ready = True
        if fleet.repair == "ok":
            health.gpus = [healed(g) for g in health.gpus]
            health.nics = [  # every port cabled comes back up; one never cabled stays down
                n
                if n.name in health.uncabled
                else n.model_copy(
                    update={"up": True, "state": "ACTIVE", "phys_state": "LinkUp"}
                    if n.kind == "infiniband"
                    else {"up": True, "state": "up"}
                )
                for n in health.nics
            ]
            health.link_gbps = health.nominal_link_gbps
            health.link_failure_rate, health.link_hangs = 0.0, False
            health.faults = []
            if GPU_RESOURCE in node.capacity:
                allocatable[GPU_RESOURCE] = node.capacity[GPU_RESOURCE]
        elif health.gpus:
            health.gpus[0] = health.gpus[0].model_copy(update={"healthy": False})
            offered = len([g for g in health.gpus if g.healthy])
            allocatable[GPU_RESOURCE] = str(offered)
            if "failing-gpu" not in health.faults:
                health.faults.append("failing-gpu")
        rebooted = node.model_copy(update={"node_info": info, "allocatable": allocatable})
        rebooted = _ready(rebooted, now, status=fleet.reboot_ready_s <= 0)
        if fleet.reboot_ready_s > 0:
            fleet.ready_due[name] = now + fleet.reboot_ready_s
        clear_at = now + fleet.reboot_ready_s + fleet.reboot_clear_s
        if clear_at > now:
            fleet.clear_due[name] = clear_at
        else:
            rebooted = _clear(rebooted, now)
        fleet.nodes[name] = rebooted.model_copy(update={"resource_version": fleet.next_revision()})
        done.append(name)
    return done

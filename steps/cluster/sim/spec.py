"""What a simulated fleet looks like: the short ``sim:`` spec, the YAML file form, and the build.

Short spec (``--cluster sim:...``), comma-separated ``key=value``:

``nodes=64,gpu=h100,racks=8,blocks=2,faults=node-17:slow-nic;node-40:xid=79,api-errors=3``

Keys (``-`` and ``_`` are the same): ``nodes``, ``gpu`` (a100, h100, h200, b200, gb200),
``gpus`` (per node, default the model's count), ``racks``, ``blocks``, ``prefix`` (``node-``),
``width`` (digits of the node number), ``workloads`` (true/false: the sample pods and budgets),
``kubelet``, ``os``, ``kernel``, ``runtime``, ``driver`` (every GPU node's driver, default the GPU
model's; the CUDA labels follow its branch), ``faults`` (``NODE:FAULT`` separated by ``;``, see
:mod:`steps.cluster.sim.faults`; ``node-03:driver=570.124.06`` puts one node on another driver,
``node-01:unmanaged`` opts one out with ``dsx.dev/managed=false``, ``node-01:nic-unused=eth1`` gives it an
onboard port nobody cabled),
``cordoned`` (nodes cordoned before dsx came, ``;``-separated), ``certified`` (the nodes with GPUs an
earlier certification passed, labelled ``dsx.dev/certification=passed``: ``all``, the default, as on a
fleet dsx has run on; ``none``; or node names, ``;``-separated), ``releases`` (deployed Helm releases,
``[NAMESPACE/]NAME@VERSION`` separated by ``;``, see :mod:`steps.cluster.sim.helm`), ``api-errors``,
``api-conflicts``, ``api-latency-ms``, ``repair`` (how the simulated repair system answers a
repair request: ``ok``, ``fail`` or ``never``, see :mod:`steps.cluster.sim.repair`), ``repair-delay``
(seconds from the request to the reboot, default 2), ``reboot-ready`` and ``reboot-clear`` (after the
reboot's new boot id, how long until ``Ready`` and then until the sentinel's conditions clear: ``20s``,
``40s``; default 0, all in one write), ``blocking-pdb`` (true: the sample gateway's budget
allows no eviction, see below), ``forbid`` (``VERB RESOURCE`` pairs,
``;``-separated, e.g. ``patch nodes;create pods/eviction``), ``noise`` (multiplicative measurement noise
of modelled group tests, ``0.03`` for 3%), ``spurious`` (the probability that a modelled group test no fault
touches fails anyway, ``0.005`` for 0.5%), ``switches`` (faulty leaf switches, ``RACK:FAULT`` separated by
``;``: ``rack-03:slow=0.5`` forwards at half rate, ``rack-05:flaky=0.3`` fails three tests in ten,
``rack-06:hang`` never completes one; every test holding a node of that rack feels it, while each node's
own links report nothing amiss) and ``seed`` (seeds every random draw of those tests, so a run repeats
exactly; see :mod:`steps.cluster.fabric`).

The YAML form holds the same keys; ``faults`` may also be a mapping of node to a list of faults, and
``releases`` a list of releases, each a mapping (with ``chart``, ``status``, ``images``...) or the
short form. A short spec may start with a fleet file and change some of its keys:
``sim:fleet.yaml,faults=node-03:driver=570.124.06`` is that fleet with one node on an older driver.

Nodes are named ``PREFIX`` + the zero-padded number; node ``i`` of ``n`` sits in rack
``i * racks // n`` (label ``topology.dsx.dev/rack=rack-RR``) and racks are grouped evenly into blocks
(``topology.dsx.dev/block=block-BB``).

Sample workloads (``workloads=true``): DaemonSets ``nvidia-device-plugin-daemonset`` and
``nvidia-dcgm-exporter`` (namespace ``gpu-operator``) on every node; ReplicaSet ``inference-5d8f7c``
(3 pods, namespace ``serving``, budget ``maxUnavailable: 1``); ReplicaSet ``gateway-7f6d5b`` (2 pods,
budget ``minAvailable: 1``: a drain evicts one at a time, each replaced on another node before the
next may go; with ``blocking-pdb=true`` the budget is ``minAvailable: 2``, which no eviction can ever
satisfy, as a drain meets it when a budget asks for every replica); Job ``pretrain-llama`` (4 pods,
namespace ``research``); a bare pod ``debug-shell`` (namespace ``default``) on the last node, which a
drain refuses to evict unless its policy forces (nothing would make it again).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from steps.cluster import vocabulary as vocab
from steps.cluster.fabric import FabricSettings, SwitchFault
from steps.cluster.health import GpuReport
from steps.cluster.port import GPU_RESOURCE, Condition, Node, NodeInfo, Pod
from steps.cluster.sim.faults import apply_fault
from steps.cluster.sim.gpus import GPU_MODELS, GpuModel, cuda_for_driver, gpu_model
from steps.cluster.sim.hardware import gpu_hardware, node_nics
from steps.cluster.sim.helm import Release, install_releases
from steps.cluster.sim.model import Fleet, NodeHealth, Pdb, owner_key
from steps.cluster.sim.repair import boot_id
from steps.durations import parse_duration
from steps.errors import InputError
from steps.yamlio import LineDict, load_yaml, plain

__all__ = ["FleetSpec", "build_fleet", "load_spec_file", "parse_short_spec"]

_EPOCH = "2025-01-06T08:00:00Z"
_ALL, _NONE = "all", "none"


class FleetSpec(BaseModel):
    """The parameters of a simulated fleet (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    nodes: int = Field(8, ge=1, le=20000)
    gpu: str = "h100"
    gpus: int | None = Field(None, ge=0, le=64)
    racks: int = Field(1, ge=1)
    blocks: int = Field(1, ge=1)
    prefix: str = "node-"
    width: int | None = Field(None, ge=1, le=8)
    workloads: bool = True
    kubelet: str = "v1.33.4"
    os: str = "Ubuntu 22.04.5 LTS"
    kernel: str = "5.15.0-130-generic"
    runtime: str = "containerd://1.7.24"
    driver: str | None = None
    faults: dict[str, list[str]] = Field(default_factory=dict)
    releases: list[Release] = Field(default_factory=list)
    cordoned: list[str] = Field(default_factory=list)
    certified: list[str] = Field(default_factory=lambda: [_ALL])
    api_errors: int = Field(0, ge=0, alias="api-errors")
    api_conflicts: int = Field(0, ge=0, alias="api-conflicts")
    api_latency_ms: int = Field(0, ge=0, alias="api-latency-ms")
    forbid: list[str] = Field(default_factory=list)
    noise: float = Field(0.0, ge=0.0, lt=0.5)
    spurious: float = Field(0.0, ge=0.0, lt=1.0)
    switches: dict[str, str] = Field(default_factory=dict)
    seed: int = 0
    repair: Literal["ok", "fail", "never"] = "ok"
    repair_delay: float = Field(2.0, ge=0.0, alias="repair-delay")
    reboot_ready: float = Field(0.0, ge=0.0, alias="reboot-ready")
    reboot_clear: float = Field(0.0, ge=0.0, alias="reboot-clear")
    blocking_pdb: bool = Field(False, alias="blocking-pdb")

    @field_validator("repair_delay", "reboot_ready", "reboot_clear", mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> Any:
        """Seconds, or a duration: ``20s``, ``1m``."""
        if not isinstance(value, str):
            return value
        try:
            return float(value)
        except ValueError:
            return parse_duration(value)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        if value.lower() not in GPU_MODELS:
            raise ValueError(f"unknown GPU {value!r}: choose one of {', '.join(sorted(GPU_MODELS))}")
        return value.lower()

    @field_validator("driver")
    @classmethod
    def _driver(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                cuda_for_driver(value)  # a driver version of a known branch
            except InputError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("releases", mode="before")
    @classmethod
    def _releases(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(";") if v.strip()]
        return value

    @field_validator("releases")
    @classmethod
    def _unique_releases(cls, value: list[Release]) -> list[Release]:
        seen: set[tuple[str, str]] = set()
        for release in value:
            if (release.namespace, release.name) in seen:
                raise ValueError(f"release {release.namespace}/{release.name} is given twice")
            seen.add((release.namespace, release.name))
        return value

    @field_validator("faults", mode="before")
    @classmethod
    def _faults(cls, value: Any) -> Any:
        if isinstance(value, str):
            return _parse_faults(value)
        if isinstance(value, dict):
            return {str(k): [v] if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("switches", mode="before")
    @classmethod
    def _switches(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        found: dict[str, str] = {}
        for item in filter(None, (t.strip() for t in value.split(";"))):
            rack, _, fault = (part.strip() for part in item.partition(":"))
            if not rack or not fault:
                raise ValueError(f"switch fault {item!r} is not RACK:FAULT (rack-03:slow=0.5)")
            found[rack] = fault
        return found

    @field_validator("cordoned", "forbid", "certified", mode="before")
    @classmethod
    def _semicolons(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(";") if v.strip()]
        return value

    def node_names(self) -> list[str]:
        """Every node name, in order."""
        width = self.width or max(2, len(str(self.nodes - 1)))
        return [f"{self.prefix}{i:0{width}d}" for i in range(self.nodes)]


def _parse_faults(text: str) -> dict[str, list[str]]:
    faults: dict[str, list[str]] = {}
    for item in (t.strip() for t in text.split(";")):
        if not item:
            continue
        node, sep, fault = item.partition(":")
        if not sep or not node or not fault:
            raise ValueError(f"fault {item!r} is not NODE:FAULT")
        faults.setdefault(node, []).append(fault)
    return faults


def _spec_error(where: str, exc: ValidationError) -> InputError:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()
    )
    return InputError(f"{where}: {problems}")


def parse_short_spec(text: str) -> FleetSpec:
    """Read ``key=value,...`` (the part after ``sim:``), which may start with a fleet file whose keys the
    ones that follow replace (``fleet.yaml,faults=node-03:driver=570.124.06``).

    Raises:
        InputError: an unknown key, a bad value, or a term that is not ``key=value``; for a fleet file,
            what :func:`load_spec_file` raises.
    """
    terms = [t.strip() for t in text.split(",") if t.strip()]
    base: dict[str, Any] = {}
    lines: dict[str, int] = {}
    path: Path | None = None
    if terms and "=" not in terms[0] and terms[0].endswith((".yaml", ".yml")):
        path = Path(terms.pop(0))
        base, lines = _read_spec_file(path)
    values: dict[str, Any] = {}
    for term in terms:
        key, sep, value = term.partition("=")
        key = key.strip().replace("_", "-")
        if not sep:
            raise InputError(f"sim:{text}: {term!r} is not key=value")
        field = key.replace("-", "_")
        if field not in FleetSpec.model_fields:
            known = ", ".join(sorted(f.replace("_", "-") for f in FleetSpec.model_fields))
            raise InputError(f"sim:{text}: unknown key {key!r} (known: {known})")
        if field in values:
            raise InputError(f"sim:{text}: key {key!r} is given twice")
        values[field] = value.strip()
    try:
        return FleetSpec.model_validate({**base, **values})
    except ValidationError as exc:
        first = str(exc.errors()[0]["loc"][0]) if exc.errors()[0]["loc"] else ""
        if path is not None and first in base and first not in values:
            raise _spec_error(f"{path}:{lines.get(first, 1)}", exc) from None
        raise _spec_error(f"sim:{text}", exc) from None


def _read_spec_file(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """The keys of a fleet file (``-`` read as ``_``) and the line of each.

    Raises:
        InputError: the file is missing, is not UTF-8 YAML, is not a mapping, or has an unknown or a
            repeated key (with file and line).
    """
    raw = load_yaml(
        path, str(path), what="the fleet file"
    )  # duplicate keys, bad text and alias bombs refused with their line
    if raw is None:
        raw = LineDict()
    if not isinstance(raw, dict):
        raise InputError(f"{path}:1: a fleet file is a mapping of keys (nodes, gpu, racks...)")
    key_lines: dict[Any, int] = getattr(raw, "key_lines", {})
    data: dict[str, Any] = {}
    lines: dict[str, int] = {}
    for key, value in raw.items():
        field = str(key).replace("-", "_")
        line = key_lines.get(key, 1)
        if field in data:
            raise InputError(f"{path}:{line}: key {key!r} is given twice (also on line {lines[field]})")
        data[field] = plain(value)
        lines[field] = line
    unknown = sorted(set(data) - set(FleetSpec.model_fields))
    if unknown:
        raise InputError(f"{path}:{lines.get(unknown[0], 1)}: unknown key {unknown[0]!r}")
    return data, lines


def load_spec_file(path: Path) -> FleetSpec:
    """Read a fleet YAML file.

    Raises:
        InputError: the file is missing, is not YAML, or holds a bad value (with file and line).
    """
    data, lines = _read_spec_file(path)
    try:
        return FleetSpec.model_validate(data)
    except ValidationError as exc:
        first = str(exc.errors()[0]["loc"][0]) if exc.errors()[0]["loc"] else ""
        raise _spec_error(f"{path}:{lines.get(first, 1)}", exc) from None


def _gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.sim.dsx.dev"))


def _place(slot: int, count: int, nodes: int, offset: int) -> int:
    return (slot * nodes // count + offset) % nodes


_CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)
"""The conditions a healthy kubelet posts: type, status, reason, message."""


def _node(spec: FleetSpec, model: GpuModel, count: int, name: str, rack: int, revision: str) -> Node:
    """Node ``name`` as the API shows it: labels (GPU Feature Discovery's too), resources, conditions."""
    racks_per_block = -(-spec.racks // spec.blocks)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": model.arch,
        "node.kubernetes.io/instance-type": f"dgx-{model.key}",
        vocab.LABEL_RACK: f"rack-{rack:02d}",
        vocab.LABEL_BLOCK: f"block-{rack // racks_per_block:02d}",
        **(model.labels(count, spec.driver) if count else {}),
    }
    resources = {
        "cpu": str(model.cpu),
        "memory": f"{model.memory_gib}Gi",
        "ephemeral-storage": "3840Gi",
        "pods": "110",
    }
    if count:
        resources[GPU_RESOURCE] = str(count)
    allocatable = dict(resources, cpu=str(model.cpu - 4), memory=f"{model.memory_gib - 16}Gi")
    conditions = [
        Condition(
            type=t, status=s, reason=r, message=m, last_transition_time=_EPOCH, last_heartbeat_time=_EPOCH
        )
        for t, s, r, m in _CONDITIONS
    ]
    return Node(
        name=name,
        labels=labels,
        unschedulable=name in spec.cordoned,
        conditions=conditions,
        capacity=resources,
        allocatable=allocatable,
        node_info=NodeInfo(
            os_image=spec.os,
            kernel_version=spec.kernel,
            kubelet_version=spec.kubelet,
            container_runtime_version=spec.runtime,
            architecture=model.arch,
            boot_id=boot_id(name),
        ),
        resource_version=revision,
    )


def _health(model: GpuModel, count: int, name: str) -> NodeHealth:
    """A healthy node's hardware: nominal links, every GPU healthy at nominal NVLink bandwidth."""
    return NodeHealth(
        link_gbps=model.link_gbps,
        nominal_link_gbps=model.link_gbps,
        gpus=[
            GpuReport(
                index=g,
                uuid=_gpu_uuid(name, g),
                nvlink_gbps=model.nvlink_gbps,
                nominal_nvlink_gbps=model.nvlink_gbps,
                **gpu_hardware(model, g),
            )
            for g in range(count)
        ],
        nics=node_nics(model, count),
    )


def build_fleet(spec: FleetSpec, text: str = "") -> Fleet:
    """Build the fleet a spec describes (deterministic: the same spec gives the same fleet).

    Raises:
        InputError: a fault or a cordoned node names a node that is not in the fleet, or a fault is malformed.
    """
    model = gpu_model(spec.gpu)
    count = model.count if spec.gpus is None else spec.gpus
    names = spec.node_names()
    fleet = Fleet(
        spec=text or spec.model_dump_json(exclude_defaults=True),
        fabric=FabricSettings(noise=spec.noise, seed=spec.seed, spurious=spec.spurious),
    )
    for i, name in enumerate(names):
        fleet.nodes[name] = _node(
            spec, model, count, name, i * spec.racks // spec.nodes, fleet.next_revision()
        )
        fleet.health[name] = _health(model, count, name)
    fleet.fabric = fleet.fabric.model_copy(update={"switches": _switch_faults(spec, fleet)})
    for name in spec.cordoned:
        if name not in fleet.nodes:
            raise InputError(f"cordoned node {name!r} is not in the fleet ({names[0]}..{names[-1]})")
    _certify(fleet, spec.certified, names)
    if spec.workloads:
        _add_workloads(fleet, names, spec.blocking_pdb)
    install_releases(fleet, spec.releases, _EPOCH)
    for node, faults in sorted(spec.faults.items()):
        for fault in faults:
            apply_fault(fleet, node, fault)
    fleet.repair, fleet.repair_delay_s = spec.repair, spec.repair_delay
    fleet.reboot_ready_s, fleet.reboot_clear_s = spec.reboot_ready, spec.reboot_clear
    fleet.api.errors = spec.api_errors
    fleet.api.conflicts = spec.api_conflicts
    fleet.api.latency_ms = spec.api_latency_ms
    fleet.api.forbidden = list(spec.forbid)
    return fleet


def _switch_faults(spec: FleetSpec, fleet: Fleet) -> tuple[SwitchFault, ...]:
    """The faulty leaf switches of ``switches``, each with the nodes its rack label names.

    Raises:
        InputError: a rack the fleet does not have, or a fault other than ``slow=F``, ``flaky=P``, ``hang``.
    """
    racks: dict[str, list[str]] = {}
    for name, node in fleet.nodes.items():
        racks.setdefault(node.labels[vocab.LABEL_RACK], []).append(name)
    found = []
    for rack, fault in sorted(spec.switches.items()):
        where = f"switch fault {rack}:{fault}"
        if rack not in racks:
            raise InputError(f"{where}: the fleet has no rack {rack!r} ({', '.join(sorted(racks))})")
        kind, _, value = fault.partition("=")
        try:
            number = float(value) if value else None
        except ValueError:
            raise InputError(f"{where}: {value!r} is not a number") from None
        if kind == "slow" and number is not None and 0.0 < number < 1.0:
            found.append(SwitchFault(leaf=rack, nodes=tuple(racks[rack]), speed=number))
        elif kind == "flaky" and number is not None and 0.0 < number <= 1.0:
            found.append(SwitchFault(leaf=rack, nodes=tuple(racks[rack]), failure_rate=number))
        elif kind == "hang" and number is None:
            found.append(SwitchFault(leaf=rack, nodes=tuple(racks[rack]), hangs=True))
        else:
            raise InputError(f"{where}: expected slow=F (0 < F < 1), flaky=P (0 < P <= 1) or hang")
    return tuple(found)


def _certify(fleet: Fleet, certified: list[str], names: list[str]) -> None:
    """Label the nodes an earlier certification passed (``all``: every node with GPUs; ``none``)."""
    if certified in ([_ALL], [_NONE]):
        chosen = names if certified == [_ALL] else []
    else:
        for name in certified:
            if name not in fleet.nodes:
                raise InputError(f"certified node {name!r} is not in the fleet ({names[0]}..{names[-1]})")
        chosen = certified
    for name in chosen:
        node = fleet.nodes[name]
        if node.gpu_count:
            node.labels[vocab.LABEL_CERTIFICATION] = vocab.Certification.passed.value
            node.annotations[vocab.ANNOTATION_CERTIFIED_AT] = _EPOCH


def _add_workloads(fleet: Fleet, names: list[str], blocking_pdb: bool = False) -> None:
    n = len(names)

    def add(pod: Pod) -> None:
        fleet.pods[pod.ref] = pod.model_copy(update={"uid": fleet.new_uid()})
        if pod.owner_kind:
            key = owner_key(pod)
            fleet.owner_next[key] = fleet.owner_next.get(key, 0) + 1

    for ds in ("nvidia-device-plugin-daemonset", "nvidia-dcgm-exporter"):
        for i, node in enumerate(names):
            add(
                Pod(
                    name=f"{ds}-{i}",
                    namespace="gpu-operator",
                    node=node,
                    owner_kind="DaemonSet",
                    owner_name=ds,
                    labels={"app": ds},
                )
            )
    workloads = (
        ("ReplicaSet", "inference-5d8f7c", "serving", {"app": "inference"}, 3, 0),
        ("ReplicaSet", "gateway-7f6d5b", "serving", {"app": "gateway"}, 2, 1),
        ("Job", "pretrain-llama", "research", {"job-name": "pretrain-llama"}, 4, 2),
    )
    for kind, owner, namespace, labels, replicas, offset in workloads:
        if kind == "ReplicaSet":
            fleet.scales[f"{kind}/{namespace}/{owner}"] = replicas
        for k in range(replicas):
            add(
                Pod(
                    name=f"{owner}-{k}",
                    namespace=namespace,
                    node=names[_place(k, replicas, n, offset)],
                    owner_kind=kind,
                    owner_name=owner,
                    labels=dict(labels),
                )
            )
    add(Pod(name="debug-shell", namespace="default", node=names[-1], labels={"run": "debug-shell"}))
    for pdb in (
        Pdb(name="inference", namespace="serving", match_labels={"app": "inference"}, max_unavailable=1),
        Pdb(
            name="gateway",
            namespace="serving",
            match_labels={"app": "gateway"},
            min_available=2 if blocking_pdb else 1,
        ),
    ):
        fleet.pdbs[f"{pdb.namespace}/{pdb.name}"] = pdb

"""The node side of the emulated cluster: a scheduler and a kubelet double, for tests.

**Scheduler** (:func:`schedule_pending`, run by the emulator's control loop). A pod without a node,
not finished and not being deleted, is bound to a node (``spec.nodeName``, condition PodScheduled True)
only when the node passes kube-scheduler's filters, in its order, the first failing filter naming the
reason (``pkg/scheduler/framework/plugins``, Kubernetes 1.33):

1. NodeUnschedulable: a cordoned node (``spec.unschedulable``) unless the pod tolerates
   ``node.kubernetes.io/unschedulable:NoSchedule`` ("node(s) were unschedulable").
2. TaintToleration: every NoSchedule and NoExecute taint must be tolerated; a node that is not Ready
   carries ``node.kubernetes.io/not-ready`` (``unreachable`` when Unknown), as the node lifecycle
   controller taints it ("node(s) had untolerated taint {KEY: VALUE}").
3. NodeAffinity: ``nodeSelector`` and the required node affinity (terms ORed; In, NotIn, Exists,
   DoesNotExist, Gt, Lt; ``matchFields`` on ``metadata.name``) ("node(s) didn't match Pod's node
   affinity/selector").
4. NodeResourcesFit: for every resource the pod requests (requests default to limits, so an extended
   resource such as ``nvidia.com/gpu`` or ``vpc.amazonaws.com/efa`` counts its limit), the node's
   ``status.allocatable`` minus what its bound, unfinished pods request, and its pod count
   ("Insufficient RESOURCE", "Too many pods").
5. InterPodAffinity: required pod affinity, required pod anti-affinity of the pod, and of the pods
   already there, per ``topologyKey`` ("node(s) didn't match pod affinity rules", "node(s) didn't
   match pod anti-affinity rules", "node(s) didn't satisfy existing pods anti-affinity rules").

A pod that fits nowhere stays Pending with PodScheduled False, reason Unschedulable, and the message
FitError builds (``pkg/scheduler/framework/types.go``): ``0/N nodes are available: COUNT REASON, ....``
followed by DefaultPreemption's ``preemption: 0/N nodes are available: ....`` (every pod has the same
priority, so preemption never finds victims), word for word as Kubernetes v1.37's scheduler writes it (the
e2e tier compares the two: ``tests/e2e/test_doubles.py``). Pending pods are tried again after every change, in
creation order, so one freed GPU lets the oldest waiting pod in. Among the nodes that fit, the one with
the fewest pods wins (ties by name); real scoring is not modelled.

**Kubelet** (:class:`Kubelet`): a double for every node's kubelet. It moves bound Pending pods to
Running (podIP, startTime, containerStatuses, Ready) after the node's start delay (image pull), runs
the pod's *program* in a thread, and ends the pod Succeeded or Failed with the program's exit code.
While it runs the emulator deletes its pods gracefully: a pod being deleted has its program told to
stop (SIGTERM, :attr:`PodProcess.stopped`); once the program ends, or its grace period is over (then it
counts as killed, exit 137), the kubelet confirms the deletion. Per-node behaviour (:class:`NodeBehaviour`): a
start delay, never starting (ImagePullBackOff), every pod failing, a node down (nothing done for its
pods). Programs are chosen by the first container's command (:meth:`Kubelet.register`); built in:
``sleep S``, ``true``, ``false``, and dsx's rank pods (:func:`rank_pod_program`). Pods with no matching
program run until deleted.

The rank-pod program is a test double of ``python -m steps.readiness.launchers.rankpod``: when every
pod of its Job runs, it plays the whole group on this machine (the group's module through the local
launcher, one gloo rank per pod) and publishes the result as rank 0 would, through the kubernetes client.
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import copy
import functools
import io
import json
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.emulator.apiserver import Emulator

__all__ = [
    "RANK_POD_COMMAND",
    "STATE_EXIT_CODE",
    "STATE_RESULT",
    "EmulatedCluster",
    "Kubelet",
    "NodeBehaviour",
    "PodProcess",
    "Program",
    "emulated_cluster",
    "place",
    "rank_pod_program",
    "schedule_pending",
]

TERMINAL = ("Succeeded", "Failed")
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"

# ----------------------------------------------------------------------------------------- quantities

_SUFFIXES = {
    "": Fraction(1),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


def quantity(value: Any) -> Fraction:
    """A resource quantity (``500m``, ``8``, ``2032Gi``, ``1e3``) as an exact number."""
    text = str(value).strip()
    m = re.fullmatch(r"([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+))?([a-zA-Z]*)", text)
    if not m or m.group(3) not in _SUFFIXES:
        raise ValueError(f"not a quantity: {value!r}")
    number = Fraction(m.group(1)) * _SUFFIXES[m.group(3)]
    return number * Fraction(10) ** int(m.group(2)) if m.group(2) else number


def pod_requests(pod: dict[str, Any]) -> dict[str, Fraction]:
    """What a pod asks of its node: the sum over containers, at least each init container's."""
    spec = pod.get("spec") or {}

    def of(container: dict[str, Any]) -> dict[str, Fraction]:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: quantity(v) for name, v in asked.items()}

    total: dict[str, Fraction] = {}
    for container in spec.get("containers") or []:
        for name, amount in of(container).items():
            total[name] = total.get(name, Fraction(0)) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in of(container).items():
            total[name] = max(total.get(name, Fraction(0)), amount)
    return total


# ----------------------------------------------------------------------------------------- matching


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        operator = t.get("operator") or "Equal"
        if not t.get("key"):
            if operator == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if operator == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression(expr: dict[str, Any], values: dict[str, str]) -> bool:
    key, operator = expr.get("key", ""), expr.get("operator", "")
    wanted = [str(v) for v in expr.get("values") or []]
    if operator == "In":
        return key in values and values[key] in wanted
    if operator == "NotIn":
        return key not in values or values[key] not in wanted
    if operator == "Exists":
        return key in values
    if operator == "DoesNotExist":
        return key not in values
    if operator in ("Gt", "Lt") and key in values and len(wanted) == 1:
        try:
            have, limit = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return have > limit if operator == "Gt" else have < limit
    return False


def _label_selector(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector; ``None`` matches nothing, ``{}`` everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_expression(e, labels) for e in selector.get("matchExpressions") or [])


def _node_affinity(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in required.get("nodeSelectorTerms") or []:
        expressions, matched = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not expressions and not matched:
            continue  # an empty term matches no node
        if all(_expression(e, labels) for e in expressions) and all(_expression(e, fields) for e in matched):
            return True
    return False


def _terms(pod: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    return list(affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or [])


def _term_selects(term: dict[str, Any], owner: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether an affinity term of ``owner`` selects the pod ``other`` (namespaces, then labels)."""
    namespaces = term.get("namespaces") or []
    if term.get("namespaceSelector") == {}:
        pass  # every namespace
    elif namespaces:
        if other["metadata"].get("namespace") not in namespaces:
            return False
    elif other["metadata"].get("namespace") != owner["metadata"].get("namespace"):
        return False
    return _label_selector(term.get("labelSelector"), other["metadata"].get("labels") or {})


def _same_domain(key: str, a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return False
    la, lb = a["metadata"].get("labels") or {}, b["metadata"].get("labels") or {}
    return key in la and key in lb and la[key] == lb[key]


# ----------------------------------------------------------------------------------------- the filters


def _ready(node: dict[str, Any]) -> str:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return str(c.get("status"))
    return "Unknown"


def _taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    taints = list((node.get("spec") or {}).get("taints") or [])
    readiness = _ready(node)
    implied = []
    if readiness != "True":
        key = "node.kubernetes.io/not-ready" if readiness == "False" else "node.kubernetes.io/unreachable"
        implied = [{"key": key, "effect": "NoSchedule"}, {"key": key, "effect": "NoExecute"}]
    if (node.get("spec") or {}).get("unschedulable"):
        implied.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
    known = {(t.get("key"), t.get("effect")) for t in taints}
    return taints + [t for t in implied if (t["key"], t["effect"]) not in known]


def _filter(
    pod: dict[str, Any],
    node: dict[str, Any],
    nodes: dict[str, dict[str, Any]],
    placed: list[dict[str, Any]],
) -> tuple[list[str], bool]:
    """The reasons ``node`` fails ``pod`` (empty if it fits) and whether preemption could help."""
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    name = node["metadata"]["name"]
    if (node.get("spec") or {}).get("unschedulable") and not _tolerates(
        tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    ):
        return ["node(s) were unschedulable"], False
    for taint in _taints(node):
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, taint):
            return [
                f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
            ], False
    if not _node_affinity(pod, node):
        return ["node(s) didn't match Pod's node affinity/selector"], False
    here = [p for p in placed if (p.get("spec") or {}).get("nodeName") == name]
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    reasons = []
    if "pods" in allocatable and len(here) + 1 > quantity(allocatable["pods"]):
        reasons.append("Too many pods")
    used: dict[str, Fraction] = {}
    for other in here:
        for resource, amount in pod_requests(other).items():
            used[resource] = used.get(resource, Fraction(0)) + amount
    for resource, amount in sorted(pod_requests(pod).items()):
        if amount <= 0:
            continue
        free = quantity(allocatable.get(resource, 0)) - used.get(resource, Fraction(0))
        if amount > free:
            reasons.append(f"Insufficient {resource}")
    if reasons:
        return reasons, True
    for term in _terms(pod, "podAffinity"):
        key = term.get("topologyKey", "")
        peers = [p for p in placed if _term_selects(term, pod, p)]
        # With no matching pod anywhere, a pod that matches its own term may start the group.
        alone = not peers and _term_selects(term, pod, pod) and key in (node["metadata"].get("labels") or {})
        if not alone and not any(_same_domain(key, node, nodes.get(p["spec"]["nodeName"])) for p in peers):
            return ["node(s) didn't match pod affinity rules"], False
    for term in _terms(pod, "podAntiAffinity"):
        key = term.get("topologyKey", "")
        for other in placed:
            if _term_selects(term, pod, other) and _same_domain(
                key, node, nodes.get(other["spec"]["nodeName"])
            ):
                return ["node(s) didn't match pod anti-affinity rules"], True
    for other in placed:
        for term in _terms(other, "podAntiAffinity"):
            key = term.get("topologyKey", "")
            if _term_selects(term, other, pod) and _same_domain(
                key, node, nodes.get(other["spec"]["nodeName"])
            ):
                return ["node(s) didn't satisfy existing pods anti-affinity rules"], True
    return [], False


def _histogram(reasons: dict[str, int]) -> str:
    return ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items()))


def place(
    pod: dict[str, Any], nodes: list[dict[str, Any]], placed: list[dict[str, Any]]
) -> tuple[str | None, str]:
    """The node kube-scheduler would bind ``pod`` to, or ``None`` and the FitError message.

    Args:
        pod: the pod to place.
        nodes: every node.
        placed: the bound pods that are not finished (they hold their requests).
    """
    by_name = {n["metadata"]["name"]: n for n in nodes}
    reasons: dict[str, int] = {}
    preemption: dict[str, int] = {}
    fits: list[str] = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        failed, resolvable = _filter(pod, node, by_name, placed)
        if not failed:
            fits.append(node["metadata"]["name"])
            continue
        for reason in failed:
            reasons[reason] = reasons.get(reason, 0) + 1
        why = (
            "No preemption victims found for incoming pod"
            if resolvable
            else "Preemption is not helpful for scheduling"
        )
        preemption[why] = preemption.get(why, 0) + 1
    if fits:
        load = {name: 0 for name in fits}
        for other in placed:
            where = (other.get("spec") or {}).get("nodeName")
            if where in load:
                load[where] += 1
        return min(fits, key=lambda n: (load[n], n)), ""
    total = len(nodes)
    if not total:
        return None, "no nodes available to schedule pods"
    return None, (
        f"0/{total} nodes are available: {_histogram(reasons)}. "
        f"preemption: 0/{total} nodes are available: {_histogram(preemption)}."
    )


def schedule_pending(emulator: Emulator) -> bool:
    """One scheduling pass over the emulator's store (its lock held); whether it changed anything."""
    objects = emulator._objects
    nodes = [o for (_, plural, _, _), o in sorted(objects.items()) if plural == "nodes"]
    pods = [(k, o) for k, o in objects.items() if k[1] == "pods"]
    placed = [
        o
        for _, o in pods
        if (o.get("spec") or {}).get("nodeName") and (o.get("status") or {}).get("phase") not in TERMINAL
    ]
    waiting = [
        (k, o)
        for k, o in pods
        if not (o.get("spec") or {}).get("nodeName")
        and (o.get("status") or {}).get("phase") not in TERMINAL
        and not o["metadata"].get("deletionTimestamp")
        and (o.get("spec") or {}).get("schedulerName", "default-scheduler") == "default-scheduler"
        and not (o.get("spec") or {}).get("schedulingGates")
    ]
    waiting.sort(key=lambda item: emulator._created.get(item[1]["metadata"].get("uid", ""), 0))
    changed = False
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(emulator.clock()))
    for key, pod in waiting:
        node, message = place(pod, nodes, placed)
        new = copy.deepcopy(pod)
        conditions = [
            c
            for c in (new.setdefault("status", {}).get("conditions") or [])
            if c.get("type") != "PodScheduled"
        ]
        if node is not None:
            new["spec"]["nodeName"] = node
            conditions.append(
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp}
            )
            placed.append(new)
        else:
            old: dict[str, Any] = next(
                (c for c in new["status"].get("conditions") or [] if c.get("type") == "PodScheduled"), {}
            )
            if old.get("status") == "False" and old.get("message") == message:
                continue
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": stamp,
                    "reason": "Unschedulable",
                    "message": message,
                }
            )
        new["status"]["conditions"] = conditions
        emulator._store(key, new)
        changed = True
    return changed


# ----------------------------------------------------------------------------------------- the kubelet


@dataclass
class NodeBehaviour:
    """How one node's kubelet behaves.

    Attributes:
        start_delay_s: seconds a bound pod stays Pending (ContainerCreating) before it runs: image pull.
        never_starts: pods bound here never run (ImagePullBackOff).
        fail_exit_code: when set, every pod here exits with this code ``fail_after_s`` after it starts,
            whatever its program.
        fail_after_s: see ``fail_exit_code``.
        down: the node is off or cut off: its kubelet does nothing (starts no pod, stops none, confirms
            no deletion), so a pod deleted there stays terminating, as on a real cluster.
    """

    start_delay_s: float = 0.0
    never_starts: bool = False
    fail_exit_code: int | None = None
    fail_after_s: float = 0.0
    down: bool = False


@dataclass
class PodProcess:
    """What a program sees of its pod: the pod, its resolved environment and command, a stop signal."""

    pod: dict[str, Any]
    env: dict[str, str]
    command: list[str]
    kubelet: Kubelet
    stopped: threading.Event = field(default_factory=threading.Event)  # SIGTERM: the pod is being deleted
    killed: threading.Event = field(default_factory=threading.Event)  # SIGKILL: its grace period is over
    message: str = ""  # the container's termination message, set by the program

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"].get("namespace", ""))

    @property
    def node(self) -> str:
        return str(self.pod["spec"].get("nodeName", ""))

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; ``False`` when the pod was stopped meanwhile."""
        return not self.stopped.wait(seconds)


Program = Callable[[PodProcess], int]
SIGTERM_EXIT = 143  # 128 + SIGTERM: a container stopped by its pod's deletion
SIGKILL_EXIT = 137  # 128 + SIGKILL: one still running when its grace period ended


def sleep_program(process: PodProcess) -> int:
    """``sleep SECONDS``: exits 0 after that long, or 143 when the pod is deleted first."""
    seconds = float(process.command[1]) if len(process.command) > 1 else 0.0
    return 0 if process.wait(seconds) else SIGTERM_EXIT


def _exit_with(code: int) -> Program:
    def program(process: PodProcess) -> int:
        return code

    return program


def _field_path(pod: dict[str, Any], path: str) -> str:
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str((pod["metadata"].get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": pod["metadata"].get("name", ""),
        "metadata.namespace": pod["metadata"].get("namespace", ""),
        "metadata.uid": pod["metadata"].get("uid", ""),
        "spec.nodeName": (pod.get("spec") or {}).get("nodeName", ""),
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", ""),
        "status.podIP": (pod.get("status") or {}).get("podIP", ""),
        "status.hostIP": (pod.get("status") or {}).get("hostIP", ""),
    }
    return str(simple.get(path, ""))


def resolve_env(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet sets it: values, and the downward API's fieldRefs."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(var["value"])
            )
        elif (ref := (var.get("valueFrom") or {}).get("fieldRef")) is not None:
            env[var["name"]] = _field_path(pod, str(ref.get("fieldPath", "")))
    return env


@dataclass
class _Started:
    process: PodProcess
    thread: threading.Thread


class Kubelet:
    """The kubelet double for every node of an emulator (see the module docstring).

    Args:
        emulator: the emulated API server whose pods it runs.
        kubeconfig: a kubeconfig for the emulator, for programs that talk to the API (rank pods).
        work_dir: where programs keep their files.
        behaviours: per-node behaviour (any other node behaves normally).
        run_timeout_s: the longest a group run may take when its Job sets no deadline.
    """

    def __init__(
        self,
        emulator: Emulator,
        kubeconfig: Path,
        work_dir: Path,
        behaviours: dict[str, NodeBehaviour] | None = None,
        run_timeout_s: float = 300.0,
    ) -> None:
        self.emulator = emulator
        self.kubeconfig = kubeconfig
        self.work_dir = work_dir
        self.behaviours: dict[str, NodeBehaviour] = dict(behaviours or {})
        self.run_timeout_s = run_timeout_s
        self.programs: list[tuple[tuple[str, ...], Program]] = [
            (("sleep",), sleep_program),
            (("true",), _exit_with(0)),
            (("false",), _exit_with(1)),
            (RANK_POD_COMMAND, rank_pod_program),
        ]
        self.groups: dict[tuple[str, str], _Group] = {}
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}
        self._marked: set[tuple[str, str]] = set()
        self._started: dict[str, _Started] = {}
        self._ignored: set[str] = set()
        self._running = False
        self._due = 1.0
        self._thread: threading.Thread | None = None
        self._ips = 0

    # ------------------------------------------------------------------ controls

    def behave(self, node: str, **settings: Any) -> None:
        """Set how ``node`` behaves from now on (see :class:`NodeBehaviour`)."""
        self.behaviours[node] = NodeBehaviour(**settings)

    def register(self, prefix: tuple[str, ...], program: Program) -> None:
        """Run ``program`` for pods whose first container's command (+ args) starts with ``prefix``."""
        self.programs.insert(0, (tuple(prefix), program))

    def start(self) -> Kubelet:
        """Run every node's pods from now on (the emulator then deletes their pods gracefully)."""
        self.emulator.kubelet = self.runs
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop every program and the kubelet (programs get a few seconds to end)."""
        self.emulator.kubelet = None
        self._running = False
        with self.emulator.changed:
            self.emulator.changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for started in list(self._started.values()):
            started.process.stopped.set()
        for started in list(self._started.values()):
            started.thread.join(timeout=5)

    def runs(self, node: str) -> bool:
        """Whether this kubelet runs ``node`` (every node of the emulator)."""
        return self._running

    def __enter__(self) -> Kubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        seen = -1
        while self._running:
            with self.emulator.changed:
                self.emulator.changed.wait_for(functools.partial(self._moved_from, seen), timeout=self._due)
                seen = self.emulator.generation
            self.sync()

    def _moved_from(self, seen: int) -> bool:
        return self.emulator.generation != seen or not self._running

    def sync(self) -> None:
        """One pass over the pods bound to nodes: start, hold back, stop."""
        now = time.monotonic()
        self._due = 1.0  # seconds until a held-back pod may start (the loop also wakes on every write)
        present: dict[str, dict[str, Any]] = {}
        for pod in self.emulator.objects("pods"):
            uid = pod["metadata"].get("uid", "")
            present[uid] = pod
            node = (pod.get("spec") or {}).get("nodeName")
            if not node or self.behaviours.get(node, NodeBehaviour()).down:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                self._stop(pod)
                continue
            if uid in self._ignored or uid in self._started:
                continue
            if (pod.get("status") or {}).get("phase") != "Pending":
                self._ignored.add(uid)  # not ours: seeded running, or already ended
                continue
            behaviour = self.behaviours.get(node, NodeBehaviour())
            first = self._seen.setdefault(uid, now)
            if behaviour.never_starts:
                self._waiting(pod, "ImagePullBackOff", f'Back-off pulling image "{_image(pod)}"')
            elif now - first < behaviour.start_delay_s:
                self._waiting(pod, "ContainerCreating", "")
                self._due = max(0.01, min(self._due, first + behaviour.start_delay_s - now))
            else:
                self._start(pod, behaviour)
        for uid, started in list(self._started.items()):
            if uid not in present:
                started.process.stopped.set()

    def _stop(self, pod: dict[str, Any]) -> None:
        """A pod being deleted: SIGTERM to its program, SIGKILL when its grace period is over, and the
        deletion confirmed once it has stopped (at once for a pod whose program is not running)."""
        meta = pod["metadata"]
        started = self._started.get(meta["uid"])
        if started is not None and started.thread.is_alive() and not started.process.killed.is_set():
            started.process.stopped.set()
            ends = _epoch(meta["deletionTimestamp"])
            if self.emulator.clock() < ends:
                self._due = max(0.01, min(self._due, ends - self.emulator.clock()))
                return
            started.process.killed.set()
            self._finish(started.process, SIGKILL_EXIT, "Error")
        self.emulator.confirm_deletion(meta.get("namespace", ""), meta["name"], meta["uid"])

    def _waiting(self, pod: dict[str, Any], reason: str, message: str) -> None:
        uid = pod["metadata"]["uid"]
        if (uid, reason) in self._marked:
            return
        self._marked.add((uid, reason))
        stamp = _stamp(self.emulator.clock())
        node = self.emulator.get("nodes", pod["spec"]["nodeName"]) or {"metadata": {}}

        def change(p: dict[str, Any]) -> None:
            status = p.setdefault("status", {})
            status["hostIP"] = _host_ip(node)
            status.setdefault("startTime", stamp)
            status["conditions"] = _conditions(status, ready=False, stamp=stamp)
            waiting: dict[str, Any] = {"reason": reason}
            if message:
                waiting["message"] = message
            status["containerStatuses"] = [
                _container_status(c, {"waiting": waiting}, ready=False)
                for c in p["spec"].get("containers") or []
            ]

        self.emulator.update(
            "pods", pod["metadata"].get("namespace", ""), pod["metadata"]["name"], change, uid
        )

    def _start(self, pod: dict[str, Any], behaviour: NodeBehaviour) -> None:
        uid = pod["metadata"]["uid"]
        stamp = _stamp(self.emulator.clock())
        node = self.emulator.get("nodes", pod["spec"]["nodeName"]) or {"metadata": {}}
        self._ips += 1
        ip = f"10.244.{self._ips // 250}.{self._ips % 250 + 2}"

        def change(p: dict[str, Any]) -> None:
            status = p.setdefault("status", {})
            status.update(phase="Running", podIP=ip, podIPs=[{"ip": ip}], hostIP=_host_ip(node))
            status.setdefault("startTime", stamp)
            status["conditions"] = _conditions(status, ready=True, stamp=stamp)
            status["containerStatuses"] = [
                _container_status(c, {"running": {"startedAt": stamp}}, ready=True)
                for c in p["spec"].get("containers") or []
            ]

        running = self.emulator.update(
            "pods", pod["metadata"].get("namespace", ""), pod["metadata"]["name"], change, uid
        )
        if running is None:
            return
        container = (running["spec"].get("containers") or [{}])[0]
        command = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
        process = PodProcess(running, resolve_env(running, container), command, self)
        program = (
            self._program_for(command)
            if behaviour.fail_exit_code is None
            else _fail_after(behaviour.fail_exit_code, behaviour.fail_after_s)
        )
        thread = threading.Thread(
            target=self._run, args=(process, program), name=f"pod-{process.name}", daemon=True
        )
        self._started[uid] = _Started(process, thread)
        thread.start()

    def _program_for(self, command: list[str]) -> Program:
        for prefix, program in self.programs:
            if tuple(command[: len(prefix)]) == prefix:
                return program
        return _run_until_stopped

    def _run(self, process: PodProcess, program: Program) -> None:
        try:
            code = program(process)
        except Exception as exc:  # a program that crashes is a container that crashed
            code, process.message = 1, f"{type(exc).__name__}: {exc}"
        if process.killed.is_set():
            return  # the kubelet killed it at the end of its grace period and said so
        self._finish(process, code, "Completed" if code == 0 else "Error")
        meta = process.pod["metadata"]
        now = self.emulator.get("pods", meta["name"], meta.get("namespace", ""))
        if (
            now is not None
            and now["metadata"].get("uid") == meta["uid"]
            and now["metadata"].get("deletionTimestamp")
        ):
            self.emulator.confirm_deletion(meta.get("namespace", ""), meta["name"], meta["uid"])
        self.emulator.wake()

    def _finish(self, process: PodProcess, code: int, reason: str) -> None:
        """Write the pod's end: Succeeded or Failed, the container terminated with ``code``."""
        stamp = _stamp(self.emulator.clock())

        def change(p: dict[str, Any]) -> None:
            status = p.setdefault("status", {})
            started = (status.get("containerStatuses") or [{}])[0].get("state", {}).get("running", {})
            terminated = {
                "exitCode": code,
                "reason": reason,
                "startedAt": started.get("startedAt", stamp),
                "finishedAt": stamp,
            }
            if process.message:
                terminated["message"] = process.message
            status["phase"] = "Succeeded" if code == 0 else "Failed"
            status["conditions"] = _conditions(status, ready=False, stamp=stamp)
            status["containerStatuses"] = [
                _container_status(c, {"terminated": terminated}, ready=False)
                for c in p["spec"].get("containers") or []
            ]

        meta = process.pod["metadata"]
        self.emulator.update("pods", meta.get("namespace", ""), meta["name"], change, meta["uid"])

    # ------------------------------------------------------------------ groups of rank pods

    def group(self, pod: dict[str, Any], size: int) -> _Group:
        """The group a rank pod belongs to: its Job (by controller uid)."""
        owner: dict[str, Any] = next(
            (r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")), {}
        )
        key = (str(pod["metadata"].get("namespace", "")), str(owner.get("uid") or pod["metadata"]["name"]))
        with self._lock:
            if key not in self.groups or self.groups[key].done.is_set():
                self.groups[key] = _Group(size=size)  # a Job's pods that start again form a new group
            return self.groups[key]


def _fail_after(code: int, seconds: float) -> Program:
    def program(process: PodProcess) -> int:
        return code if process.wait(seconds) else SIGTERM_EXIT

    return program


def _run_until_stopped(process: PodProcess) -> int:
    process.stopped.wait()
    return SIGTERM_EXIT


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _epoch(stamp: str) -> float:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def _image(pod: dict[str, Any]) -> str:
    return str(((pod.get("spec") or {}).get("containers") or [{}])[0].get("image", ""))


def _host_ip(node: dict[str, Any]) -> str:
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address", ""))
    return "192.168.0.1"


def _conditions(status: dict[str, Any], ready: bool, stamp: str) -> list[dict[str, Any]]:
    scheduled = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
    value = "True" if ready else "False"
    return [
        *scheduled,
        {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp},
        {"type": "ContainersReady", "status": value, "lastProbeTime": None, "lastTransitionTime": stamp},
        {"type": "Ready", "status": value, "lastProbeTime": None, "lastTransitionTime": stamp},
    ]


def _container_status(container: dict[str, Any], state: dict[str, Any], ready: bool) -> dict[str, Any]:
    return {
        "name": container.get("name", ""),
        "image": container.get("image", ""),
        "imageID": "",
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
    }


# ----------------------------------------------------------------------------------------- rank pods

#: The container command of dsx's rank pods (``python -m steps.readiness.launchers.rankpod``).
RANK_POD_COMMAND = ("python", "-m", "steps.readiness.launchers.rankpod")
#: Keys of the state ConfigMap rank 0 publishes into: the result file's text and the run's exit code.
STATE_RESULT = "result.json"
STATE_EXIT_CODE = "exit-code"


@dataclass
class RankPodArgs:
    """The rank pod contract: ``--publish NAME --result FILE --nnodes N --nproc-per-node G
    --master-addr HOST --master-port P -- MODULE ARGS...``."""

    publish: str
    result: str
    nnodes: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    module: str
    args: list[str]

    @classmethod
    def parse(cls, argv: list[str]) -> RankPodArgs:
        """Parse the arguments after the command; ``ValueError`` names what is wrong."""
        if "--" not in argv:
            raise ValueError("rankpod: expected -- MODULE ARGS... after the options")
        split = argv.index("--")
        options, rest = argv[:split], argv[split + 1 :]
        if not rest:
            raise ValueError("rankpod: no module after --")
        names = {
            "--publish": "publish",
            "--result": "result",
            "--nnodes": "nnodes",
            "--nproc-per-node": "nproc_per_node",
            "--master-addr": "master_addr",
            "--master-port": "master_port",
        }
        found: dict[str, str] = {}
        i = 0
        while i < len(options):
            flag, value = options[i], options[i + 1] if i + 1 < len(options) else None
            if "=" in flag:
                flag, value = flag.split("=", 1)
                i -= 1
            if flag not in names or value is None:
                raise ValueError(f"rankpod: unexpected argument {options[i]!r}")
            found[names[flag]] = value
            i += 2
        missing = sorted(set(names.values()) - set(found))
        if missing:
            raise ValueError(f"rankpod: missing {', '.join('--' + m.replace('_', '-') for m in missing)}")
        return cls(
            publish=found["publish"],
            result=found["result"],
            nnodes=int(found["nnodes"]),
            nproc_per_node=int(found["nproc_per_node"]),
            master_addr=found["master_addr"],
            master_port=int(found["master_port"]),
            module=rest[0],
            args=rest[1:],
        )


@dataclass
class _Group:
    """The pods of one group test, met in the kubelet double."""

    size: int
    members: dict[int, PodProcess] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    exit_code: int = 1
    lock: threading.Condition = field(default_factory=threading.Condition)

    def join(self, index: int, process: PodProcess) -> None:
        with self.lock:
            self.members[index] = process
            self.lock.notify_all()

    def wait_all(self, process: PodProcess) -> bool:
        """Wait until every index has a running pod; ``False`` if this pod is stopped first."""
        with self.lock:
            while not process.stopped.is_set():
                live = {i for i, p in self.members.items() if not p.stopped.is_set()}
                if live >= set(range(self.size)):
                    return True
                self.lock.wait(0.05)
        return False


def _rendezvous_error(process: PodProcess, args: RankPodArgs) -> str:
    """Why torchrun on this pod could not reach rank 0's address ('' if it could)."""
    pod = process.pod
    host = f"{pod['spec'].get('hostname', '')}.{pod['spec'].get('subdomain', '')}"
    namespace = process.namespace
    accepted = {
        host,
        f"{host}.{namespace}",
        f"{host}.{namespace}.svc",
        f"{host}.{namespace}.svc.cluster.local",
    }
    if args.master_addr not in accepted:
        return f"torchrun: rank 0's address {args.master_addr} is not pod {process.name}'s ({host})"
    subdomain = pod["spec"].get("subdomain", "")
    service = process.kubelet.emulator.get("services", subdomain, namespace)
    if service is None:
        return f"torchrun: cannot resolve {args.master_addr}: no Service {namespace}/{subdomain}"
    spec = service.get("spec") or {}
    selector = spec.get("selector") or {}
    labels = pod["metadata"].get("labels") or {}
    if (
        spec.get("clusterIP") != "None"
        or not selector
        or any(labels.get(k) != v for k, v in selector.items())
    ):
        return (
            f"torchrun: cannot resolve {args.master_addr}: Service {namespace}/{subdomain} is not a headless "
            "Service selecting rank 0's pod"
        )
    return ""


def _group_args(args: list[str], out: Path) -> list[str]:
    """The module's arguments for one machine: gloo instead of NCCL, the result file in ``out``."""
    result: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in ("--backend", "--out") and i + 1 < len(args):
            result += [args[i], "gloo" if args[i] == "--backend" else str(out)]
            i += 2
            continue
        result.append(args[i])
        i += 1
    if "--out" not in result:
        result += ["--out", str(out)]
    return result


def rank_pod_program(process: PodProcess) -> int:
    """A test double of ``python -m steps.readiness.launchers.rankpod`` (not the real program).

    Every pod of the group waits until all ``--nnodes`` pods run. Then index 0 checks what torchrun
    needs (rank 0's address is ``HOSTNAME.SUBDOMAIN`` of index 0's pod and a headless Service of that
    name selects it) and runs ``MODULE ARGS`` on this machine through the local launcher, one gloo
    rank per pod. When the run ends every other pod exits with its code at once, as their torchrun
    agents would; index 0 then publishes the result file's text and the exit code into the state
    ConfigMap ``--publish`` through the kubernetes client, as rank 0 would, even when its pod is being
    deleted meanwhile (within the grace period; a killed pod publishes nothing), and exits with the
    code (1 if it could not publish). A pod stopped before the run ends exits 143.
    """
    try:
        args = RankPodArgs.parse(process.command[len(RANK_POD_COMMAND) :])
        index = int(process.env.get("JOB_COMPLETION_INDEX", ""))
    except ValueError as exc:
        process.message = str(exc) or "JOB_COMPLETION_INDEX is not set"
        return 2
    group = process.kubelet.group(process.pod, args.nnodes)
    group.join(index, process)
    if index != 0:
        while not group.done.is_set():
            if not process.wait(0.05):
                return SIGTERM_EXIT
        return group.exit_code
    if not group.wait_all(process):
        return SIGTERM_EXIT
    code, text = _play_group(process, group, args)
    group.exit_code = code
    group.done.set()
    if process.killed.is_set():
        return SIGKILL_EXIT
    return _publish(process, args, code, text)


def torchrun_refusal(args: RankPodArgs) -> str:
    """What torchrun's own parser says of the pod's command line, ``''`` when it hands the module its flags
    as given: torchrun reads the whole line for its options, abbreviations included, and refuses a line
    where a program flag starts one of them (exit 2, as the real rank pod would)."""
    from torch.distributed import run as torchrun

    from steps.readiness.launchers.rankpod import torchrun_command

    options = argparse.Namespace(
        nnodes=args.nnodes,
        nproc_per_node=args.nproc_per_node,
        master_addr=args.master_addr,
        master_port=args.master_port,
        module=args.module,
        module_args=args.args,
    )
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parsed = torchrun.get_args_parser().parse_args(torchrun_command(options, 0)[3:])
    except SystemExit:
        return "torchrun: usage: " + " ".join(said.getvalue().split()[-12:])
    if (parsed.training_script, parsed.training_script_args) != (args.module, args.args):
        return f"torchrun: usage: took {parsed.training_script} {parsed.training_script_args} for the program"
    return ""


def _play_group(process: PodProcess, group: _Group, args: RankPodArgs) -> tuple[int, str]:
    """Run the group's module on this machine: ``(exit code, rank 0's result file text)``."""
    from steps.readiness.checks import RANK_PRELOAD
    from steps.readiness.launchers.local import launch_local

    problem = torchrun_refusal(args) or _rendezvous_error(process, args)
    folder = Path(tempfile.mkdtemp(prefix=f"{process.name}-", dir=process.kubelet.work_dir))
    out = folder / "result.json"
    code = 2 if problem.startswith("torchrun: usage") else 1
    if problem:
        process.message = problem
    else:
        hosts = [group.members[i].node for i in range(group.size)]
        result = launch_local(
            args.module,
            _group_args(args.args, out),
            world_size=group.size,
            work_dir=folder / "ranks",
            timeout_s=_time_left(process),
            rank_hosts=hosts,
            # what every rank program imports, once for all the pods this process plays (a torchrun
            # rank imports it for itself: the smoke run's DDP loads torch._dynamo, 2 s of CPU a rank)
            preload=list(RANK_PRELOAD),
        )
        code = 0 if result.ok else 1
    try:
        text = out.read_text(encoding="utf-8")
    except OSError as exc:
        text = json.dumps({"error": f"rank 0 wrote no result at {args.result}: {exc.strerror}"})
    with contextlib.suppress(OSError):
        shutil.rmtree(folder)
    return code, text


def _publish(process: PodProcess, args: RankPodArgs, code: int, text: str) -> int:
    """Store the result and exit code in the state ConfigMap, as rank 0 does; its exit code."""
    from steps.cluster import connect

    namespace = process.env.get("DSX_NAMESPACE") or process.namespace
    try:
        port = connect("kube", kubeconfig=str(process.kubelet.kubeconfig), namespace=namespace)
        # As the real rankpod: a patch of the state the step created, never a create (a step that
        # stopped waiting has deleted it, and a new one would be left behind).
        data = {"data": {STATE_RESULT: text, STATE_EXIT_CODE: str(code)}}
        port.patch_object("v1", "ConfigMap", args.publish, data, namespace)
    except Exception as exc:  # the real rankpod exits 1 when it cannot publish
        process.message = f"publish {args.publish}: {exc}"
        return 1
    return code


def _time_left(process: PodProcess) -> float:
    """Seconds until the pod's Job deadline (the group run cannot outlive it), else the kubelet's limit."""
    kubelet = process.kubelet
    refs = process.pod["metadata"].get("ownerReferences") or []
    owner: dict[str, Any] = next((r for r in refs if r.get("controller")), {})
    deadline = kubelet.emulator.job_deadline(process.namespace, str(owner.get("name", "")))
    if deadline is None:
        return kubelet.run_timeout_s
    return max(0.5, deadline - kubelet.emulator.clock())


# ----------------------------------------------------------------------------------------- a whole cluster


@dataclass
class EmulatedCluster:
    """An emulated API server with nodes, its kubelet double, and a kubeconfig for both."""

    emulator: Emulator
    kubelet: Kubelet | None
    kubeconfig: Path

    def port(self, namespace: str = "dsx") -> Any:
        """A :class:`steps.cluster.kube.KubeCluster` on this cluster, fast retries."""
        from steps.cluster import RetryPolicy, connect

        fast = RetryPolicy(attempts=6, base_delay=0.0, max_delay=0.0, jitter=0.0)
        return connect("kube", kubeconfig=str(self.kubeconfig), namespace=namespace, retry=fast)

    def service_account(self, name: str, namespace: str = "dsx") -> None:
        """Create a ServiceAccount (pods naming one that does not exist are refused)."""
        self.emulator.seed(
            [
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": name, "namespace": namespace},
                }
            ]
        )


@contextlib.contextmanager
def emulated_cluster(
    folder: Path,
    nodes: int = 16,
    racks: int = 4,
    gpu: str = "h100",
    spec: str = "",
    kubelet: bool = True,
    behaviours: dict[str, NodeBehaviour] | None = None,
    service_accounts: tuple[str, ...] = (),
    namespace: str = "dsx",
) -> Iterator[EmulatedCluster]:
    """An emulator seeded with a simulated fleet (``sim:nodes=N,gpu=G,racks=R,workloads=false`` unless
    ``spec`` names another) and, with ``kubelet``, the kubelet double running its pods."""
    from steps.cluster import load_fleet
    from tests.emulator.apiserver import Emulator, write_kubeconfig

    fleet = load_fleet(spec or f"sim:nodes={nodes},gpu={gpu},racks={racks},workloads=false")
    folder.mkdir(parents=True, exist_ok=True)
    emulator = Emulator()
    emulator.seed(fleet.manifests())
    emulator.start()
    config = write_kubeconfig(folder / "kubeconfig", emulator.url)
    double = Kubelet(emulator, config, folder, behaviours).start() if kubelet else None
    cluster = EmulatedCluster(emulator, double, config)
    for account in service_accounts:
        cluster.service_account(account, namespace)
    try:
        yield cluster
    finally:
        if double is not None:
            double.stop()
        emulator.stop()

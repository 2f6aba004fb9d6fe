"""Drain a node through the Eviction API only, never breaking a PodDisruptionBudget.

Each pod on the node is handled by its namespace's mode (:class:`NamespaceMode`):

- ``immediate``: evict at once with the mode's grace period;
- ``allow-completion``: a pod of a Job may finish its work: it is left alone until it ends or the
  mode's ``timeout_s`` passes, then evicted; other pods of the namespace are evicted at once;
- ``delete-after-timeout``: evict, and if a budget still blocks the eviction after ``timeout_s``,
  delete the pod outright (the one case, besides ``force``, where a pod leaves outside the Eviction
  API: the namespace's owner chose it).

DaemonSet pods (their controller would put them back at once, and they tolerate the cordon) and mirror
pods (static pods the kubelet runs from a file; the API cannot remove them; their controller reference is
the Node) are skipped.

An eviction the API refuses with 429 (a budget allows no disruption now) or 500 (two budgets select the
pod) is tried again with an exponential backoff, never turned into a deletion. The whole drain has a
deadline: when it passes with pods left, the report says ``escalate`` and the pods stay, unless the policy
says ``force``, in which case what is left is deleted and recorded as such.

The report (:class:`DrainReport`) records every pod with its mode, outcome, attempts and last message.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Literal

from pydantic import Field

from steps.cluster.errors import NotFoundError
from steps.cluster.port import ClusterPort, Pod
from steps.models import Frozen, Strict

__all__ = ["DrainMode", "DrainPolicy", "DrainReport", "NamespaceMode", "PodOutcome", "drain"]

DrainMode = Literal["immediate", "allow-completion", "delete-after-timeout"]
Outcome = Literal[
    "evicted", "gone", "completed", "deleted", "skipped-daemonset", "skipped-mirror", "blocked", "waiting"
]
_FINISHED = ("Succeeded", "Failed")


class NamespaceMode(Frozen):
    """How pods of one namespace leave a draining node.

    Attributes:
        mode: ``immediate``, ``allow-completion`` or ``delete-after-timeout``.
        grace_seconds: the eviction's grace period (``None``: the pod's own).
        timeout_s: for ``allow-completion``, how long a Job's pod may run on; for
            ``delete-after-timeout``, how long a budget may block before the pod is deleted.
    """

    mode: DrainMode = "immediate"
    grace_seconds: int | None = Field(None, ge=0)
    timeout_s: float = Field(600, ge=0)


class DrainPolicy(Frozen):
    """The drain's modes, deadline, force switch and backoff.

    Attributes:
        default: the mode of a namespace not listed in ``namespaces``.
        namespaces: modes by namespace.
        deadline_s: the whole drain's deadline, in seconds.
        force: after the deadline, delete the pods left instead of escalating the node.
        backoff_s: the first wait after a refused eviction; doubled each time, at most ``backoff_cap_s``.
        backoff_cap_s: the longest wait between two evictions of one pod.
        poll_s: how often the node's pods are read again while waiting.
    """

    default: NamespaceMode = Field(default_factory=NamespaceMode)
    namespaces: dict[str, NamespaceMode] = Field(default_factory=dict)
    deadline_s: float = Field(1800, ge=0)
    force: bool = False
    backoff_s: float = Field(1.0, gt=0)
    backoff_cap_s: float = Field(30.0, gt=0)
    poll_s: float = Field(1.0, gt=0)

    def mode_of(self, namespace: str) -> NamespaceMode:
        """The mode of a namespace."""
        return self.namespaces.get(namespace, self.default)


class PodOutcome(Strict):
    """What became of one pod of the drained node."""

    pod: str
    owner: str = ""
    mode: DrainMode = "immediate"
    outcome: Outcome = "waiting"
    attempts: int = 0
    message: str = ""
    at: str = ""


class DrainReport(Frozen):
    """The drain's result: whether the node is empty, whether to escalate, and every pod's outcome."""

    node: str
    complete: bool
    escalate: bool
    node_gone: bool = False
    forced: bool = False
    pods: list[PodOutcome] = Field(default_factory=list)
    message: str = ""

    def summary(self) -> str:
        """One line: the counts of each outcome."""
        counts: dict[str, int] = {}
        for pod in self.pods:
            counts[pod.outcome] = counts.get(pod.outcome, 0) + 1
        told = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no pods"
        return f"{self.node}: {self.message} ({told})"


def _skip(pod: Pod) -> Outcome | None:
    if pod.daemonset:
        return "skipped-daemonset"
    if pod.owner_kind == "Node":
        return "skipped-mirror"
    return None


def _stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def drain(
    port: ClusterPort,
    node: str,
    policy: DrainPolicy | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DrainReport:
    """Drain ``node`` by the policy; see the module docstring for the rules.

    The node should be cordoned first (else new pods may land as old ones leave). A node that
    disappears mid-drain ends the drain with ``node_gone`` (its pods went with it).

    Args:
        port: the cluster.
        node: the node's name.
        policy: modes, deadline, force, backoff (the defaults: every namespace immediate, 30 minutes).
        clock: monotonic seconds (tests pass a fake one with ``sleep``).
        sleep: waits between rounds.
    """
    policy = policy or DrainPolicy()
    start = clock()
    records: dict[str, PodOutcome] = {}
    next_try: dict[str, float] = {}
    backoff: dict[str, float] = {}
    first_blocked: dict[str, float] = {}
    forced = False

    def report(complete: bool, escalate: bool, message: str, gone: bool = False) -> DrainReport:
        return DrainReport(
            node=node,
            complete=complete,
            escalate=escalate,
            node_gone=gone,
            forced=forced,
            pods=[records[k] for k in sorted(records)],
            message=message,
        )

    while True:
        try:
            pods = port.pods_on(node)
        except NotFoundError:
            for record in records.values():
                if record.outcome in ("waiting", "blocked"):
                    record.outcome, record.message, record.at = "gone", "the node was deleted", _stamp()
            return report(False, False, "the node disappeared during the drain", gone=True)
        present = {p.ref: p for p in pods}
        for ref, record in records.items():
            if ref not in present and record.outcome in ("waiting", "blocked"):
                record.outcome, record.at = "gone", _stamp()
                record.message = record.message or "left the node before dsx evicted it"
        now = clock()
        left: list[Pod] = []
        for pod in pods:
            mode = policy.mode_of(pod.namespace)
            record = records.setdefault(
                pod.ref,
                PodOutcome(
                    pod=pod.ref, owner=f"{pod.owner_kind}/{pod.owner_name}".strip("/"), mode=mode.mode
                ),
            )
            skipped = _skip(pod)
            if skipped is not None:
                record.outcome = skipped
                record.at = record.at or _stamp()
                continue
            if record.outcome in ("evicted", "deleted", "completed"):
                left.append(pod)  # still terminating
                continue
            if pod.phase in _FINISHED and pod.owner_kind == "Job":
                # A finished Job pod holds nothing; evicting it ignores budgets (canIgnorePDB).
                result = port.evict(pod)
                record.outcome = "completed" if result.outcome != "blocked" else "blocked"
                record.attempts += 1
                record.message, record.at = result.message or f"the Job's pod {pod.phase}", _stamp()
                continue
            if mode.mode == "allow-completion" and pod.owner_kind == "Job" and now - start < mode.timeout_s:
                record.outcome, record.message = "waiting", "a Job's pod allowed to complete"
                left.append(pod)
                continue
            if now < next_try.get(pod.ref, 0.0):
                left.append(pod)
                continue
            if (
                mode.mode == "delete-after-timeout"
                and pod.ref in first_blocked
                and now - first_blocked[pod.ref] >= mode.timeout_s
            ):
                port.delete_pod(pod, mode.grace_seconds)
                record.outcome, record.at = "deleted", _stamp()
                record.message = (
                    f"deleted after its budget blocked eviction for {mode.timeout_s:g}s (namespace mode)"
                )
                left.append(pod)
                continue
            result = port.evict(pod, mode.grace_seconds)
            record.attempts += 1
            record.message, record.at = result.message, _stamp()
            if result.outcome == "blocked":
                record.outcome = "blocked"
                first_blocked.setdefault(pod.ref, now)
                wait = backoff.get(pod.ref, policy.backoff_s)
                next_try[pod.ref] = now + wait
                backoff[pod.ref] = min(wait * 2, policy.backoff_cap_s)
                left.append(pod)
            else:
                record.outcome = "evicted" if result.outcome == "evicted" else "gone"
                if result.outcome == "evicted":
                    left.append(pod)
        if not left:
            return report(True, False, "drained")
        if clock() - start >= policy.deadline_s:
            if not policy.force:
                stuck = ", ".join(p.ref for p in left)
                return report(
                    False, True, f"deadline of {policy.deadline_s:g}s passed with pods left: {stuck}"
                )
            forced = True
            for pod in left:
                record = records[pod.ref]
                if record.outcome in ("waiting", "blocked"):
                    port.delete_pod(pod, 0)
                    record.outcome, record.at = "deleted", _stamp()
                    record.message = f"deleted by force after the drain's deadline ({record.message})"
            return report(True, False, "drained by force after the deadline")
        sleep(policy.poll_s)

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

A bare pod (no controller; not finished) is lost for good once evicted: nothing makes it again. As
``kubectl drain`` refuses such a pod unless ``--force``, the drain refuses it unless the policy says
``force``: it evicts nothing and escalates at once, naming the bare pods (``unmanaged``). With ``force`` a
bare pod is evicted like any other.

An eviction the API refuses with 429 (a budget allows no disruption now) or 500 (two budgets select the
pod) is tried again with an exponential backoff, never turned into a deletion. So is a request the API
server did not take after the port's own retries (throttled by API Priority and Fairness, whose 429 the
port waits out as its ``Retry-After`` says, or unavailable): throttling is not failure, and the drain goes
on reading and evicting until its deadline. The whole drain has a deadline: when it passes with pods
left, the report says ``escalate`` and the pods stay, unless the policy says ``force``, in which case
what is left is deleted and recorded as such.

A node whose kubelet is not Ready (down, hung, cut off) never confirms that its pods stopped: on a real
cluster a pod evicted there stays terminating until the node returns, or until a person confirms the node
is down with the taint ``node.kubernetes.io/out-of-service`` and the pod garbage collector force-deletes it
(``pkg/controller/podgc/gc_controller.go``, ``gcTerminating``). Its controller has already replaced it
elsewhere (a ReplicaSet or Job counts a terminating pod as gone). So the drain waits for such a pod at most
``unreachable_wait_s`` after evicting it, then records it ``stranded`` and goes on, as ``kubectl drain
--skip-wait-for-delete-timeout`` does; it never force-deletes it (that is the out-of-service taint's, a
person's, call: a node that is only cut off may still run the pod).

The report (:class:`DrainReport`) records every pod with its mode, outcome, attempts and last message.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Literal

from pydantic import Field

from steps.cluster.errors import ApiUnavailableError, NotFoundError
from steps.cluster.port import ClusterPort, Pod
from steps.models import Frozen, Strict

__all__ = ["DrainMode", "DrainPolicy", "DrainReport", "NamespaceMode", "PodOutcome", "drain"]

DrainMode = Literal["immediate", "allow-completion", "delete-after-timeout"]
Outcome = Literal[
    "evicted",
    "gone",
    "completed",
    "deleted",
    "skipped-daemonset",
    "skipped-mirror",
    "unmanaged",
    "blocked",
    "waiting",
    "stranded",
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
        force: evict bare pods (no controller) too, and after the deadline delete the pods left instead of
            escalating the node.
        backoff_s: the first wait after a refused eviction; doubled each time, at most ``backoff_cap_s``.
        backoff_cap_s: the longest wait between two evictions of one pod.
        poll_s: how often the node's pods are read again while waiting.
        unreachable_wait_s: how long a pod evicted from a node that is not Ready may stay terminating
            before the drain stops waiting for it (``stranded``).
    """

    default: NamespaceMode = Field(default_factory=NamespaceMode)
    namespaces: dict[str, NamespaceMode] = Field(default_factory=dict)
    deadline_s: float = Field(1800, ge=0)
    force: bool = False
    backoff_s: float = Field(1.0, gt=0)
    backoff_cap_s: float = Field(30.0, gt=0)
    poll_s: float = Field(1.0, gt=0)
    unreachable_wait_s: float = Field(60, ge=0)

    def mode_of(self, namespace: str) -> NamespaceMode:
        """The mode of a namespace."""
        return self.namespaces.get(namespace, self.default)


class PodOutcome(Strict):
    """What became of one pod of the drained node.

    Attributes:
        pod: ``namespace/name``.
        owner: ``Kind/name`` of its controller (empty for a bare pod).
        mode: its namespace's drain mode.
        outcome: what became of it (``waiting`` while nothing has).
        attempts: the eviction (or deletion) requests made for it.
        message: the API's last word about it.
        at: when its outcome was last set.
    """

    pod: str
    owner: str = ""
    mode: DrainMode = "immediate"
    outcome: Outcome = "waiting"
    attempts: int = 0
    message: str = ""
    at: str = ""

    def settle(self, outcome: Outcome, message: str | None = None) -> None:
        """Set the outcome, stamped now (and the message, when one is given)."""
        self.outcome, self.at = outcome, _stamp()
        if message is not None:
            self.message = message


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


def _bare(pod: Pod) -> bool:
    """A pod no controller owns that has not finished: evicting it loses it for good."""
    return not pod.owner_kind and pod.phase not in _FINISHED


def _stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Drain:
    """One drain's bookkeeping: every pod's record, when each may be tried again, and its backoff."""

    def __init__(self, port: ClusterPort, node: str, policy: DrainPolicy, start: float) -> None:
        self.port, self.node, self.policy, self.start = port, node, policy, start
        self.records: dict[str, PodOutcome] = {}
        self.next_try: dict[str, float] = {}
        self.backoff: dict[str, float] = {}
        self.first_blocked: dict[str, float] = {}
        self.terminating_since: dict[str, float] = {}
        self.forced = False

    def report(self, complete: bool, escalate: bool, message: str, gone: bool = False) -> DrainReport:
        return DrainReport(
            node=self.node,
            complete=complete,
            escalate=escalate,
            node_gone=gone,
            forced=self.forced,
            pods=[self.records[k] for k in sorted(self.records)],
            message=message,
        )

    def unmanaged(self, pods: list[Pod]) -> DrainReport | None:
        """Unless the policy forces, a node with bare pods is not drained: nothing is evicted and the
        drain escalates at once, naming them (as ``kubectl drain`` refuses them without ``--force``)."""
        if self.policy.force:
            return None
        bare = [pod for pod in pods if _skip(pod) is None and _bare(pod)]
        if not bare:
            return None
        for pod in bare:
            record = self.records.setdefault(
                pod.ref, PodOutcome(pod=pod.ref, mode=self.policy.mode_of(pod.namespace).mode)
            )
            record.settle(
                "unmanaged", "no controller would make it again; evicted only when the policy forces"
            )
        names = ", ".join(pod.ref for pod in bare)
        return self.report(
            False,
            True,
            f"pods no controller manages are on the node: {names}; evicting them loses them for good, which "
            "only a drain policy with force does",
        )

    def node_gone(self) -> DrainReport:
        for record in self.records.values():
            if record.outcome in ("waiting", "blocked"):
                record.settle("gone", "the node was deleted")
        return self.report(False, False, "the node disappeared during the drain", gone=True)

    def round(self, pods: list[Pod], now: float) -> list[Pod]:
        """Act on every pod of the node once; the pods still on it (terminating, waiting or blocked)."""
        present = {p.ref for p in pods}
        for ref, record in self.records.items():
            if ref not in present and record.outcome in ("waiting", "blocked"):
                record.settle("gone", record.message or "left the node before dsx evicted it")
        return [pod for pod in pods if self.handle(pod, now)]

    def handle(self, pod: Pod, now: float) -> bool:
        """Act on one pod; whether it is still on the node."""
        mode = self.policy.mode_of(pod.namespace)
        record = self.records.setdefault(
            pod.ref,
            PodOutcome(pod=pod.ref, owner=f"{pod.owner_kind}/{pod.owner_name}".strip("/"), mode=mode.mode),
        )
        skipped = _skip(pod)
        if skipped is not None:
            record.outcome = skipped
            record.at = record.at or _stamp()
            return False
        if record.outcome in ("evicted", "deleted", "completed"):
            return True  # still terminating
        if pod.phase in _FINISHED and pod.owner_kind == "Job":
            # A finished Job pod holds nothing; evicting it ignores budgets (canIgnorePDB).
            result = self.port.evict(pod)
            record.outcome = "completed" if result.outcome != "blocked" else "blocked"
            record.attempts += 1
            record.message, record.at = result.message or f"the Job's pod {pod.phase}", _stamp()
            return False
        if mode.mode == "allow-completion" and pod.owner_kind == "Job" and now - self.start < mode.timeout_s:
            record.outcome, record.message = "waiting", "a Job's pod allowed to complete"
            return True
        if now < self.next_try.get(pod.ref, 0.0):
            return True
        blocked_since = self.first_blocked.get(pod.ref)
        if (
            mode.mode == "delete-after-timeout"
            and blocked_since is not None
            and now - blocked_since >= mode.timeout_s
        ):
            try:
                self.port.delete_pod(pod, mode.grace_seconds)
            except ApiUnavailableError as exc:
                return self.unanswered(pod, record, "deletion", exc, now)
            record.settle(
                "deleted",
                f"deleted after its budget blocked eviction for {mode.timeout_s:g}s (namespace mode)",
            )
            return True
        return self.evict(pod, record, mode, now)

    def evict(self, pod: Pod, record: PodOutcome, mode: NamespaceMode, now: float) -> bool:
        """Ask the Eviction API; a refusal waits its backoff. Whether the pod is still on the node."""
        try:
            result = self.port.evict(pod, mode.grace_seconds)
        except ApiUnavailableError as exc:
            return self.unanswered(pod, record, "eviction", exc, now)
        record.attempts += 1
        record.message, record.at = result.message, _stamp()
        if result.outcome == "blocked":
            record.outcome = "blocked"
            self.first_blocked.setdefault(pod.ref, now)
            self.wait(pod, now)
            return True
        record.outcome = "evicted" if result.outcome == "evicted" else "gone"
        return result.outcome == "evicted"

    def stranded(self, left: list[Pod], now: float) -> list[Pod]:
        """The pods left once those terminating for ``unreachable_wait_s`` on a node that is not Ready are
        recorded ``stranded`` (no kubelet will confirm them: see the module docstring)."""
        going = [p for p in left if self.records[p.ref].outcome in ("evicted", "deleted")]
        for pod in going:
            self.terminating_since.setdefault(pod.ref, now)
        due = [p for p in going if now - self.terminating_since[p.ref] >= self.policy.unreachable_wait_s]
        if not due:
            return left
        try:
            node = self.port.get_node(self.node)
        except (NotFoundError, ApiUnavailableError):
            return left  # the next round reads again
        if node.ready:
            return left
        ready = node.condition("Ready")
        said = f"Ready {ready.status}" if ready is not None else "no Ready condition"
        for pod in due:
            self.records[pod.ref].settle(
                "stranded",
                f"terminating for {self.policy.unreachable_wait_s:g}s on a node that is not Ready ({said}): "
                "no kubelet confirms it; it goes when the node returns or a person marks it out of service",
            )
        gone = {p.ref for p in due}
        return [p for p in left if p.ref not in gone]

    def wait(self, pod: Pod, now: float) -> None:
        """The pod is tried again after its backoff, doubled each time up to the cap."""
        wait = self.backoff.get(pod.ref, self.policy.backoff_s)
        self.next_try[pod.ref] = now + wait
        self.backoff[pod.ref] = min(wait * 2, self.policy.backoff_cap_s)

    def unanswered(
        self, pod: Pod, record: PodOutcome, what: str, exc: ApiUnavailableError, now: float
    ) -> bool:
        """The API server did not take the pod's ``what`` (throttled or away, past the port's retries): the
        pod is tried again after its backoff, as a refusal is. It is still on the node."""
        record.attempts += 1
        record.message, record.at = f"the API server did not take the {what}: {exc.detail}", _stamp()
        self.wait(pod, now)
        return True

    def past_deadline(self, left: list[Pod]) -> DrainReport:
        """Escalate with the pods left, or, when the policy says force, delete them and say so."""
        if not self.policy.force:
            stuck = ", ".join(p.ref for p in left)
            return self.report(
                False, True, f"deadline of {self.policy.deadline_s:g}s passed with pods left: {stuck}"
            )
        self.forced = True
        for pod in left:
            record = self.records[pod.ref]
            if record.outcome in ("waiting", "blocked"):
                try:
                    self.port.delete_pod(pod, 0)
                except ApiUnavailableError as exc:
                    return self.report(
                        False,
                        True,
                        f"deadline of {self.policy.deadline_s:g}s passed and {pod.ref} could not be "
                        f"deleted by force: the API server did not take it ({exc.detail})",
                    )
                record.settle("deleted", f"deleted by force after the drain's deadline ({record.message})")
        return self.report(True, False, "drained by force after the deadline")


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
    work = _Drain(port, node, policy, clock())
    while True:
        try:
            pods = port.pods_on(node)
        except NotFoundError:
            return work.node_gone()
        except ApiUnavailableError as exc:
            # Throttled or away past the port's retries: read again after a poll, until the deadline.
            if clock() - work.start >= policy.deadline_s:
                return work.report(
                    False,
                    True,
                    f"deadline of {policy.deadline_s:g}s passed: the API server did not answer the read of "
                    f"the node's pods ({exc.detail})",
                )
            sleep(policy.poll_s)
            continue
        refused = work.unmanaged(pods)
        if refused is not None:
            return refused
        left = work.stranded(work.round(pods, clock()), clock())
        if not left:
            stranded = [r.pod for r in work.records.values() if r.outcome == "stranded"]
            if stranded:
                return work.report(
                    True,
                    False,
                    f"drained; left terminating on a node that is not Ready: {', '.join(sorted(stranded))}",
                )
            return work.report(True, False, "drained")
        if clock() - work.start >= policy.deadline_s:
            return work.past_deadline(left)
        sleep(policy.poll_s)

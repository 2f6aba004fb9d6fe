"""The Job launcher: a group test's ranks as an Indexed Job on the cluster, from creation to cleanup.

The manifests are :mod:`steps.readiness.launchers.jobspec`'s; this module runs them. The lifecycle of one
group test, and the rule each step follows:

* **A stale copy is replaced, not a crash.** A 409 on create means an earlier try of this very step (a
  retried step, or a killed one) left its objects: they are deleted (Background), their pods waited out
  (bounded), and the objects created again. An object of that name that dsx did not make is an error.
* **The state ConfigMap is made first**, by the step; rank 0's pod (:mod:`steps.readiness.launchers.rankpod`)
  only updates it with its result and exit code, so it can never outlive its labels or owner.
* **Waiting ends when rank 0 has published, or the Job has ended** (``Complete`` or ``Failed``), never at
  the first failed pod: ``backoffLimitPerIndex: 0`` fails an index without failing the Job, so rank 0
  always gets to publish.
* **Two clocks.** The scheduling budget (``DSX_SCHEDULE_BUDGET_S``) runs from creation until every pod
  of the group is Running; running out is the verdict ``unschedulable``, which says nothing about the
  nodes. The run deadline (the check's ``timeout_s``) starts when all pods run; past it, ``hang``.
  The Job's own ``activeDeadlineSeconds`` counts from the Job's start, Pending and image pulls included,
  so it is the outer bound: budget + deadline + :data:`~steps.readiness.launchers.jobspec.JOB_GRACE_S`.
* **Cleanup always runs**: in ``finally``, and on SIGTERM (Argo stops a workflow by signalling its
  pods), which the waiting turns into :class:`Terminated` so that the ``finally`` runs. Everything is
  deleted with ``propagationPolicy: Background`` (a batch/v1 Job orphans its pods without it), and the
  step returns once the group's pods are gone, so the next test finds the GPUs free.
"""

import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from steps.cluster import ApiUnavailableError, ClusterPort, ConflictError
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError
from steps.readiness.judge import subject_name, verdict
from steps.readiness.launchers.base import Launched, RankProgram
from steps.readiness.launchers.jobspec import (
    RESULT_FILE,
    GroupJob,
    JobSettings,
    PlanLike,
    PodPatch,
    render_group_job,
    settings_for,
)
from steps.readiness.launchers.rankpod import STATE_ERROR, STATE_EXIT_CODE, STATE_RESULT, read_published
from steps.readiness.models import Model, Subject
from steps.readiness.outcomes import workflow_owner

__all__ = ["JobLauncher", "Terminated"]

#: The label and annotation the Job controller puts the completion index under (Kubernetes 1.28+).
_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
_RUNNING = ("Running", "Succeeded", "Failed")


class Terminated(SystemExit):
    """The step got SIGTERM while a group job ran: raised in the waiting so that cleanup runs.

    A :class:`SystemExit` with the shell's code for it (143), so no ``except Exception`` swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)


# ----------------------------------------------------------------------------- lifecycle


_KINDS = (("batch/v1", "Job"), ("v1", "Service"), ("v1", "ConfigMap"))


def _selector(group: GroupJob) -> str:
    return f"{vocab.LABEL_GROUP_TEST}={group.name}"


def _pods(port: ClusterPort, group: GroupJob) -> list[dict[str, Any]]:
    return port.list_objects("v1", "Pod", group.namespace, _selector(group))


def _is_ours(obj: dict[str, Any], group: GroupJob) -> bool:
    """Whether an object of the group's name was made by a dsx group test of that name."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(vocab.LABEL_GROUP_TEST) == group.name)


def _existing(port: ClusterPort, group: GroupJob) -> list[tuple[str, str, dict[str, Any]]]:
    """The group's Job, Service and state ConfigMap that exist, as ``(apiVersion, kind, object)``."""
    found = []
    for api_version, kind in _KINDS:
        obj = port.get_object(api_version, kind, group.name, group.namespace)
        if obj is not None:
            found.append((api_version, kind, obj))
    return found


def _remaining(port: ClusterPort, group: GroupJob) -> list[str]:
    """The group's own objects and pods that still exist, as ``kind/name``."""
    left = [f"{kind.lower()}/{group.name}" for _, kind, obj in _existing(port, group) if _is_ours(obj, group)]
    return left + [f"pod/{p['metadata']['name']}" for p in _pods(port, group)]


def _wait_gone(port: ClusterPort, group: GroupJob, settings: JobSettings, why: str) -> None:
    """Wait (bounded by ``stale_wait_s``) until none of the group's objects and pods is left."""
    deadline = time.monotonic() + settings.stale_wait_s
    while left := _remaining(port, group):
        if time.monotonic() > deadline:
            raise DsxError(
                f"group test {group.namespace}/{group.name}: {', '.join(left)} still there "
                f"{settings.stale_wait_s:g}s after {why}"
            )
        time.sleep(min(settings.poll_s, 1.0))


def _clear_stale(port: ClusterPort, group: GroupJob, settings: JobSettings) -> None:
    """Delete what an earlier try of this group test left (Background), and wait until it is gone.

    Raises:
        DsxError: an object of that name exists that dsx's group test did not make, or the stale
            objects did not go within ``stale_wait_s``.
    """
    found = _existing(port, group)
    for _, kind, obj in found:
        if not _is_ours(obj, group):
            raise DsxError(
                f"{kind} {group.namespace}/{group.name} exists and was not made by a dsx group test "
                f"(no {vocab.LABEL_GROUP_TEST}={group.name} label): delete or rename it"
            )
    pods = _pods(port, group)
    runs = sorted({str(o["metadata"]["labels"].get(vocab.LABEL_CERTIFICATION_RUN, "?")) for *_, o in found})
    what = ", ".join([f"{kind.lower()}/{group.name}" for _, kind, _ in found] + [f"{len(pods)} pods"])
    print(
        f"group test {group.namespace}/{group.name}: replacing what an earlier try left ({what}; "
        f"run {', '.join(runs) or '?'})",
        file=sys.stderr,
    )
    for api_version, kind, _ in found:
        port.delete_object(api_version, kind, group.name, group.namespace, propagation="Background")
    for pod in pods:
        port.delete_object("v1", "Pod", pod["metadata"]["name"], group.namespace, propagation="Background")
    _wait_gone(port, group, settings, "deleting them")


def _create(port: ClusterPort, group: GroupJob, settings: JobSettings) -> None:
    """Create the state ConfigMap, the Service and the Job, replacing a stale earlier try's copies.

    Pods of an earlier try still labelled for this group (its Job already deleted) are waited out
    first: they hold the GPUs, and rank 0 of a stale try must not publish into the new state.
    """
    if _pods(port, group):
        _clear_stale(port, group, settings)
    for attempt in range(2):
        try:
            for manifest in (group.state, group.service, group.job):
                port.create_object(manifest)
            return
        except ConflictError as exc:
            if attempt:
                raise DsxError(
                    f"group test {group.namespace}/{group.name}: {exc.target} exists again right after "
                    "dsx removed a stale copy: is another step running the same test?"
                ) from None
            _clear_stale(port, group, settings)


def _delete_group(port: ClusterPort, group: GroupJob, settings: JobSettings) -> None:
    """Delete the group's own Job, Service and state ConfigMap (Background); wait, bounded, for its pods.

    Only objects that carry the group's label are deleted (one of that name that dsx did not make is
    left alone). Never raises: a failure here must not hide how the test ended. What is left is
    reported on stderr; the Job's ``ttlSecondsAfterFinished`` and the Workflow's ownerReference
    remove it later.
    """
    try:
        for api_version, kind, obj in _existing(port, group):
            if _is_ours(obj, group):
                port.delete_object(api_version, kind, group.name, group.namespace, propagation="Background")
        _wait_gone(port, group, settings, "the test ended")
    except DsxError as exc:
        print(f"warning: cleaning up group test {group.namespace}/{group.name}: {exc}", file=sys.stderr)


class _StopOnSigterm:
    """Within the block, the first SIGTERM raises :class:`Terminated` so that the cleanup runs.

    Once :meth:`disarm` is called (the cleanup has begun) a SIGTERM is only noted, and raised as
    :class:`Terminated` when the block ends. Python runs signal handlers in the main thread only;
    elsewhere this does nothing.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.armed = True
        self.received: int | None = None
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> "_StopOnSigterm":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        if self.received is None:
            print(f"{self.what}: stopped by signal {signum}; deleting its objects", file=sys.stderr)
        self.received = signum
        if self.armed:
            self.armed = False
            raise Terminated(signum)

    def disarm(self) -> None:
        """From now on a SIGTERM waits for the end of the block."""
        self.armed = False

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
        if exc_type is None and self.received is not None:
            raise Terminated(self.received)


# ----------------------------------------------------------------------------- waiting


Ending = Literal["published", "ended", "unschedulable", "hang"]


class _Outcome(Model):
    ending: Ending
    state: dict[str, str] = Field(default_factory=dict)
    detail: str = ""


def _state(port: ClusterPort, group: GroupJob) -> dict[str, str]:
    return read_published(port.get_object("v1", "ConfigMap", group.name, group.namespace))


def _job_end(job: dict[str, Any] | None) -> str | None:
    """``Complete``/``Failed`` (with the reason and message) once the Job has ended, else ``None``."""
    if job is None:
        return "by deletion"
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            why = ": ".join(str(condition[k]) for k in ("reason", "message") if condition.get(k))
            return f"{condition['type']} ({why})" if why else str(condition["type"])
    return None


def _index(pod: dict[str, Any], job: str) -> int | None:
    meta = pod.get("metadata") or {}
    for source in (meta.get("labels") or {}, meta.get("annotations") or {}):
        if str(source.get(_INDEX_KEY, "")).isdigit():
            return int(source[_INDEX_KEY])
    host = str((pod.get("spec") or {}).get("hostname") or meta.get("name") or "")
    match = re.match(rf"^{re.escape(job)}-(\d+)", host)
    return int(match.group(1)) if match else None


def _waiting_for(pod: dict[str, Any]) -> str:
    """Why a pod is not running yet: its PodScheduled condition, else its containers' waiting reason."""
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled is not None and scheduled.get("status") != "True":
        reason = scheduled.get("reason") or "not scheduled"
        message = " ".join(str(scheduled.get("message") or "").split())
        return f"{reason}: {message}" if message else str(reason)
    if not node:
        return "not scheduled yet"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            message = " ".join(str(waiting.get("message") or "").split())
            reason = waiting.get("reason") or "waiting"
            return f"on {node}: {reason}" + (f": {message}" if message else "")
    return f"on {node}: {status.get('phase') or 'Pending'}"


def _not_running(pods: list[dict[str, Any]], group: GroupJob, nodes: int) -> list[str]:
    """One line per index whose pod has not run yet (Running, or already ended)."""
    newest: dict[int, dict[str, Any]] = {}
    for pod in pods:
        index = _index(pod, group.name)
        if index is None:
            continue
        stamp = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
        old = newest.get(index)
        if old is None or stamp >= str((old.get("metadata") or {}).get("creationTimestamp") or ""):
            newest[index] = pod
    lines = []
    for index in range(nodes):
        found = newest.get(index)
        if found is None:
            lines.append(f"index {index}: no pod yet")
        elif (found.get("status") or {}).get("phase") not in _RUNNING:
            lines.append(f"pod {found['metadata']['name']}: {_waiting_for(found)}")
    return lines


def _wait(
    port: ClusterPort, group: GroupJob, settings: JobSettings, nodes: int, timeout_s: float
) -> _Outcome:
    """Wait until rank 0 published, the Job ended, scheduling ran out of budget, or the run hung.

    A look that cannot reach the API server (after the port's own retries) is taken again at the next
    poll: the ranks run on while the server is away, and what they published is read once it answers.
    The clocks are read only after a look that succeeded, so an outage alone never ends a test as a hang.

    Raises:
        ApiUnavailableError: the API server stayed out of reach for ``api_outage_s``.
    """
    created = time.monotonic()
    running_since: float | None = None
    unreachable_since: float | None = None
    while True:
        try:
            state = _state(port, group)
            if STATE_EXIT_CODE in state:
                return _Outcome(ending="published", state=state)
            ended = _job_end(port.get_object("batch/v1", "Job", group.name, group.namespace))
            if ended is not None:
                return _Outcome(ending="ended", state=_state(port, group), detail=ended)
            waiting = _not_running(_pods(port, group), group, nodes) if running_since is None else []
        except ApiUnavailableError as exc:
            now = time.monotonic()
            unreachable_since = now if unreachable_since is None else unreachable_since
            if now - unreachable_since > settings.api_outage_s:
                raise
            print(f"warning: {group.name}: {exc}; looking again in {settings.poll_s:g}s", file=sys.stderr)
            time.sleep(settings.poll_s)
            continue
        unreachable_since = None
        now = time.monotonic()
        if running_since is None:
            if not waiting:
                running_since = now
            elif now - created > settings.schedule_budget_s:
                return _Outcome(ending="unschedulable", detail="; ".join(waiting))
        if running_since is not None and now - running_since > timeout_s:
            return _Outcome(ending="hang")
        time.sleep(settings.poll_s)


def _ending(
    outcome: _Outcome, settings: JobSettings, subject: Subject, name: str, timeout_s: float
) -> tuple[Literal["unschedulable", "hang", "error"], str]:
    """What a group job that brought back no result says: the verdict's status and message."""
    where = f"{subject_name(subject)}: job {name}"
    if outcome.ending == "unschedulable":
        return "unschedulable", (
            f"{where}: not every pod was running within the scheduling budget of "
            f"{settings.schedule_budget_s:g}s, so nothing was measured: {outcome.detail}"
        )
    if outcome.ending == "hang":
        return "hang", f"{where} did not finish within {timeout_s:g}s of all its pods running"
    if STATE_EXIT_CODE in outcome.state:
        why = outcome.state.get(STATE_ERROR) or "no result file"
        return "error", f"{where}: rank 0 exited {outcome.state[STATE_EXIT_CODE]} without a result: {why}"
    return "error", f"{where}: the Job ended {outcome.detail} without a result from rank 0"


@dataclass(frozen=True)
class JobLauncher:
    """Runs a check's ranks as a group job on the cluster: one pod per member of the subject, each
    running ``settings.gpus_per_node`` ranks under torchrun; ``pod_patch`` fits the pods to the fabric."""

    settings: JobSettings
    port: ClusterPort
    pod_patch: PodPatch | None = None

    @classmethod
    def for_plan(cls, plan: PlanLike, port: ClusterPort, pod_patch: PodPatch | None = None) -> "JobLauncher":
        """The launcher of a certification plan's group jobs (:func:`settings_for`).

        Raises:
            InputError: no GPU image is known, or a budget in the environment is malformed.
        """
        return cls(settings_for(plan, port), port, pod_patch)

    def run(self, test: str, subject: Subject, program: RankProgram, timeout_s: float) -> Launched:
        """Run ``program`` as the group job of ``test`` on ``subject``'s nodes; rank 0's result text.

        The verdicts are those the ending itself gives: ``unschedulable`` (the pods could not all be
        scheduled within the budget), ``hang`` (no result within ``timeout_s`` of all pods running) or
        ``error`` (the Job ended without a result from rank 0, or rank 0 wrote none). Only the result
        travels back (in the state ConfigMap): rank 0's other outputs stay in its pod.
        """
        settings, port = self.settings, self.port
        flag = program.outputs[0][0]
        group = render_group_job(
            test,
            subject,
            program.module,
            [*program.args, flag, RESULT_FILE],
            settings,
            timeout_s,
            owner_references=workflow_owner(port, settings.run, settings.namespace),
            pod_patch=self.pod_patch,
        )
        started = time.monotonic()
        with _StopOnSigterm(f"group test {group.namespace}/{group.name}") as stop:
            try:
                _create(port, group, settings)
                outcome = _wait(port, group, settings, len(subject.members), timeout_s)
            finally:
                stop.disarm()
                _delete_group(port, group, settings)
        where = f"job/{group.namespace}/{group.name}"
        text = outcome.state.get(STATE_RESULT) if outcome.ending in ("published", "ended") else None
        verdicts = []
        if text is None:
            status, message = _ending(outcome, settings, subject, group.name, timeout_s)
            verdicts.append(verdict(subject, test, status, message, evidence=[where]))
        return Launched(
            text=text,
            verdicts=verdicts,
            logs=[where],
            where=where,
            elapsed_s=round(time.monotonic() - started, 3),
        )

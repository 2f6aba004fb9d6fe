"""Where the certification steps leave their full outcomes for the steps after them: ConfigMaps.

A check's full outcome (its collective run, every verdict, the evidence kept) cannot travel as an Argo
parameter once a fleet has more than a few dozen nodes: Argo aggregates a fan-out's results into one JSON
list, a step's inputs reach its container inside the template Argo passes it, and Linux caps a single
argument or environment variable at 128 KiB. So each check writes its full outcome into a ConfigMap of its
own in the run's namespace, labelled with the workflow's uid, and returns one short line
(:class:`CheckResult`); the smoke and report steps read the outcomes back by that label. The ConfigMaps
are owned by the Workflow, so Kubernetes deletes them with it, and the report step deletes them once the
report is written. A ConfigMap holds up to 1 MiB: the outcome is stored gzip-compressed, and one that is
still too big is an error naming the subject, never a truncated result.
"""

import base64
import gzip
import hashlib
import json
import os
import uuid
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from steps.cluster import ClusterPort, holds
from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ConflictError
from steps.errors import DsxError
from steps.readiness.check import CheckKind, CheckOutcome
from steps.readiness.models import Model, VerdictStatus

__all__ = [
    "LOCAL_RUN_NAME",
    "MAX_STORED_BYTES",
    "CheckResult",
    "DocumentKind",
    "OutcomeStore",
    "RunRef",
    "check_result",
    "keep_report",
    "newest_report",
    "workflow_owner",
]

Result = TypeVar("Result", bound=BaseModel)

DocumentKind = Literal["plan", "recipe"]
"""What the run's first steps leave for every later one: the plan and the recipe's thresholds. Passed as
parameters they would be copied into every check's inputs, and the Workflow object (at most 1 MiB in
etcd) would grow with the square of the fleet."""

#: The most a stored outcome may take, compressed: a ConfigMap holds 1 MiB, names and labels included.
MAX_STORED_BYTES = 900 * 1024

_DATA_KEY = "outcome.json.gz"
_WORKFLOW_API = "argoproj.io/v1alpha1"


LOCAL_RUN_NAME = holds.LOCAL_RUN_NAME


class RunRef(Model):
    """The certification run the outcomes belong to: the Argo Workflow's name and uid, and the namespace
    its outcomes are kept in (the one the plan step's port uses, so every step finds them)."""

    name: str = Field(min_length=1)
    uid: str = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    namespace: str = Field(min_length=1)

    @classmethod
    def local(cls, namespace: str) -> "RunRef":
        """A run with no Workflow object behind it (a step called directly, not by Argo)."""
        return cls(name=LOCAL_RUN_NAME, uid=str(uuid.uuid4()), namespace=namespace)


def workflow_owner(port: ClusterPort, run: RunRef, namespace: str) -> list[dict[str, object]]:
    """The ``ownerReferences`` that tie an object in ``namespace`` to the run's Workflow, or none.

    Only when the Workflow exists there with the run's uid: the garbage collector deletes at once an
    object whose owner is absent, and an owner reference cannot cross namespaces (the collector looks
    the owner up in the dependent's own namespace). A local run, or objects kept elsewhere, get none.
    """
    if namespace != run.namespace:
        return []
    workflow = port.get_object(_WORKFLOW_API, "Workflow", run.name, run.namespace)
    if workflow is None or (workflow.get("metadata") or {}).get("uid") != run.uid:
        return []
    return [{"apiVersion": _WORKFLOW_API, "kind": "Workflow", "name": run.name, "uid": run.uid}]


class CheckResult(Model):
    """A check's result as the workflow carries it: which test, who, the status, and one line saying why."""

    test: str
    subject: str
    status: VerdictStatus
    message: str


def check_result(outcome: CheckOutcome[Any]) -> CheckResult:
    """The short result of an outcome: its worst verdict's message (its first verdict's when it passed)."""
    worst = next((v for v in outcome.verdicts if v.status == outcome.status), None)
    message = worst.message if worst is not None else f"{outcome.subject.name}: {outcome.status}"
    return CheckResult(
        test=outcome.test, subject=outcome.subject.name, status=outcome.status, message=message[:500]
    )


#: The ``dsx.dev/outcome`` label of a stored check outcome (its test is in ``dsx.dev/test``).
CHECK_OUTCOME = "check"


class OutcomeStore:
    """The outcomes of one certification run, one ConfigMap each, in the run's namespace.

    A check's outcome is kept under its test and subject, whatever the test: a test registered later
    is stored and read back as the ones before it.
    """

    def __init__(self, port: ClusterPort, run: RunRef) -> None:
        self.port = port
        self.run = run

    def put(self, outcome: CheckOutcome[Any]) -> str:
        """Store ``outcome`` under its test and subject (replacing the one a retried step stored before);
        returns the ConfigMap name.

        Raises:
            DsxError: the outcome is too big for a ConfigMap even compressed.
        """
        subject = outcome.subject
        labels = {vocab.LABEL_OUTCOME_KIND: CHECK_OUTCOME, vocab.LABEL_OUTCOME_TEST: outcome.test}
        key = f"{CHECK_OUTCOME}/{outcome.test}/{subject.kind}/{subject.name}"
        what = f"{outcome.test} of {subject.kind} {subject.name}"
        return self._put(key, labels, subject.name, outcome.model_dump_json(), what)

    def put_document(self, kind: DocumentKind, text: str) -> str:
        """Store the run's ``plan`` or ``recipe`` (JSON text), replacing an earlier copy."""
        return self._put(f"{kind}/{kind}", {vocab.LABEL_OUTCOME_KIND: kind}, kind, text, f"the run's {kind}")

    def document(self, kind: DocumentKind) -> str:
        """The run's stored ``plan`` or ``recipe``.

        Raises:
            DsxError: the run stored none (its plan step did not run in this namespace).
        """
        found = self._read(self._selector(kind))
        if not found:
            raise DsxError(
                f"certification run {self.run.name} ({self.run.uid}) has no stored {kind} in namespace "
                f"{self.run.namespace}: its plan step did not finish, or the run's objects were deleted"
            )
        return found[0]

    def outcomes(
        self, kind: CheckKind[Result], subjects: Literal["node", "group"] | None = None
    ) -> list[CheckOutcome[Result]]:
        """The stored outcomes of ``kind``'s test (of ``subjects``: ``node`` or ``group`` only, when
        given), by subject name."""
        texts = self._read(self._selector(CHECK_OUTCOME, kind.test))
        found = [kind.outcome.model_validate_json(text) for text in texts]
        return sorted((o for o in found if subjects in (None, o.subject.kind)), key=_by_subject)

    def every_outcome(self, but: str | None = None) -> list[CheckOutcome[Any]]:
        """Every stored check outcome, whatever its test (``but`` one test's, left out by the label
        selector, so the API server does not send them), by test and subject."""
        selector = self._selector(CHECK_OUTCOME) + (f",{vocab.LABEL_OUTCOME_TEST}!={but}" if but else "")
        found = [CheckOutcome[Any].model_validate_json(text) for text in self._read(selector)]
        return sorted(found, key=lambda o: (o.test, *_by_subject(o)))

    def delete(self) -> int:
        """Delete every outcome of the run; returns how many there were."""
        found = self.port.list_objects("v1", "ConfigMap", self.run.namespace, self._selector())
        for item in found:
            self.port.delete_object("v1", "ConfigMap", item["metadata"]["name"], self.run.namespace)
        return len(found)

    def _selector(self, kind: str | None = None, test: str | None = None) -> str:
        selector = f"{vocab.LABEL_CERTIFICATION_RUN}={self.run.uid}"
        selector += f",{vocab.LABEL_OUTCOME_KIND}={kind}" if kind else ""
        return selector + (f",{vocab.LABEL_OUTCOME_TEST}={test}" if test else "")

    def _put(self, key: str, labels: dict[str, str], subject: str, text: str, what: str) -> str:
        packed = gzip.compress(text.encode(), mtime=0)
        if len(packed) > MAX_STORED_BYTES:
            raise DsxError(
                f"{what}: it takes {len(packed)} bytes compressed, more than a ConfigMap "
                f"holds ({MAX_STORED_BYTES})"
            )
        digest = hashlib.sha256(f"{self.run.uid}/{key}".encode()).hexdigest()[:20]
        name = f"dsx-outcome-{labels[vocab.LABEL_OUTCOME_KIND]}-{digest}"
        data = {_DATA_KEY: base64.b64encode(packed).decode()}
        metadata: dict[str, object] = {
            "name": name,
            "namespace": self.run.namespace,
            "labels": {vocab.LABEL_CERTIFICATION_RUN: self.run.uid, **labels},
            "annotations": {vocab.ANNOTATION_SUBJECT: subject, vocab.ANNOTATION_WORKFLOW: self.run.name},
        }
        owner = workflow_owner(self.port, self.run, self.run.namespace)
        if owner:
            metadata["ownerReferences"] = owner
        manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "binaryData": data}
        try:
            self.port.create_object(manifest)
        except ConflictError:  # a retried step: the earlier try stored its outcome
            self.port.patch_object("v1", "ConfigMap", name, {"binaryData": data}, self.run.namespace)
        return name

    def _read(self, selector: str) -> list[str]:
        found = self.port.list_objects("v1", "ConfigMap", self.run.namespace, selector)
        texts = []
        for item in found:
            name = (item.get("metadata") or {}).get("name")
            encoded = (item.get("binaryData") or {}).get(_DATA_KEY)
            if not isinstance(encoded, str):
                raise DsxError(f"ConfigMap {self.run.namespace}/{name}: no {_DATA_KEY} in it")
            try:
                texts.append(gzip.decompress(base64.b64decode(encoded, validate=True)).decode())
            except (ValueError, OSError, EOFError) as exc:
                where = f"ConfigMap {self.run.namespace}/{name}"
                raise DsxError(f"{where}: unreadable outcome ({exc})") from None
        return texts


def _by_subject(outcome: CheckOutcome[Any]) -> tuple[str, str]:
    return outcome.subject.kind, outcome.subject.name


#: How many certification reports are kept in ConfigMaps per namespace (``DSX_REPORTS_KEPT``), newest first.
REPORTS_KEPT = 20
_REPORT_KEY = "report.json.gz"


def keep_report(port: ClusterPort, run: RunRef, report_json: str, markdown: str) -> str:
    """Keep the certification report in a ConfigMap ``dsx-report-<workflow>``; returns its name.

    The report must survive without an artifact repository (a default Argo install has none) and after
    the Workflow is garbage-collected, so the ConfigMap is not owned by the Workflow; the newest
    ``DSX_REPORTS_KEPT`` (20) reports of the namespace are kept, older ones deleted. The JSON is stored
    gzip-compressed; when even that is too big, the checks' raw results (a sweep's rows, a smoke run's
    step times) are dropped from the copy, the biggest first and no more than needed (the verdicts, node
    results and figures judged stay), and the ConfigMap says how many.
    """
    packed, note = _packed_report(report_json)
    if len(packed) > MAX_STORED_BYTES:
        raise DsxError(f"certification report of {run.name}: {len(packed)} bytes compressed, too big to keep")
    name = f"dsx-report-{run.name}"[:253].rstrip("-.")
    body: dict[str, object] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": run.namespace,
            # Not labelled with the run: the run's objects are deleted once the report holds them.
            "labels": {vocab.LABEL_CERTIFICATION_REPORT: "true"},
            "annotations": {
                vocab.ANNOTATION_WORKFLOW: run.name,
                vocab.ANNOTATION_WORKFLOW_UID: run.uid,
                vocab.ANNOTATION_REPORT_CONTENTS: note,
            },
        },
        "binaryData": {_REPORT_KEY: base64.b64encode(packed).decode()},
    }
    if len(markdown.encode()) + len(packed) * 4 // 3 < MAX_STORED_BYTES:
        body["data"] = {"report.md": markdown}
    try:
        port.create_object(body)
    except ConflictError:  # a retried report step
        port.patch_object(
            "v1",
            "ConfigMap",
            name,
            {k: v for k, v in body.items() if k in ("binaryData", "data")},
            run.namespace,
        )
    _prune_reports(port, run.namespace)
    return name


def _packed_report(report_json: str) -> tuple[bytes, str]:
    """The report compressed, with as few of its checks' results dropped as make it fit (the fewest
    found by halving, the biggest results dropped first), and what the copy holds."""
    packed = gzip.compress(report_json.encode(), mtime=0)
    if len(packed) <= MAX_STORED_BYTES:
        return packed, "complete"
    data = json.loads(report_json)
    outcomes = data.get("outcomes") or []
    biggest = sorted(
        (i for i, o in enumerate(outcomes) if o.get("result") is not None),
        key=lambda i: -len(json.dumps(outcomes[i]["result"])),
    )
    if not biggest:
        return packed, "complete"
    results = [o.get("result") for o in outcomes]

    def without(count: int) -> bytes:
        for index, outcome in enumerate(outcomes):
            outcome["result"] = results[index]
        for index in biggest[:count]:
            outcomes[index]["result"] = None
        return gzip.compress(json.dumps(data, sort_keys=True).encode(), mtime=0)

    low, high = 1, len(biggest)
    while low < high:
        middle = (low + high) // 2
        if len(without(middle)) <= MAX_STORED_BYTES:
            high = middle
        else:
            low = middle + 1
    note = (
        f"results of {low} of {len(outcomes)} checks dropped: too big for a ConfigMap; the artifact has them"
    )
    return without(low), note


def _reports_newest_first(port: ClusterPort, namespace: str) -> list[dict[str, Any]]:
    found = port.list_objects("v1", "ConfigMap", namespace, f"{vocab.LABEL_CERTIFICATION_REPORT}=true")
    return sorted(
        found,
        key=lambda o: (str(o["metadata"].get("creationTimestamp") or ""), o["metadata"]["name"]),
        reverse=True,
    )


def newest_report(port: ClusterPort, namespace: str) -> tuple[str, str] | None:
    """The newest certification report kept in ``namespace``: its ConfigMap's name and the report's JSON
    (``None``: no report kept).

    Raises:
        DsxError: the newest report's ConfigMap does not hold a gzip-compressed report.
    """
    for found in _reports_newest_first(port, namespace):
        name = str(found["metadata"]["name"])
        encoded = (found.get("binaryData") or {}).get(_REPORT_KEY)
        try:
            return name, gzip.decompress(base64.b64decode(str(encoded), validate=True)).decode()
        except (ValueError, OSError, EOFError) as exc:
            raise DsxError(
                f"ConfigMap {name}: key {_REPORT_KEY} is not a gzip-compressed report ({exc})"
            ) from None
    return None


def _prune_reports(port: ClusterPort, namespace: str) -> None:
    try:
        kept = max(1, int(os.environ.get(vocab.ENV_REPORTS_KEPT, str(REPORTS_KEPT))))
    except ValueError:
        kept = REPORTS_KEPT
    for old in _reports_newest_first(port, namespace)[kept:]:
        port.delete_object("v1", "ConfigMap", old["metadata"]["name"], namespace)

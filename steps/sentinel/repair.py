"""The repair request ``dsx-remediate`` makes: what to do to the node, to which GPUs, and why.

Once the node is drained, ``request-repair`` asks for its repair in two places an operator's tooling
reads:

- the node's label ``dsx.dev/repair`` names the action (``reset-gpu``, ``reboot``, ``replace``,
  ``contact-support``), so ``kubectl get nodes -l dsx.dev/repair=reboot`` lists what waits for a reboot;
- the ConfigMap ``dsx-repair-<node>`` in dsx's namespace (labelled ``dsx.dev/node`` and
  ``dsx.dev/repair``) holds the request as one YAML document, ``request.yaml`` (kind ``RepairRequest``):
  the node, its boot id, the check and the workflow that asks; the action and severity the sentinel's
  condition gives; the GPUs its findings name (UUID, PCI address, index); and the evidence, ready to
  hand to a vendor: each finding of the condition as the agent wrote it (an XID's kernel-log line
  among them), the condition itself, the node's last certification, and the newest Events about the
  node (the sentinel's findings as it saw them, remediation's steps, the kubelet's).

The request goes once the node is back in service; an escalated node keeps it (the case for the vendor).
The action and GPUs are read from the check's node condition: its reason says the worst finding's
severity and action, and its message lists every finding as ``SEVERITY (ACTION): MESSAGE``, separated by
``; ``, each GPU named as the agent names it, ``GPU 3 (GPU-<uuid>, PCI 0000:3b:00)``.
"""

import re
from typing import Any, get_args

import yaml
from pydantic import Field

from steps.cluster import ClusterPort, Node
from steps.cluster import vocabulary as vocab
from steps.cluster.port import NODE_EVENT_NAMESPACE
from steps.errors import DsxError, InputError
from steps.models import Camel, Frozen
from steps.sentinel import ledger
from steps.sentinel.events import Action, Severity, condition_reading
from steps.sentinel.outcome import requested_gpus
from steps.sentinel.reconcile import create_workflow

__all__ = [
    "EVENTS_KEPT",
    "TEMPLATE_ACTIONS",
    "TEMPLATE_PARAMETERS",
    "Finding",
    "NodeEvent",
    "RepairGpu",
    "RepairRequest",
    "TemplateCall",
    "build_request",
    "call_template",
    "clear_request",
    "findings",
    "gpus_named",
    "node_events",
    "request_name",
    "template_call",
    "workflow_phase",
    "write_request",
]

PREFIX = "dsx-repair-"
"""The request objects' name prefix: ``dsx-repair-<node>``."""
DEFAULT_ACTION: Action = "reboot"
"""The action asked for when the check's condition names none (it cleared, or it is not the agent's)."""

TEMPLATE_PARAMETERS = {
    "node": "The node to repair.",
    "action": "The action asked for (reset-gpu, reboot, replace, contact-support).",
    "gpus": "The UUIDs of the GPUs the request names, comma-separated.",
    "request": "The ConfigMap holding the whole request (request.yaml, kind RepairRequest).",
    "requested-at": "When dsx-remediate asked.",
    "boot-id": "The node's boot id when it asked.",
    "workflow": "The dsx-remediate Workflow that asks.",
}
"""The parameters a Workflow of the operator's repair template is given, and what each holds."""
TEMPLATE_ACTIONS = "replace"
"""The actions handed to the operator's WorkflowTemplate by default."""
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_FINDING = re.compile(r"^(fatal|degraded|info) \(([a-z-]+)\): ")
_GPU = re.compile(r"\bGPU (\d+) \(([^,()\s]+)(?:, PCI ([0-9a-fA-F:.]+))?\)")


class RepairGpu(Frozen):
    """A GPU a repair is for, as the sentinel's findings name it."""

    index: int
    uuid: str
    pci: str = ""


class Finding(Frozen):
    """One finding of the sentinel's condition: its severity, the action it asks for, what it says."""

    severity: str
    action: str
    message: str


EVENTS_KEPT = 50
"""The newest Events about the node a request keeps as evidence."""


class NodeEvent(Camel):
    """An Event about the node, as the evidence keeps it."""

    reason: str
    type: str = ""
    message: str = ""
    count: int = 1
    first_seen: str = ""
    last_seen: str = ""
    source: str = ""


class RepairRequest(Camel):
    """A repair request (kind ``RepairRequest``): ``request.yaml`` of ``dsx-repair-<node>``."""

    api_version: str = "dsx.dev/v1alpha1"
    kind: str = "RepairRequest"
    node: str
    boot_id: str = ""
    check: str
    workflow: str = ""
    requested_at: str
    action: Action
    severity: Severity | None = None
    gpus: list[RepairGpu] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    condition: dict[str, str] = Field(default_factory=dict)
    certification: dict[str, str] = Field(default_factory=dict)
    events: list[NodeEvent] = Field(default_factory=list)
    events_note: str = ""
    """Why the Events are missing, when they could not be read."""


def findings(message: str) -> list[Finding]:
    """The findings a sentinel condition's message lists (``SEVERITY (ACTION): MESSAGE; ...``); a part
    that starts no finding belongs to the one before (a message holding ``; `` itself)."""
    found: list[Finding] = []
    for part in message.split("; ") if message else []:
        head = _FINDING.match(part)
        if head is not None:
            found.append(Finding(severity=head.group(1), action=head.group(2), message=part[head.end() :]))
        elif found:
            found[-1] = found[-1].model_copy(update={"message": f"{found[-1].message}; {part}"})
    return found


def gpus_named(text: str) -> list[RepairGpu]:
    """Every GPU ``text`` names as the agent does (``GPU 3 (GPU-<uuid>, PCI 0000:3b:00)``), once each,
    in order."""
    gpus: dict[str, RepairGpu] = {}
    for index, uuid, pci in _GPU.findall(text):
        gpus.setdefault(uuid, RepairGpu(index=int(index), uuid=uuid, pci=pci.lower()))
    return list(gpus.values())


def node_events(port: ClusterPort, node: str) -> tuple[list[NodeEvent], str]:
    """The newest :data:`EVENTS_KEPT` Events about ``node`` (the sentinel's, remediation's, the kubelet's:
    every Event about a Node lives in namespace ``default``), oldest first; and, when they could not be
    read, why (the request is made without them)."""
    try:
        items = port.list_objects("v1", "Event", NODE_EVENT_NAMESPACE)
    except DsxError as exc:
        return [], f"the Events about {node} could not be read: {exc}"
    found: list[NodeEvent] = []
    for event in items:
        about = event.get("involvedObject") or {}
        if about.get("kind") != "Node" or about.get("name") != node:
            continue
        first = str(event.get("firstTimestamp") or event.get("eventTime") or "")
        source = event.get("source") or {}
        found.append(
            NodeEvent(
                reason=str(event.get("reason") or ""),
                type=str(event.get("type") or ""),
                message=str(event.get("message") or ""),
                count=int(event.get("count") or 1),
                first_seen=first,
                last_seen=str(event.get("lastTimestamp") or first),
                source=str(source.get("component") or event.get("reportingComponent") or ""),
            )
        )
    found.sort(key=lambda e: e.last_seen)
    return found[-EVENTS_KEPT:], ""


def request_name(node: str) -> str:
    """The name of ``node``'s request object: ``dsx-repair-<node>`` (hashed where too long)."""
    return ledger.node_object_name(PREFIX, node)


def build_request(
    node: Node,
    check: str,
    workflow: str,
    at: str,
    events: tuple[list[NodeEvent], str] = ([], ""),
) -> RepairRequest:
    """The request for ``node``'s repair after ``check`` found it faulty, from its condition now, with the
    ``events`` about it (:func:`node_events`) as evidence.

    The action and severity are the condition's (its worst finding's); the GPUs are those named by the
    findings that ask for that action, or by any finding when none of those names one.
    """
    condition_type = vocab.CONDITION_SENTINEL.get(check, "")
    condition = node.condition(condition_type) if condition_type else None
    written: dict[str, Any] = {}
    if condition is not None:
        written = {
            "type": condition.type,
            "status": condition.status,
            "reason": condition.reason,
            "message": condition.message,
            "lastTransitionTime": condition.last_transition_time or "",
        }
    reading = condition_reading(node.name, check, written) if written else None
    listed = findings(str(written.get("message", "")))
    action: Action = reading.action if reading is not None else DEFAULT_ACTION
    asked = [f for f in listed if f.action == action]
    gpus = gpus_named(" ".join(f.message for f in asked)) or gpus_named(" ".join(f.message for f in listed))
    certification = {
        key: value
        for key, value in {
            vocab.LABEL_CERTIFICATION: node.labels.get(vocab.LABEL_CERTIFICATION, ""),
            vocab.ANNOTATION_CERTIFICATION_REASON: node.annotations.get(
                vocab.ANNOTATION_CERTIFICATION_REASON, ""
            ),
        }.items()
        if value
    }
    return RepairRequest(
        node=node.name,
        boot_id=node.node_info.boot_id,
        check=check,
        workflow=workflow,
        requested_at=at,
        action=action,
        severity=reading.severity if reading is not None else None,
        gpus=gpus,
        findings=listed,
        condition={k: str(v) for k, v in written.items()},
        certification=certification,
        events=events[0],
        events_note=events[1],
    )


def write_request(port: ClusterPort, request: RepairRequest) -> str:
    """Write ``request`` as ``dsx-repair-<node>`` in dsx's namespace (replacing an older one); its name."""
    name = request_name(request.node)
    document = yaml.safe_dump(request.model_dump(mode="json", by_alias=True), sort_keys=False, width=110)
    labels = {vocab.LABEL_NODE: ledger.node_label(request.node), vocab.LABEL_REPAIR: request.action}
    port.update_state(name, lambda _: {"request.yaml": document}, labels=labels)
    return name


def clear_request(port: ClusterPort, node: str) -> bool:
    """Delete ``node``'s request object; ``False`` when there was none."""
    return port.delete_object("v1", "ConfigMap", request_name(node), port.namespace)


class TemplateCall(Frozen):
    """The operator's repair WorkflowTemplate and the actions handed to it."""

    template: str
    actions: frozenset[str]


def template_call(template: str, actions: str = TEMPLATE_ACTIONS) -> TemplateCall | None:
    """The ``repair-template`` and ``repair-template-actions`` parameters, read; ``None`` without a
    template.

    Raises:
        InputError: a template name that is no object name, or an action not in the catalogue's.
    """
    template = template.strip()
    if not template:
        return None
    if len(template) > 253 - 6 or not _DNS_NAME.fullmatch(template):
        raise InputError(f"parameter repair-template: {template!r} is not a WorkflowTemplate name")
    known = get_args(Action)
    chosen = frozenset(a.strip() for a in actions.split(",") if a.strip())
    wrong = sorted(chosen - set(known))
    if wrong or not chosen:
        raise InputError(
            f"parameter repair-template-actions: {', '.join(wrong) or 'none given'}: "
            f"expected a comma-separated list of {', '.join(known)}"
        )
    return TemplateCall(template=template, actions=chosen)


def call_template(port: ClusterPort, node: Node, template: str, workflow: str) -> str:
    """Create a Workflow of the operator's ``template`` for ``node``'s repair request, its parameters the
    request's (:data:`TEMPLATE_PARAMETERS`); its name. The template reads those it needs as
    ``{{workflow.parameters.NAME}}``."""
    values = {
        "node": node.name,
        "action": node.labels.get(vocab.LABEL_REPAIR, ""),
        "gpus": ",".join(requested_gpus(node)),
        "request": request_name(node.name),
        "requested-at": node.annotations.get(vocab.ANNOTATION_REPAIR_REQUESTED_AT, ""),
        "boot-id": node.node_info.boot_id,
        "workflow": workflow,
    }
    assert values.keys() == TEMPLATE_PARAMETERS.keys()
    labels = {vocab.LABEL_NODE: ledger.node_label(node.name), vocab.LABEL_REPAIR: values["action"]}
    return create_workflow(port, template, values, port.namespace, labels=labels)


def workflow_phase(port: ClusterPort, name: str) -> tuple[str, str] | None:
    """The phase and message of the Workflow ``name`` in dsx's namespace (``("", "")`` before the
    controller took it up); ``None`` when it is gone."""
    found = port.get_object("argoproj.io/v1alpha1", "Workflow", name, port.namespace)
    if found is None:
        return None
    status = found.get("status") or {}
    return str(status.get("phase") or ""), str(status.get("message") or "")

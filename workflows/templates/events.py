"""Argo Events: the EventSource watching Node objects and the Sensor that starts ``dsx-remediate``.

The sentinel agent taints a node ``dsx.dev/unhealthy:NoSchedule`` at once on a fatal fault and sets the
check's node condition (``DsxGpuXid``... ``status=True``: the problem is there). These two objects turn
that into a remediation, filtered hard so ordinary node churn (kubelet heartbeats, labels, other
conditions) never reaches a trigger:

- **EventSource** ``dsx-nodes`` (resource event source, ``UPDATE`` of ``v1/nodes``): only nodes that are
  not opted out (label selector ``dsx.dev/managed!=false``, given to the informer's list and watch) and
  that carry dsx's taint (a field filter: a gjson path into the node, matched as a regular expression;
  argo-events ``pkg/eventsources/sources/resource/start.go``, ``filterFields``). An update whose resource
  version did not change is dropped by the event source itself. Its event data is ``{type, body,
  oldBody, group, version, resource}``: the node after and before the update.
- **Sensor** ``dsx-remediate``: one dependency per sentinel check, each passing only when that check's
  condition became *fatal* in this update (an ``exprs`` filter comparing the count of
  ``type==<condition>, status==True, reason~Fatal*`` conditions in ``body`` and ``oldBody``: the counts
  always exist, so no filter fails on a node that never had the condition) and no check before it (in
  name order) did: the dependencies are exclusive, so one update that turns several checks fatal at once
  passes one of them (see Delivery). Severity, not status: a
  degraded reading sets the condition ``True`` without the taint, and the fatal reading after it only
  changes the reason (``DegradedReboot`` to ``FatalReboot``); a trigger on "newly True" never fires for
  it. One ``argoWorkflow`` trigger, fired by any of them (``conditions``), submits a Workflow from the
  ``dsx-remediate`` WorkflowTemplate (``workflowTemplateRef``) with ``node`` from the event (``dataKey:
  body.metadata.name``), ``check`` from the dependency that matched (its ``dataTemplate`` is the check's
  name: a parameter whose dependency did not fire resolves to nothing and is skipped, argo-events
  ``pkg/sensors/triggers/params.go``, ``ResolveParamValue``) and ``event``, the condition itself
  (``dataKey: body.status.conditions.#(type=="<condition>")``, its JSON): ``guard`` reads the severity
  and action from its reason for the policy's rules, when it turned True for the ledger's detection
  time (Events, which also tell it, expire after an hour), and its heartbeat to tell a stale trigger.
  Its ``rateLimit`` spaces submissions (argo-events waits, ``ratelimit.Take``; up to 10 unused permits
  are banked, so a burst after a quiet spell goes faster: the breaker bounds it).
- **Delivery**: the trigger is ``atLeastOnce`` with a ``retryStrategy`` (argo-events v1.9
  ``pkg/sensors/listener.go``: without it the submission runs in a goroutine, a failed ``argo submit``
  is logged and lost). Retries end too, and a condition that turned fatal while the EventSource was
  down is never an update it sees: the ``dsx-reconcile`` CronWorkflow (:mod:`steps.sentinel.reconcile`)
  starts what the edges missed. With a JetStream bus one event that passes several dependencies fires
  the trigger once per dependency (``pkg/eventbus/jetstream/sensor/trigger_conn.go``, ``processMsg``: each
  dependency of the event's source is filtered and, with no ``&`` in ``conditions``, triggered on its
  own): an XID and an ECC error read in one pass would start two Workflows for one node. So no two
  dependencies pass the same event: each asks too that the checks before it did not turn fatal in it
  (``now <= before``), and the first check in name order names the run. One event, one Workflow per
  node; the run remediates the node whatever its other conditions say (the repair and the agent's
  next readings clear them).

How the Sensor knows the check: from which condition turned True, by a dependency per check. The
condition type to check name map is :data:`steps.cluster.vocabulary.CONDITION_SENTINEL`, the agent's own;
no annotation or template logic is needed, and Argo Events evaluates every part natively.

Three fields of hera 7's ``hera.events`` models differ from Argo Events' Go types, and are written as
Go reads them: ``ResourceEventSource``'s group, version and resource are inline fields (hera nests them
under ``groupVersionResource``), ``K8SResource`` (the trigger's Workflow) is a JSON object (hera takes
a base64 string), and ``Backoff``'s ``duration`` is a string and its ``factor`` and ``jitter`` plain
numbers (hera wraps them in objects).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hera.events.models import (
    ArgoWorkflowTrigger,
    ArtifactLocation,
    EventDependency,
    EventDependencyFilter,
    EventSource,
    EventSourceSpec,
    ExprFilter,
    PayloadField,
    RateLimit,
    ResourceEventSource,
    ResourceFilter,
    Selector,
    Sensor,
    SensorSpec,
    Template,
    Trigger,
    TriggerParameter,
    TriggerParameterSource,
    TriggerTemplate,
)
from hera.events.models import Container as EventsContainer
from hera.events.models.io.k8s.api.core.v1 import PodSecurityContext, SecurityContext
from hera.events.models.io.k8s.apimachinery.pkg.apis.meta.v1 import GroupVersionResource, ObjectMeta

from steps.cluster import vocabulary as vocab
from steps.sentinel.events import condition_reason
from workflows.templates._base import PART_OF, container_security_context, pod_security_context

__all__ = [
    "EVENT_NAME",
    "EVENT_SOURCE",
    "RATE_LIMIT",
    "RETRY",
    "SENSOR",
    "SENSOR_ACCOUNT",
    "SOURCE_ACCOUNT",
    "TRIGGER",
    "dependency_name",
    "templates",
]

EVENT_SOURCE = "dsx-nodes"
EVENT_NAME = "node-health"
SENSOR = vocab.WORKFLOW_REMEDIATE
TRIGGER = vocab.WORKFLOW_REMEDIATE
REMEDIATE = vocab.WORKFLOW_REMEDIATE
SOURCE_ACCOUNT = "dsx-node-events"
SENSOR_ACCOUNT = "dsx-remediate-sensor"
RATE_LIMIT = RateLimit(unit="Minute", requests_per_unit=6)
"""At most one remediation started every 10 s (the chart's ``events.rateLimit`` overrides it)."""
RETRY: dict[str, Any] = {"steps": 5, "duration": "10s", "factor": 2, "jitter": 0.5}
"""The trigger's retries: 10 s, 20 s, 40 s, 80 s apart (plus up to half again), then the reconciler."""
_FATAL = condition_reason("fatal", "none")[: len("Fatal")]
_API_VERSION = "argoproj.io/v1alpha1"


def dependency_name(check: str) -> str:
    """The Sensor dependency of a check: a name ``conditions`` can use (an expression identifier)."""
    return "dsx_" + check.replace("-", "_")


def _template(account: str) -> Template:
    """The pod template of the EventSource's or the Sensor's Deployment: its account, and Pod Security
    ``restricted`` as dsx's workflow pods have it. Argo Events copies ``securityContext`` into the pod
    and ``container.securityContext`` into its one container, which it creates with none
    (argo-events v1.9 ``pkg/reconciler/{sensor,eventsource}/resource.go``, ``ApplyToContainer``); its
    image (``FROM scratch``, no ``USER``) would otherwise run as root, which ``restricted`` refuses."""
    pod = pod_security_context().model_dump(by_alias=True, exclude_none=True, mode="json")
    container = container_security_context().model_dump(by_alias=True, exclude_none=True, mode="json")
    return Template(
        service_account_name=account,
        security_context=PodSecurityContext.model_validate(pod),
        container=EventsContainer(security_context=SecurityContext.model_validate(container)),
    )


def _fatal_count(body: str, condition: str) -> str:
    """gjson path: how many ``condition`` conditions with ``status=True`` and a fatal reason the node in
    ``body`` has (``%`` is gjson's glob match)."""
    return f'{body}.status.conditions.#(type=="{condition}")#|#(status=="True")#|#(reason%"{_FATAL}*")#|#'


def _turned_fatal(check: str, expr: str) -> ExprFilter:
    """A filter on how many fatal ``check`` conditions the node has now and had before the update:
    ``now > before`` it turned fatal in this update, ``now <= before`` it did not."""
    condition = vocab.CONDITION_SENTINEL[check]
    return ExprFilter(
        expr=expr,
        fields=[
            PayloadField(name="now", path=_fatal_count("body", condition)),
            PayloadField(name="before", path=_fatal_count("oldBody", condition)),
        ],
    )


@dataclass(frozen=True)
class EventsObject:
    """A hera.events model as the compiler renders it: ``to_dict``, the manifest Argo Events reads."""

    kind: str
    model: EventSource | Sensor

    def to_dict(self) -> dict[str, Any]:
        """The manifest: apiVersion and kind, then the model, with hera's two differences from Go undone."""
        body = self.model.model_dump(by_alias=True, exclude_none=True, mode="json")
        manifest: dict[str, Any] = {"apiVersion": _API_VERSION, "kind": self.kind, **body}
        for source in (manifest["spec"].get("resource") or {}).values():
            source.update(source.pop("groupVersionResource", {}))
        for trigger in manifest["spec"].get("triggers") or []:
            workflow = trigger["template"].get("argoWorkflow")
            if workflow is not None:
                workflow["source"] = {"resource": _workflow()}
                trigger["retryStrategy"] = dict(RETRY)
        return manifest


def _workflow() -> dict[str, Any]:
    """The Workflow the trigger submits: ``dsx-remediate`` from its template, node, check and event to
    fill."""
    return {
        "apiVersion": _API_VERSION,
        "kind": "Workflow",
        "metadata": {"generateName": f"{REMEDIATE}-", "labels": dict(PART_OF)},
        "spec": {
            "workflowTemplateRef": {"name": REMEDIATE},
            "arguments": {"parameters": [{"name": n, "value": ""} for n in ("node", "check", "event")]},
        },
    }


def event_source() -> EventsObject:
    """The EventSource: updates of managed nodes carrying dsx's taint."""
    taint = f'spec.taints.#(key=="{vocab.TAINT_UNHEALTHY}").effect'
    source = ResourceEventSource(
        group_version_resource=GroupVersionResource(group="", version="v1", resource="nodes"),
        namespace="",  # nodes are cluster-scoped: the informer watches them all (a required field)
        event_types=["UPDATE"],
        filter=ResourceFilter(
            labels=[Selector(key=vocab.LABEL_MANAGED, operation="!=", value=vocab.MANAGED_FALSE)],
            fields=[Selector(key=taint, operation="==", value=f"^{vocab.TAINT_UNHEALTHY_EFFECT}$")],
        ),
    )
    return EventsObject(
        "EventSource",
        EventSource(
            metadata=ObjectMeta(name=EVENT_SOURCE, labels=dict(PART_OF)),
            spec=EventSourceSpec(resource={EVENT_NAME: source}, template=_template(SOURCE_ACCOUNT)),
        ),
    )


def sensor() -> EventsObject:
    """The Sensor: a dependency per sentinel check (its condition turned fatal), one rate-limited,
    at-least-once trigger submitting dsx-remediate."""
    checks = sorted(vocab.CONDITION_SENTINEL)
    dependencies = [
        EventDependency(
            name=dependency_name(check),
            event_source_name=EVENT_SOURCE,
            event_name=EVENT_NAME,
            filters=EventDependencyFilter(
                exprs=[
                    _turned_fatal(check, "now > before"),
                    *(_turned_fatal(earlier, "now <= before") for earlier in checks[:index]),
                ]
            ),
        )
        for index, check in enumerate(checks)
    ]
    nodes = [
        TriggerParameter(
            src=TriggerParameterSource(dependency_name=dependency_name(c), data_key="body.metadata.name"),
            dest="spec.arguments.parameters.0.value",
        )
        for c in checks
    ]
    named = [
        TriggerParameter(
            src=TriggerParameterSource(dependency_name=dependency_name(c), data_template=c),
            dest="spec.arguments.parameters.1.value",
        )
        for c in checks
    ]
    events = [
        TriggerParameter(
            src=TriggerParameterSource(
                dependency_name=dependency_name(c),
                data_key=f'body.status.conditions.#(type=="{vocab.CONDITION_SENTINEL[c]}")',
            ),
            dest="spec.arguments.parameters.2.value",
        )
        for c in checks
    ]
    trigger = Trigger(
        template=TriggerTemplate(
            name=TRIGGER,
            conditions=" || ".join(dependency_name(c) for c in checks),
            argo_workflow=ArgoWorkflowTrigger(
                operation="submit", source=ArtifactLocation(), parameters=nodes + named + events
            ),
        ),
        rate_limit=RATE_LIMIT,
        at_least_once=True,
    )
    return EventsObject(
        "Sensor",
        Sensor(
            metadata=ObjectMeta(name=SENSOR, labels=dict(PART_OF)),
            spec=SensorSpec(
                dependencies=dependencies,
                triggers=[trigger],
                template=_template(SENSOR_ACCOUNT),
            ),
        ),
    )


def templates() -> list[Any]:
    """The EventSource and the Sensor."""
    return [event_source(), sensor()]

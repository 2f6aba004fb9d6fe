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
  condition turned ``True`` in this update (an ``exprs`` filter comparing the count of
  ``type==<condition>, status==True`` conditions in ``body`` and ``oldBody``: the counts always exist,
  so no filter fails on a node that never had the condition). One ``argoWorkflow`` trigger, fired by
  any of them (``conditions``), submits a Workflow from the ``dsx-remediate`` WorkflowTemplate
  (``workflowTemplateRef``) with ``node`` from the event (``dataKey: body.metadata.name``) and ``check``
  from the dependency that matched (its ``dataTemplate`` is the check's name: a parameter whose
  dependency did not fire resolves to nothing and is skipped, argo-events
  ``pkg/sensors/triggers/params.go``, ``ResolveParamValue``). Its ``rateLimit`` spaces submissions
  (argo-events waits, ``ratelimit.Take``, it drops nothing).

How the Sensor knows the check: from which condition turned True, by a dependency per check. The
condition type to check name map is :data:`steps.cluster.vocabulary.CONDITION_SENTINEL`, the agent's own;
no annotation or template logic is needed, and Argo Events evaluates every part natively.

Two fields of hera 7's ``hera.events`` models differ from Argo Events' Go types, and are written as Go
reads them: ``ResourceEventSource``'s group, version and resource are inline fields (hera nests them
under ``groupVersionResource``), and ``K8SResource`` (the trigger's Workflow) is a JSON object (hera
takes a base64 string).
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
from hera.events.models.io.k8s.apimachinery.pkg.apis.meta.v1 import GroupVersionResource, ObjectMeta

from steps.cluster import vocabulary as vocab
from workflows.templates._base import PART_OF

__all__ = [
    "EVENT_NAME",
    "EVENT_SOURCE",
    "RATE_LIMIT",
    "SENSOR",
    "SENSOR_ACCOUNT",
    "SOURCE_ACCOUNT",
    "TRIGGER",
    "dependency_name",
    "templates",
]

EVENT_SOURCE = "dsx-nodes"
EVENT_NAME = "node-health"
SENSOR = "dsx-remediate"
TRIGGER = "dsx-remediate"
REMEDIATE = "dsx-remediate"
SOURCE_ACCOUNT = "dsx-node-events"
SENSOR_ACCOUNT = "dsx-remediate-sensor"
RATE_LIMIT = RateLimit(unit="Minute", requests_per_unit=6)
"""At most one remediation started every 10 s (the chart's ``events.rateLimit`` overrides it)."""
_API_VERSION = "argoproj.io/v1alpha1"


def dependency_name(check: str) -> str:
    """The Sensor dependency of a check: a name ``conditions`` can use (an expression identifier)."""
    return "dsx_" + check.replace("-", "_")


def _true_count(body: str, condition: str) -> str:
    """gjson path: how many ``condition`` conditions with ``status=True`` the node in ``body`` has."""
    return f'{body}.status.conditions.#(type=="{condition}")#|#(status=="True")#|#'


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
        return manifest


def _workflow() -> dict[str, Any]:
    """The Workflow the trigger submits: ``dsx-remediate`` from its template, node and check to fill."""
    return {
        "apiVersion": _API_VERSION,
        "kind": "Workflow",
        "metadata": {"generateName": f"{REMEDIATE}-", "labels": dict(PART_OF)},
        "spec": {
            "workflowTemplateRef": {"name": REMEDIATE},
            "arguments": {"parameters": [{"name": "node", "value": ""}, {"name": "check", "value": ""}]},
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
            spec=EventSourceSpec(
                resource={EVENT_NAME: source}, template=Template(service_account_name=SOURCE_ACCOUNT)
            ),
        ),
    )


def sensor() -> EventsObject:
    """The Sensor: a dependency per sentinel check, one rate-limited trigger submitting dsx-remediate."""
    checks = sorted(vocab.CONDITION_SENTINEL)
    dependencies = [
        EventDependency(
            name=dependency_name(check),
            event_source_name=EVENT_SOURCE,
            event_name=EVENT_NAME,
            filters=EventDependencyFilter(
                exprs=[
                    ExprFilter(
                        expr="now > before",
                        fields=[
                            PayloadField(name="now", path=_true_count("body", condition)),
                            PayloadField(name="before", path=_true_count("oldBody", condition)),
                        ],
                    )
                ]
            ),
        )
        for check, condition in ((c, vocab.CONDITION_SENTINEL[c]) for c in checks)
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
    trigger = Trigger(
        template=TriggerTemplate(
            name=TRIGGER,
            conditions=" || ".join(dependency_name(c) for c in checks),
            argo_workflow=ArgoWorkflowTrigger(
                operation="submit", source=ArtifactLocation(), parameters=nodes + named
            ),
        ),
        rate_limit=RATE_LIMIT,
    )
    return EventsObject(
        "Sensor",
        Sensor(
            metadata=ObjectMeta(name=SENSOR, labels=dict(PART_OF)),
            spec=SensorSpec(
                dependencies=dependencies,
                triggers=[trigger],
                template=Template(service_account_name=SENSOR_ACCOUNT),
            ),
        ),
    )


def templates() -> list[Any]:
    """The EventSource and the Sensor."""
    return [event_source(), sensor()]

"""Argo Events on one machine: compiled EventSources and Sensors played against the cluster port.

What Argo Events does on a cluster, read in its source (``pkg/eventsources/sources/resource/start.go``,
``pkg/sensors/dependencies/filter.go``, ``pkg/sensors/triggers/params.go``, ``pkg/sensors/listener.go``):

- **Resource event source**: an informer over one resource, listed and watched with the filter's label
  selector; an ``UPDATE`` whose resource version did not change is dropped; the filter's ``prefix``
  (name) and ``fields`` (gjson path into the object, a regular expression on its string, ``=``/``==``
  must match, ``!=`` must not; a missing path fails) are applied to the new object. The event data is
  ``{type, body, oldBody, group, version, resource, metadata}``.
- **Sensor**: each dependency names an event source and event; its ``exprs`` filters bind gjson paths
  of the event data to names and evaluate an expression (all must hold, or any with
  ``exprLogicalOperator: or``; a missing path fails the filter). A trigger fires when its ``conditions``
  (dependency names joined by ``&&``, ``||``, parentheses) hold, or when every dependency matched when it
  has none. With a JetStream bus (``pkg/eventbus/jetstream/sensor/trigger_conn.go``) conditions without
  ``&`` fire once *per dependency the event passes*, each firing with that dependency's event alone;
  conditions with ``&`` need every dependency they name (here: in the same event). Its parameters
  resolve from the events of the dependencies that fired: ``dataKey`` (a gjson path), ``dataTemplate``,
  or ``value``; one whose dependency did not fire and that has no ``value`` is skipped. An
  ``argoWorkflow`` trigger with ``operation: submit`` submits its ``source.resource`` Workflow with the
  parameters set at their ``dest``. ``rateLimit`` spaces the trigger's firings (``requestsPerUnit`` per
  ``unit``): a firing waits for its slot, none is dropped. A submission that fails is tried again per
  ``retryStrategy`` (``steps`` tries, ``duration`` apart, times ``factor`` each time) only when the
  trigger is ``atLeastOnce`` (``pkg/sensors/listener.go``: otherwise it runs detached and its error is
  only logged); after the last try the firing is lost.

Here the informer is a poll of the port's ``list_objects`` every interval, comparing resource
versions: two updates between polls arrive as one (as after an informer's relist), so filters that
compare ``body`` with ``oldBody`` see the whole change. The Sensor sees each event on its own (a
trigger's dependencies must all match in one event). Anything this module does not carry out (other
event source kinds, ``data``, ``script`` and ``time`` filters, other trigger kinds or operations) is
refused by :func:`load` naming it.
"""

from __future__ import annotations

import ast
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from steps.cluster.port import ClusterPort
from steps.durations import parse_duration
from steps.errors import DsxError, InputError
from workflows.runner import gjson
from workflows.runner.errors import UnsupportedConstruct

__all__ = [
    "Firing",
    "Player",
    "ResourceSource",
    "SensorPlay",
    "Submission",
    "evaluate",
    "load",
]

_KINDS = {("", "v1", "nodes"): ("v1", "Node")}
"""Resources the player can watch (group, version, plural) -> (apiVersion, kind)."""
_UNITS = {"Second": 1.0, "Minute": 60.0, "Hour": 3600.0}
_TEMPLATE = re.compile(r"^\{\{\s*\.Input((?:\.[A-Za-z0-9_]+)+)\s*\}\}$")


def _unsupported(where: str, what: str) -> UnsupportedConstruct:
    return UnsupportedConstruct([f"{where}: {what} is not carried out by the local event player"])


# ------------------------------------------------------------------ expressions (govaluate's common part)

_ALLOWED = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.Compare,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.BinOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.Name,
    ast.Load,
    ast.Constant,
)


def _parse(expression: str, where: str) -> ast.Expression:
    text = re.sub(r"!(?!=)", " not ", expression.replace("&&", " and ").replace("||", " or "))
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise _unsupported(where, f"expression {expression!r}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise _unsupported(where, f"expression {expression!r} ({type(node).__name__})")
    return tree


def evaluate(expression: str, names: Mapping[str, Any], where: str = "expression") -> Any:
    """An expression of govaluate's common part (comparisons, ``&&``, ``||``, ``!``, arithmetic, names,
    numbers, strings, ``true``/``false``) over ``names``.

    Raises:
        UnsupportedConstruct: other syntax; a name that is not given.
    """
    tree = _parse(expression, where)
    scope = {"true": True, "false": False, **names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in scope:
            raise _unsupported(where, f"name {node.id!r} in {expression!r}")
    return _value(tree.body, scope)


_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}
_ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _value(node: ast.expr, scope: Mapping[str, Any]) -> Any:
    """Evaluate a checked expression tree (only the node types :data:`_ALLOWED` names)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return scope[node.id]
    if isinstance(node, ast.BoolOp):
        values = (bool(_value(v, scope)) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):
        operand = _value(node.operand, scope)
        return (not operand) if isinstance(node.op, ast.Not) else -operand
    if isinstance(node, ast.BinOp):
        return _ARITHMETIC[type(node.op)](_value(node.left, scope), _value(node.right, scope))
    assert isinstance(node, ast.Compare)
    left = _value(node.left, scope)
    for op, right_node in zip(node.ops, node.comparators, strict=True):
        right = _value(right_node, scope)
        if not _COMPARE[type(op)](left, right):
            return False
        left = right
    return True


# ------------------------------------------------------------------ event source


@dataclass
class ResourceSource:
    """One entry of an EventSource's ``resource`` section, watched through the port."""

    source: str
    event: str
    api_version: str
    kind: str
    group: str
    version: str
    resource: str
    event_types: tuple[str, ...]
    selector: str
    fields: list[tuple[str, str, str]]
    prefix: str
    metadata: dict[str, str]
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    started: bool = False

    def passes(self, obj: Mapping[str, Any]) -> bool:
        """The filter's ``prefix`` and ``fields`` on the (new) object."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        if self.prefix and not name.startswith(self.prefix):
            return False
        for path, operation, pattern in self.fields:
            found = gjson.get(obj, path)
            if found is gjson.MISSING:
                return False
            match = re.search(pattern, found if isinstance(found, str) else "") is not None
            if match != (operation in ("=", "==")):
                return False
        return True

    def poll(self, port: ClusterPort) -> list[dict[str, Any]]:
        """The events since the last poll (none on the first: the informer's initial list is ADDs of
        what exists, which the event source reports only for ``ADD``)."""
        listed = port.list_objects(self.api_version, self.kind, label_selector=self.selector or None)
        now = {str(o["metadata"]["name"]): o for o in listed}
        found: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = []
        if self.started:
            for name, obj in sorted(now.items()):
                before = self.seen.get(name)
                if before is None:
                    found.append(("ADD", obj, None))
                elif _version(before) != _version(obj):
                    found.append(("UPDATE", obj, before))
            found += [("DELETE", old, None) for name, old in sorted(self.seen.items()) if name not in now]
        self.seen, self.started = now, True
        return [
            {
                "type": kind,
                "body": obj,
                "oldBody": old,
                "group": self.group,
                "version": self.version,
                "resource": self.resource,
                "metadata": dict(self.metadata),
            }
            for kind, obj, old in found
            if kind in self.event_types and self.passes(obj)
        ]


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _sources(doc: Mapping[str, Any]) -> list[ResourceSource]:
    name = str(doc["metadata"]["name"])
    spec = doc.get("spec") or {}
    others = sorted(k for k, v in spec.items() if k not in ("resource", "template", "eventBusName") and v)
    if others:
        raise _unsupported(f"EventSource {name}", f"spec.{others[0]}")
    found = []
    for event, body in sorted((spec.get("resource") or {}).items()):
        where = f"EventSource {name}: resource.{event}"
        key = (str(body.get("group", "")), str(body.get("version", "")), str(body.get("resource", "")))
        if key not in _KINDS:
            raise _unsupported(where, f"watching {'/'.join(k for k in key if k)}")
        flt = body.get("filter") or {}
        if flt.get("createdBy"):
            raise _unsupported(where, "filter.createdBy")
        labels = []
        for sel in flt.get("labels") or []:
            op = str(sel.get("operation") or "=")
            if op not in ("=", "==", "!="):
                raise _unsupported(where, f"label operation {op!r}")
            labels.append(f"{sel['key']}{op}{sel.get('value', '')}")
        fields = []
        for sel in flt.get("fields") or []:
            op = str(sel.get("operation") or "")
            if op not in ("=", "==", "!="):
                raise InputError(f"{where}: field operation {op!r}: Argo Events takes =, == or !=")
            gjson.check(str(sel["key"]))
            fields.append((str(sel["key"]), op, str(sel.get("value", ""))))
        types = tuple(str(t) for t in body.get("eventTypes") or [])
        for t in types:
            if t not in ("ADD", "UPDATE", "DELETE"):
                raise InputError(f"{where}: event type {t!r}: expected ADD, UPDATE or DELETE")
        api_version, kind = _KINDS[key]
        found.append(
            ResourceSource(
                source=name,
                event=event,
                api_version=api_version,
                kind=kind,
                group=key[0],
                version=key[1],
                resource=key[2],
                event_types=types,
                selector=",".join(labels),
                fields=fields,
                prefix=str(flt.get("prefix") or ""),
                metadata=dict(body.get("metadata") or {}),
            )
        )
    return found


# ------------------------------------------------------------------ sensor


@dataclass(frozen=True)
class Submission:
    """A Workflow an ``argoWorkflow`` trigger submits: the template it names and its parameters."""

    sensor: str
    trigger: str
    template: str
    parameters: dict[str, str]
    dependencies: tuple[str, ...]


@dataclass(frozen=True)
class Firing:
    """What one event did to one Sensor: the dependencies it matched and the submissions it made."""

    sensor: str
    matched: tuple[str, ...]
    submissions: tuple[Submission, ...]


def _set(target: Any, dest: str, value: str) -> None:
    """sjson's ``SetBytes`` for a dotted path of keys and list indexes that exist."""
    parts = dest.split(".")
    for part in parts[:-1]:
        target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
    last = parts[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value


def _resolve(src: Mapping[str, Any], events: Mapping[str, dict[str, Any]], where: str) -> str | None:
    """A trigger parameter's value (``ResolveParamValue``): ``None`` when it is skipped."""
    value = src.get("value")
    data = events.get(str(src.get("dependencyName")))
    if data is None:
        return None if value is None else str(value)
    template, key = src.get("dataTemplate"), src.get("dataKey")
    if template:
        text = str(template)
        if "{{" not in text:
            return text
        match = _TEMPLATE.match(text)
        found = gjson.get(data, match.group(1)[1:]) if match else gjson.MISSING
        if found is not gjson.MISSING and found not in ("", None):
            return found if isinstance(found, str) else str(found)
    if key:
        found = gjson.get(data, str(key))
        if found is not gjson.MISSING:
            return found if isinstance(found, str) else _json(found)
    if value is not None:
        return str(value)
    if not (template or key):
        return _json(data)
    raise InputError(f"{where}: cannot resolve the parameter from {src.get('dependencyName')}'s event")


def _retries(trigger: Mapping[str, Any], where: str) -> tuple[int, float, float]:
    """A trigger's tries, first delay (s) and factor: ``retryStrategy`` when ``atLeastOnce``, else one try
    (``DoWithRetry`` over ``wait.ExponentialBackoff``; defaults: 1 step, 1 s, factor 1)."""
    retry = trigger.get("retryStrategy") or {}
    try:
        steps = int(retry.get("steps") or 1)
        delay = parse_duration(retry.get("duration") or "1s")
        factor = float(retry.get("factor") or 1.0)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: retryStrategy: {exc}") from None
    if steps < 1 or delay < 0 or factor < 0:
        raise InputError(
            f"{where}: retryStrategy: steps must be at least 1, duration and factor not negative"
        )
    return (steps if trigger.get("atLeastOnce") else 1), delay, factor


def _json(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


@dataclass
class SensorPlay:
    """A compiled Sensor: its dependencies' filters, its triggers' conditions, parameters and rate limits."""

    doc: dict[str, Any]
    last_fired: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        """The Sensor's name."""
        return str(self.doc["metadata"]["name"])

    def check(self) -> None:
        """Refuse what the player does not carry out, naming it.

        Raises:
            UnsupportedConstruct: a filter, trigger or operation outside the supported part.
        """
        spec = self.doc.get("spec") or {}
        deps = {str(d["name"]) for d in spec.get("dependencies") or []}
        for dep in spec.get("dependencies") or []:
            where = f"Sensor {self.name}: dependency {dep['name']}"
            filters = dep.get("filters") or {}
            for other in ("data", "script", "time", "context"):
                if filters.get(other):
                    raise _unsupported(where, f"filters.{other}")
            if dep.get("transform"):
                raise _unsupported(where, "transform")
            for expr in filters.get("exprs") or []:
                for f in expr.get("fields") or []:
                    gjson.check(str(f["path"]))
                _parse(str(expr["expr"]), where)
        for trigger in spec.get("triggers") or []:
            template = trigger.get("template") or {}
            where = f"Sensor {self.name}: trigger {template.get('name')}"
            workflow = template.get("argoWorkflow")
            if workflow is None:
                raise _unsupported(where, "a trigger that is not argoWorkflow")
            if (workflow.get("operation") or "submit") != "submit":
                raise _unsupported(where, f"operation {workflow.get('operation')!r}")
            resource = (workflow.get("source") or {}).get("resource")
            if not isinstance(resource, dict) or not (resource.get("spec") or {}).get("workflowTemplateRef"):
                raise _unsupported(where, "a source that is not a Workflow from a workflowTemplateRef")
            if trigger.get("parameters"):
                raise _unsupported(where, "trigger-level parameters")
            if template.get("conditions"):
                names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(template["conditions"])))
                unknown = sorted(names - deps - {"true", "false"})
                if unknown:
                    raise InputError(f"{where}: conditions name no dependency: {', '.join(unknown)}")
                _parse(str(template["conditions"]), where)
            unit = str((trigger.get("rateLimit") or {}).get("unit") or "Second")
            if unit not in _UNITS:
                raise InputError(f"{where}: rateLimit.unit {unit!r}: expected Second, Minute or Hour")
            _retries(trigger, where)

    def _matches(self, dep: Mapping[str, Any], source: str, event: str, data: dict[str, Any]) -> bool:
        if dep.get("eventSourceName") != source or dep.get("eventName") != event:
            return False
        filters = dep.get("filters") or {}
        exprs = filters.get("exprs") or []
        if not exprs:
            return True
        any_of = str(filters.get("exprLogicalOperator") or "and").lower() == "or"
        results = []
        for expr in exprs:
            values = {str(f["name"]): gjson.get(data, str(f["path"])) for f in expr.get("fields") or []}
            if any(v is gjson.MISSING for v in values.values()):
                results.append(False)  # Argo Events: "path does not exist", the filter fails
                continue
            results.append(bool(evaluate(str(expr["expr"]), values, f"Sensor {self.name}: {dep['name']}")))
        return any(results) if any_of else all(results)

    def handle(self, source: str, event: str, data: dict[str, Any]) -> Firing:
        """What one event does: the dependencies it matches and the submissions of the triggers that fire."""
        spec = self.doc.get("spec") or {}
        deps = [d for d in spec.get("dependencies") or []]
        matched = tuple(str(d["name"]) for d in deps if self._matches(d, source, event, data))
        submissions = []
        if matched:
            for trigger in spec.get("triggers") or []:
                conditions = str(trigger["template"].get("conditions") or "")
                if conditions and "&" not in conditions:  # JetStream: one firing per dependency
                    for name in matched:
                        if evaluate(conditions, {str(d["name"]): d["name"] == name for d in deps}):
                            submissions.append(self._submission(trigger, {name: data}, (name,)))
                    continue
                if conditions:
                    fired = evaluate(conditions, {str(d["name"]): d["name"] in matched for d in deps})
                else:
                    fired = len(matched) == len(deps)
                if fired:
                    submissions.append(self._submission(trigger, {name: data for name in matched}, matched))
        return Firing(self.name, matched, tuple(submissions))

    def _submission(
        self, trigger: Mapping[str, Any], events: Mapping[str, dict[str, Any]], matched: tuple[str, ...]
    ) -> Submission:
        import copy

        template = trigger["template"]
        workflow = template["argoWorkflow"]
        resource = copy.deepcopy(workflow["source"]["resource"])
        where = f"Sensor {self.name}: trigger {template['name']}"
        for parameter in workflow.get("parameters") or []:
            value = _resolve(parameter.get("src") or {}, events, where)
            if value is not None:
                _set(resource, str(parameter["dest"]), value)
        spec = resource.get("spec") or {}
        values = {
            str(p["name"]): str(p.get("value", ""))
            for p in (spec.get("arguments") or {}).get("parameters") or []
        }
        return Submission(
            self.name, str(template["name"]), str(spec["workflowTemplateRef"]["name"]), values, matched
        )

    def wait_for_slot(self, trigger: Mapping[str, Any], stop: threading.Event) -> bool:
        """Wait for the trigger's next rate-limit slot (``False`` if stopped first)."""
        limit = trigger.get("rateLimit")
        if not limit:
            return True
        per = int(limit.get("requestsPerUnit") or 0)
        spacing = _UNITS[str(limit.get("unit") or "Second")] / per if per > 0 else 0.0
        name = str(trigger["template"]["name"])
        with self.lock:
            now = time.monotonic()
            slot = max(now, self.last_fired.get(name, now - spacing) + spacing)
            self.last_fired[name] = slot
        delay = slot - time.monotonic()
        return delay <= 0 or not stop.wait(delay)

    def trigger(self, name: str) -> dict[str, Any]:
        """The trigger of that name."""
        spec = self.doc.get("spec") or {}
        return next(t for t in spec.get("triggers") or [] if t["template"]["name"] == name)


def load(documents: Sequence[Mapping[str, Any]]) -> tuple[list[ResourceSource], list[SensorPlay]]:
    """The EventSources and Sensors among ``documents``, checked.

    Raises:
        UnsupportedConstruct: what the player does not carry out, named.
        InputError: a malformed filter or trigger.
    """
    sources = [s for d in documents if d.get("kind") == "EventSource" for s in _sources(d)]
    sensors = [SensorPlay(dict(d)) for d in documents if d.get("kind") == "Sensor"]
    for sensor in sensors:
        sensor.check()
    return sources, sensors


# ------------------------------------------------------------------ the player

Submit = Callable[[Submission], None]
Report = Callable[[str], None]


@dataclass
class Player:
    """Polls every source, hands each event to every Sensor, and submits what their triggers fire.

    ``submit`` is called from a thread of its own per submission, after the trigger's rate-limit slot,
    so a long workflow never holds the watch up; ``report`` gets one line per thing that happened.
    """

    port: ClusterPort
    sources: list[ResourceSource]
    sensors: list[SensorPlay]
    submit: Submit
    report: Report = print
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    firings: list[Firing] = field(default_factory=list)

    def poll_once(self) -> list[Firing]:
        """One poll of every source; the Sensors' firings."""
        fired = []
        for source in self.sources:
            for data in source.poll(self.port):
                name = data["body"]["metadata"]["name"]
                self.report(f"event {source.source}/{source.event}: {data['type']} {name}")
                for sensor in self.sensors:
                    firing = sensor.handle(source.source, source.event, data)
                    if not firing.matched:
                        continue
                    fired.append(firing)
                    self.report(f"sensor {sensor.name}: {name} matched {', '.join(firing.matched)}")
                    for submission in firing.submissions:
                        self._start(sensor, submission)
        self.firings += fired
        return fired

    def _start(self, sensor: SensorPlay, submission: Submission) -> None:
        def go() -> None:
            trigger = sensor.trigger(submission.trigger)
            if not sensor.wait_for_slot(trigger, self.stop):
                return
            params = " ".join(f"{k}={v}" for k, v in submission.parameters.items())
            tries, delay, factor = _retries(trigger, submission.trigger)
            for attempt in range(1, tries + 1):
                self.report(f"trigger {submission.trigger}: submit {submission.template} {params}")
                try:
                    self.submit(submission)
                    return
                except DsxError as exc:  # the submission failed (the run's own end is not a failure here)
                    self.report(f"trigger {submission.trigger}: submit failed ({attempt} of {tries}): {exc}")
                if attempt == tries or self.stop.wait(delay):
                    self.report(
                        f"trigger {submission.trigger}: given up, {submission.template} not submitted"
                    )
                    return
                delay *= factor

        thread = threading.Thread(target=go, name=f"dsx-trigger-{submission.trigger}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def busy(self) -> bool:
        """Whether a submission is still waiting for its slot or running."""
        return any(t.is_alive() for t in self.threads)

    def run(self, interval: float, until: Callable[[], bool] | None = None) -> None:
        """Poll every ``interval`` seconds until stopped (or ``until()`` says so)."""
        while not self.stop.is_set():
            self.poll_once()
            if until is not None and until():
                return
            self.stop.wait(interval)

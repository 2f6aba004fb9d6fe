"""Resource templates: get, create, apply, patch or delete one object, then wait for its conditions.

Mirrors what argoexec does for a resource template in ``workflow/executor/resource.go``
(``ExecResource``, then ``WaitResource`` polling ``successCondition`` / ``failureCondition``, then
``jsonPath`` outputs), talking to the cluster through dsx's cluster port instead of kubectl: a
kubeconfig's cluster or the simulated fleet (``--cluster``). The port connects on first use, so a run
with no resource template needs no cluster.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from workflows.runner.conditions import ConditionError, json_path, matches, parse_condition
from workflows.runner.errors import NodeError
from workflows.runner.model import NodeStatus, Phase
from workflows.runner.nodes import finish, folder
from workflows.runner.state import Ctx, RunState, Stopped
from workflows.runner.workflowpod import DEADLINE_MESSAGE, deadline

__all__ = ["cluster_port", "run_resource"]

_DONE = {"get": "read", "create": "created", "apply": "applied", "patch": "patched"}


@dataclass(frozen=True)
class _Target:
    """The object a resource template acts on, from its manifest; ``label`` names it in messages."""

    api_version: str
    kind: str
    name: Any
    namespace: Any
    manifest: dict[str, Any]
    label: str


def cluster_port(state: RunState) -> Any:
    """The run's cluster adapter, connected on first use (``--cluster``, else the kubeconfig's).

    Raises:
        NodeError: it could not connect (naming ``--cluster``).
    """
    with state.port_lock:
        if state.port is None:
            try:
                state.port = connect_run(state)
            except Exception as exc:
                raise NodeError(f"needs a cluster: {exc} (pass --cluster, e.g. --cluster sim:)") from exc
        return state.port


def connect_run(state: RunState, namespace: str | None = None) -> Any:
    """A new port to the run's cluster (its kubeconfig and context where it is a real one), in
    ``namespace`` when given."""
    from steps.cluster import connect

    spec = state.cluster_spec
    kube = spec in (None, "", "kube")
    return connect(
        spec,
        state.options.kubeconfig if kube else None,
        state.options.context if kube else None,
        namespace=namespace,
    )


def run_resource(state: RunState, node: NodeStatus, body: Mapping[str, Any], ctx: Ctx) -> None:
    """Carry out a resource template and end its node; what it did goes to the node's ``stdout.log``.

    A failed call to the cluster ends the node Failed (as kubectl's error fails the pod); a manifest
    the runner cannot read, a missing object on ``get`` or an output it cannot save ends it Error.
    """
    node_folder = folder(state, node)
    resource = body["resource"]
    until = deadline(body, ctx)
    with (node_folder / "stdout.log").open("w") as log:
        (node_folder / "stderr.log").write_text("")
        target = _target(resource, node_folder)
        action = resource["action"]
        port = cluster_port(state)
        try:
            obj = _act(port, target, action, log)
        except NodeError:
            raise
        except Exception as exc:
            log.write(f"{action} {target.label}: {exc}\n")
            finish(state, node, Phase.Failed, f"{action} {target.label}: {exc}")
            return
        if obj is not None:
            log.write(f"{target.label} {_DONE[action]}\n")
            target = replace(target, name=obj.get("metadata", {}).get("name", target.name))
        obj, failed = _await_conditions(state, port, target, resource, obj, until, log)
        if failed is not None:
            finish(state, node, Phase.Failed, failed)
            return
        params = _outputs(body, obj)
        if params:
            node.outputs["parameters"] = params
        finish(state, node, Phase.Succeeded, "")


def _target(resource: Mapping[str, Any], node_folder: Path) -> _Target:
    """The manifest as an object to act on, kept as ``manifest.yaml`` in the node's folder.

    Raises:
        NodeError: the manifest has no apiVersion or kind.
    """
    import yaml

    manifest = yaml.safe_load(str(resource.get("manifest", "")))
    (node_folder / "manifest.yaml").write_text(str(resource.get("manifest", "")))
    if not isinstance(manifest, dict) or not manifest.get("kind") or not manifest.get("apiVersion"):
        raise NodeError("the resource manifest needs apiVersion, kind and metadata.name")
    metadata = manifest.get("metadata") or {}
    kind, name = str(manifest["kind"]), metadata.get("name")
    return _Target(
        str(manifest["apiVersion"]), kind, name, metadata.get("namespace"), manifest, f"{kind}/{name}"
    )


def _act(port: Any, target: _Target, action: str, log: IO[str]) -> Any:
    """Do the action through the cluster port; the object it returns (None after a delete).

    Raises:
        NodeError: ``get`` found no object.
    """
    api_version, kind, name, namespace = target.api_version, target.kind, str(target.name), target.namespace
    if action == "get":
        obj = port.get_object(api_version, kind, name, namespace)
        if obj is None:
            raise NodeError(f"{target.label} not found")
        return obj
    if action == "create":
        return port.create_object(target.manifest)
    if action == "apply":
        existing = port.get_object(api_version, kind, name, namespace)
        if existing is None:
            return port.create_object(target.manifest)
        return port.patch_object(api_version, kind, name, target.manifest, namespace)
    if action == "patch":
        patch = {k: v for k, v in target.manifest.items() if k not in ("apiVersion", "kind")}
        return port.patch_object(api_version, kind, name, patch, namespace)
    gone = port.delete_object(api_version, kind, name, namespace)
    log.write(f"{target.label} {'deleted' if gone else 'was already gone'}\n")
    return None


def _await_conditions(
    state: RunState,
    port: Any,
    target: _Target,
    resource: Mapping[str, Any],
    obj: Any,
    until: float | None,
    log: IO[str],
) -> tuple[Any, str | None]:
    """Poll the object until its success condition holds; the object, and why the node failed if it did.

    A failure condition that holds, the deadline, a failed read or the object's disappearance fail
    the node; every ``poll_interval`` it is read again.

    Raises:
        Stopped: the run stopped while waiting.
    """
    success = parse_condition(str(resource["successCondition"])) if resource.get("successCondition") else []
    failure = parse_condition(str(resource["failureCondition"])) if resource.get("failureCondition") else []
    while obj is not None and (success or failure):
        for requirement in failure:
            if requirement.holds(obj):
                message = f"failure condition '{requirement.text}' evaluated true"
                log.write(message + "\n")
                return obj, message
        if not success or matches(obj, success):
            log.write(f"{len(success)}/{len(success)} success conditions matched\n")
            break
        if until is not None and time.monotonic() >= until:
            return obj, DEADLINE_MESSAGE
        if state.stop.wait(state.options.poll_interval):
            raise Stopped
        try:
            obj = port.get_object(target.api_version, target.kind, str(target.name), target.namespace)
        except Exception as exc:
            return obj, f"get {target.label}: {exc}"
        if obj is None:
            return obj, f"{target.label} disappeared while waiting for its conditions"
    return obj, None


def _outputs(body: Mapping[str, Any], obj: Any) -> list[dict[str, Any]]:
    """The output parameters read from the object by ``jsonPath``, else their defaults.

    Raises:
        NodeError: a path that does not resolve, with no default.
    """
    params = []
    for param in (body.get("outputs") or {}).get("parameters") or []:
        value_from = param.get("valueFrom") or {}
        try:
            if "jsonPath" not in value_from or obj is None:
                raise ConditionError("no object")
            params.append({"name": param["name"], "value": json_path(obj, str(value_from["jsonPath"]))})
        except ConditionError as exc:
            if "default" in value_from:
                params.append({"name": param["name"], "value": str(value_from["default"])})
            else:
                raise NodeError(f"failed to save outputs: {exc}") from exc
    return params

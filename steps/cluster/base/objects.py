"""The port's calls on any object (get, create, patch, delete, list) by apiVersion and kind."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from steps.cluster.base.core import PortCore, logged
from steps.cluster.patches import merge_patch
from steps.cluster.port import Propagation
from steps.cluster.resources import Resource, resource
from steps.cluster.selectors import parse_selector
from steps.errors import InputError

__all__ = ["ObjectCalls"]


class ObjectCalls(PortCore):
    """The any-object calls of :class:`~steps.cluster.port.ClusterPort`."""

    @staticmethod
    def _target(res: Resource, name: str, namespace: str | None) -> str:
        ns = res.namespace_for(namespace)
        return f"{res.kind.lower()}/{ns}/{name}" if ns else f"{res.kind.lower()}/{name}"

    @logged
    def get_object(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """Any object, or ``None`` if it does not exist."""
        res = resource(api_version, kind)
        ns = res.namespace_for(namespace)
        return self._run("get_object", self._target(res, name, ns), True, lambda: self._get(res, name, ns))

    @logged
    def create_object(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object; not retried after the server may have acted on it."""
        api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
        name = (manifest.get("metadata") or {}).get("name")
        if not isinstance(api_version, str) or not isinstance(kind, str) or not isinstance(name, str):
            raise InputError("create_object: the manifest needs apiVersion, kind and metadata.name")
        res = resource(api_version, kind)
        ns = res.namespace_for((manifest.get("metadata") or {}).get("namespace"))
        body = merge_patch(manifest, {"metadata": {"namespace": ns}}) if ns else dict(manifest)
        return self._run(
            "create_object", self._target(res, name, ns), False, lambda: self._create(res, ns, body)
        )

    @logged
    def patch_object(
        self, api_version: str, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch an object."""
        res = resource(api_version, kind)
        ns = res.namespace_for(namespace)
        return self._run(
            "patch_object", self._target(res, name, ns), True, lambda: self._patch(res, name, ns, patch)
        )

    @logged
    def delete_object(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        propagation: Propagation | None = "Background",
    ) -> bool:
        """Delete an object with ``propagationPolicy`` (server default when ``None``); ``False`` if gone.

        batch/v1 Jobs orphan their pods unless the policy is given: the pods would run on and keep
        their GPUs.
        """
        if propagation not in (None, "Background", "Foreground", "Orphan"):
            raise InputError(
                f"delete_object: propagation must be Background, Foreground or Orphan, not {propagation!r}"
            )
        res = resource(api_version, kind)
        ns = res.namespace_for(namespace)
        return self._run(
            "delete_object",
            self._target(res, name, ns),
            True,
            lambda: self._delete(res, name, ns, None, propagation),
        )

    @logged
    def list_objects(
        self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Objects of a kind, sorted by namespace and name, each with its apiVersion and kind."""
        parse_selector(label_selector)
        res = resource(api_version, kind)
        target = f"{res.plural} in {namespace}" if namespace and res.namespaced else res.plural
        items = self._run(
            "list_objects",
            target,
            True,
            lambda: self._list(res, namespace if res.namespaced else None, label_selector, None),
        )
        out = [{"apiVersion": api_version, "kind": kind, **item} for item in items]
        return sorted(
            out, key=lambda o: ((o.get("metadata") or {}).get("namespace") or "", o["metadata"]["name"])
        )

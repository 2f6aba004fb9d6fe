"""REST paths of Kubernetes kinds: ``apiVersion`` and ``kind`` to ``/api/v1/...`` or ``/apis/g/v/...``.

Plurals come from a table of the kinds dsx uses whose plural is irregular, else from the API's own
rule (lower case, then ``s``; ``es`` after s, x, ch, sh; ``ies`` after a consonant and y). Whether a
kind is cluster-scoped comes from a table as well; every other kind is taken to be namespaced, and
a namespaced kind named without a namespace lives in ``default``, as with ``kubectl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

__all__ = ["CLUSTER_SCOPED", "IRREGULAR_PLURALS", "Resource", "plural_of", "resource"]

IRREGULAR_PLURALS: dict[str, str] = {
    "Endpoints": "endpoints",
    "PodSecurityPolicy": "podsecuritypolicies",
}

CLUSTER_SCOPED: frozenset[str] = frozenset(
    {
        "APIService",
        "CSIDriver",
        "CSINode",
        "ClusterPolicy",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterWorkflowTemplate",
        "CustomResourceDefinition",
        "IngressClass",
        "MutatingWebhookConfiguration",
        "Namespace",
        "Node",
        "NodeFeatureRule",
        "PersistentVolume",
        "PriorityClass",
        "RuntimeClass",
        "StorageClass",
        "ValidatingWebhookConfiguration",
    }
)

DEFAULT_NAMESPACE = "default"


def plural_of(kind: str) -> str:
    """The resource name of a kind: ``Node`` -> ``nodes``, ``NetworkPolicy`` -> ``networkpolicies``."""
    if kind in IRREGULAR_PLURALS:
        return IRREGULAR_PLURALS[kind]
    lower = kind.lower()
    if lower.endswith(("s", "x", "ch", "sh")):
        return lower + "es"
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        return lower[:-1] + "ies"
    return lower + "s"


@dataclass(frozen=True)
class Resource:
    """A kind's place in the API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def base(self) -> str:
        """``/api/v1`` for the core group, ``/apis/GROUP/VERSION`` otherwise."""
        return "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"

    def namespace_for(self, namespace: str | None) -> str | None:
        """The namespace a named object of this kind lives in (``None`` for cluster-scoped kinds)."""
        if not self.namespaced:
            return None
        return namespace or DEFAULT_NAMESPACE

    def collection_path(self, namespace: str | None = None) -> str:
        """Path listing or creating objects; all namespaces when ``namespace`` is ``None``."""
        if self.namespaced and namespace:
            return f"{self.base}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{self.base}/{self.plural}"

    def object_path(self, name: str, namespace: str | None = None, subresource: str | None = None) -> str:
        """Path of one object (and optionally one of its subresources)."""
        path = f"{self.collection_path(self.namespace_for(namespace))}/{quote(name, safe='')}"
        return f"{path}/{subresource}" if subresource else path


def resource(api_version: str, kind: str) -> Resource:
    """Where objects of ``kind`` in ``api_version`` live in the API."""
    return Resource(api_version, kind, plural_of(kind), kind not in CLUSTER_SCOPED)

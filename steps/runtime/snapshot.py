"""Snapshot: what the live cluster runs, read through the cluster port.

Per node: OS image, kernel, kubelet and container runtime versions (``status.nodeInfo``); GPU product,
count, driver and CUDA versions from the labels GPU Feature Discovery sets. Per Helm release: chart,
chart version and status, decoded from the release secrets Helm 3 and 4 keep. Per workload
(Deployment, DaemonSet, StatefulSet) in a namespace holding a release: its container images.

Release Secrets are read in the namespaces ``DSX_HELM_NAMESPACES`` lists (comma-separated), or in every
namespace when it is empty or unset. Listing Secrets returns their contents, so in a cluster the drift
workflow's account may list them only where the chart grants it (``drift.helmNamespaces``).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ForbiddenError
from steps.errors import InputError
from steps.models import Strict, validate
from steps.runtime.yamlio import load_yaml
from steps.yamlio import parse_json, read_text

if TYPE_CHECKING:
    from steps.cluster.port import ClusterPort, Node

__all__ = [
    "GFD_LABELS",
    "NodeSnapshot",
    "ReleaseSnapshot",
    "Snapshot",
    "WorkloadImage",
    "decode_helm_release",
    "helm_namespaces",
    "node_snapshot",
    "read_snapshot",
    "take_snapshot",
]

GFD_LABELS = {
    "product": "nvidia.com/gpu.product",
    "count": "nvidia.com/gpu.count",
    "present": "nvidia.com/gpu.present",
    "driver_full": "nvidia.com/cuda.driver-version.full",
    "driver_major": "nvidia.com/cuda.driver.major",
    "driver_minor": "nvidia.com/cuda.driver.minor",
    "driver_rev": "nvidia.com/cuda.driver.rev",
    "cuda_full": "nvidia.com/cuda.runtime-version.full",
    "cuda_major": "nvidia.com/cuda.runtime.major",
    "cuda_minor": "nvidia.com/cuda.runtime.minor",
}
"""GPU Feature Discovery labels read (newer ``*-version.full`` labels first, then the split ones)."""

HELM_NAMESPACES_ENV = vocab.ENV_HELM_NAMESPACES
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

_WORKLOAD_KINDS = (("apps/v1", "Deployment"), ("apps/v1", "DaemonSet"), ("apps/v1", "StatefulSet"))


class NodeSnapshot(Strict):
    """One node's software as the cluster reports it (empty strings where nothing is reported)."""

    name: str
    osImage: str = ""
    kernelVersion: str = ""
    kubeletVersion: str = ""
    containerRuntimeVersion: str = ""
    architecture: str = ""
    gpuProduct: str = ""
    gpuCount: int = 0
    driverVersion: str = ""
    cudaVersion: str = ""


class ReleaseSnapshot(Strict):
    """The deployed revision of one Helm release."""

    name: str
    namespace: str
    chart: str
    version: str
    appVersion: str = ""
    status: str = ""
    revision: int = 0


class WorkloadImage(Strict):
    """One container image of one workload."""

    namespace: str
    kind: str
    name: str
    container: str
    image: str


class Snapshot(Strict):
    """A cluster snapshot (kind ClusterSnapshot): nodes, Helm releases, workload images."""

    apiVersion: vocab.ApiVersion = vocab.API_VERSION
    kind: Literal["ClusterSnapshot"] = "ClusterSnapshot"
    cluster: str = ""
    nodes: list[NodeSnapshot] = Field(default_factory=list)
    releases: list[ReleaseSnapshot] = Field(default_factory=list)
    images: list[WorkloadImage] = Field(default_factory=list)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _joined(labels: Mapping[str, str], *keys: str) -> str:
    parts = [labels.get(GFD_LABELS[k], "") for k in keys]
    while parts and not parts[-1]:
        parts.pop()
    return ".".join(parts) if parts and all(parts) else ""


def node_snapshot(node: Node) -> NodeSnapshot:
    """The software facts of one node, from its nodeInfo and GPU Feature Discovery labels."""
    labels = node.labels
    info = node.node_info
    count = _int(labels.get(GFD_LABELS["count"], "")) or node.gpu_count
    driver = labels.get(GFD_LABELS["driver_full"]) or _joined(
        labels, "driver_major", "driver_minor", "driver_rev"
    )
    cuda = labels.get(GFD_LABELS["cuda_full"]) or _joined(labels, "cuda_major", "cuda_minor")
    return NodeSnapshot(
        name=node.name,
        osImage=info.os_image,
        kernelVersion=info.kernel_version,
        kubeletVersion=info.kubelet_version,
        containerRuntimeVersion=info.container_runtime_version,
        architecture=info.architecture or labels.get("kubernetes.io/arch", ""),
        gpuProduct=labels.get(GFD_LABELS["product"], ""),
        gpuCount=count,
        driverVersion=driver,
        cudaVersion=cuda,
    )


def _b64(data: str | bytes) -> bytes:
    return base64.b64decode(data, validate=False)


def decode_helm_release(secret: Mapping[str, Any]) -> dict[str, Any] | None:
    """The release JSON inside a Helm release secret (``type: helm.sh/release.v1``), or None.

    The API returns the secret's ``data.release`` base64-encoded; Helm's own payload inside is
    base64 of gzipped JSON (plain JSON in very old releases).
    """
    data = (secret.get("data") or {}).get("release")
    if not data:
        return None
    try:
        payload = _b64(_b64(data))
        if payload[:2] == b"\x1f\x8b":
            payload = gzip.decompress(payload)
        decoded = json.loads(payload)
    except (binascii.Error, ValueError, OSError, EOFError):
        return None
    return decoded if isinstance(decoded, dict) else None


def _release(secret: Mapping[str, Any]) -> ReleaseSnapshot | None:
    meta = secret.get("metadata") or {}
    labels = meta.get("labels") or {}
    release = decode_helm_release(secret)
    chart_meta = ((release or {}).get("chart") or {}).get("metadata") or {}
    name = labels.get("name") or (release or {}).get("name") or ""
    if not name:
        return None
    return ReleaseSnapshot(
        name=str(name),
        namespace=str(meta.get("namespace") or (release or {}).get("namespace") or ""),
        chart=str(chart_meta.get("name", "")),
        version=str(chart_meta.get("version", "")),
        appVersion=str(chart_meta.get("appVersion", "")),
        status=str(labels.get("status") or ((release or {}).get("info") or {}).get("status", "")),
        revision=_int(str(labels.get("version") or (release or {}).get("version") or 0)),
    )


def _latest_releases(secrets: Iterable[Mapping[str, Any]]) -> list[ReleaseSnapshot]:
    latest: dict[tuple[str, str], ReleaseSnapshot] = {}
    for secret in secrets:
        if secret.get("type") not in (None, "helm.sh/release.v1"):
            continue
        release = _release(secret)
        if release is None:
            continue
        key = (release.namespace, release.name)
        current = latest.get(key)
        deployed = release.status == "deployed"
        if current is None or (deployed, release.revision) > (current.status == "deployed", current.revision):
            latest[key] = release
    return [latest[key] for key in sorted(latest)]


def _images(objects: Iterable[Mapping[str, Any]], kind: str) -> list[WorkloadImage]:
    found: list[WorkloadImage] = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        pod_spec = (((obj.get("spec") or {}).get("template") or {}).get("spec")) or {}
        for container in [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]:
            found.append(
                WorkloadImage(
                    namespace=str(meta.get("namespace", "")),
                    kind=kind,
                    name=str(meta.get("name", "")),
                    container=str(container.get("name", "")),
                    image=str(container.get("image", "")),
                )
            )
    return found


def helm_namespaces(text: str | None = None) -> list[str] | None:
    """The namespaces whose Helm releases are read: ``text`` (default ``$DSX_HELM_NAMESPACES``) as a
    sorted list, or ``None`` for every namespace when it is empty.

    Raises:
        InputError: an entry is not a namespace name.
    """
    raw = os.environ.get(HELM_NAMESPACES_ENV, "") if text is None else text
    names = sorted({part.strip() for part in raw.split(",") if part.strip()})
    for name in names:
        if not _NAMESPACE.match(name):
            raise InputError(f"{HELM_NAMESPACES_ENV}: {name!r} is not a namespace name (e.g. gpu-operator)")
    return names or None


def _release_secrets(port: ClusterPort, namespaces: Sequence[str] | None) -> list[dict[str, Any]]:
    """The Helm release Secrets of ``namespaces`` (every namespace when ``None``)."""
    secrets: list[dict[str, Any]] = []
    for namespace in namespaces if namespaces is not None else [None]:
        try:
            secrets.extend(port.list_objects("v1", "Secret", namespace, "owner=helm"))
        except ForbiddenError as exc:
            where = f"in namespace {namespace}" if namespace else "in every namespace"
            raise ForbiddenError(
                exc.call,
                exc.target,
                f"{exc.detail}; reading Helm releases {where} needs list on secrets there: list the "
                f"namespaces in {HELM_NAMESPACES_ENV} (chart value drift.helmNamespaces) or grant access",
                exc.status,
            ) from None
    return secrets


def take_snapshot(
    port: ClusterPort,
    cluster: str = "",
    selector: str | None = None,
    namespaces: Sequence[str] | None = None,
) -> Snapshot:
    """Read nodes, Helm releases and workload images through the cluster port.

    Args:
        port: a connected cluster.
        cluster: how the snapshot names the cluster (the ``--cluster`` spec).
        selector: label selector restricting the nodes read.
        namespaces: namespaces whose Helm releases are read; ``None``: those of
            ``$DSX_HELM_NAMESPACES`` (:func:`helm_namespaces`), every namespace when it is empty.

    Raises:
        InputError: ``$DSX_HELM_NAMESPACES`` names something that is not a namespace.
        ForbiddenError: the account may not list release Secrets where they are read.
    """
    wanted = helm_namespaces() if namespaces is None else helm_namespaces(",".join(namespaces))
    nodes = [node_snapshot(node) for node in port.list_nodes(selector)]
    releases = _latest_releases(_release_secrets(port, wanted))
    images: list[WorkloadImage] = []
    for namespace in sorted({r.namespace for r in releases}):
        for api_version, kind in _WORKLOAD_KINDS:
            images.extend(_images(port.list_objects(api_version, kind, namespace, None), kind))
    images.sort(key=lambda i: (i.namespace, i.kind, i.name, i.container))
    return Snapshot(
        cluster=cluster, nodes=sorted(nodes, key=lambda n: n.name), releases=releases, images=images
    )


def read_snapshot(path: Path) -> Snapshot:
    """Load a snapshot written by ``dsx snapshot -o json|yaml``.

    Raises:
        InputError: unreadable, or not a ClusterSnapshot (with the line).
    """
    path = Path(path)
    raw = parse_json(read_text(path), str(path)) if path.suffix == ".json" else load_yaml(path, str(path))
    return validate(Snapshot, raw, str(path), what="ClusterSnapshot")

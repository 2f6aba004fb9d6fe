"""Helm releases of a simulated fleet, stored as Helm 3 stores them: one Secret per release revision.

A release is written ``[NAMESPACE/]NAME@VERSION`` in a short spec (``releases=`` with ``;`` between
releases; the namespace and the chart default to the release name), or as a mapping in a fleet file::

    releases:
      - name: gpu-operator            # the release
        namespace: gpu-operator       # default: the name
        chart: gpu-operator           # default: the name
        version: v25.3.4              # the chart version
        appVersion: v25.3.4           # default: the chart version
        status: deployed              # default; any Helm status (failed, pending-upgrade...)
        revision: 1                   # default
        images: [nvcr.io/nvidia/gpu-operator:v25.3.4]
      - monitoring/kube-prometheus-stack@75.15.0

Each release becomes the Secret ``sh.helm.release.v1.NAME.vREVISION`` in its namespace, of type
``helm.sh/release.v1``, labelled ``owner=helm``, ``name``, ``status``, ``version`` (the revision) and
``createdAt``, whose ``release`` key holds base64 of the gzipped release JSON (so the API shows it
base64-encoded twice), exactly what Helm's secrets driver writes. A release with ``images`` also gets a
Deployment named after it in its namespace, one container per image, labelled and annotated as Helm
labels what it installs.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import json
import re
import uuid
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from steps.cluster.sim.model import Fleet, object_key

__all__ = ["HELM_STATUSES", "Release", "install_releases", "parse_release", "release_objects"]

HELM_STATUSES = (
    "unknown",
    "deployed",
    "uninstalled",
    "superseded",
    "failed",
    "uninstalling",
    "pending-install",
    "pending-upgrade",
    "pending-rollback",
)
"""Every status Helm gives a release revision."""

_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SHORT = re.compile(r"^(?:(?P<namespace>[^/@]+)/)?(?P<name>[^/@]+)@(?P<version>\S+)$")
_ZERO_TIME = "0001-01-01T00:00:00Z"


class Release(BaseModel):
    """One deployed Helm release (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(max_length=53)
    namespace: str = ""
    chart: str = ""
    version: str = Field(min_length=1)
    app_version: str = Field("", alias="appVersion")
    status: str = "deployed"
    revision: int = Field(1, ge=1)
    images: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _short(cls, value: Any) -> Any:
        return parse_release(value) if isinstance(value, str) else value

    @field_validator("name", "namespace", "chart")
    @classmethod
    def _dns(cls, value: str) -> str:
        if value and not _DNS_NAME.match(value):
            raise ValueError(f"{value!r} is not a valid name (lower-case letters, digits, '-' and '.')")
        return value

    @field_validator("status")
    @classmethod
    def _status(cls, value: str) -> str:
        if value not in HELM_STATUSES:
            raise ValueError(f"status {value!r} is not a Helm status ({', '.join(HELM_STATUSES)})")
        return value

    @model_validator(mode="after")
    def _defaults(self) -> Release:
        self.namespace = self.namespace or self.name
        self.chart = self.chart or self.name
        self.app_version = self.app_version or self.version
        return self

    @property
    def secret_name(self) -> str:
        """The name Helm gives the revision's Secret."""
        return f"sh.helm.release.v1.{self.name}.v{self.revision}"


def parse_release(text: str) -> dict[str, str]:
    """``[NAMESPACE/]NAME@VERSION`` as the fields of a :class:`Release`.

    Raises:
        ValueError: the text is not of that form.
    """
    match = _SHORT.match(text.strip())
    if match is None:
        raise ValueError(f"release {text!r} is not [NAMESPACE/]NAME@VERSION")
    fields = {"name": match.group("name"), "version": match.group("version")}
    if match.group("namespace"):
        fields["namespace"] = match.group("namespace")
    return fields


def _uid(kind: str, namespace: str, name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{kind}.{namespace}.{name}.sim.dsx.dev"))


def _container_names(images: list[str]) -> list[str]:
    names: list[str] = []
    for image in images:
        repository = image.partition("@")[0]
        slash, colon = repository.rfind("/"), repository.rfind(":")
        base = repository[slash + 1 : colon if colon > slash else None] or "main"
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names


def _deployment(release: Release, created: str) -> dict[str, Any]:
    selector = {"app.kubernetes.io/instance": release.name, "app.kubernetes.io/name": release.chart}
    labels = {
        **selector,
        "app.kubernetes.io/managed-by": "Helm",
        "app.kubernetes.io/version": release.app_version,
        "helm.sh/chart": f"{release.chart}-{release.version}",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": release.name,
            "namespace": release.namespace,
            "labels": labels,
            "annotations": {
                "meta.helm.sh/release-name": release.name,
                "meta.helm.sh/release-namespace": release.namespace,
            },
            "uid": _uid("Deployment", release.namespace, release.name),
            "creationTimestamp": created,
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {
                    "containers": [
                        {"name": name, "image": image}
                        for name, image in zip(_container_names(release.images), release.images, strict=True)
                    ]
                },
            },
        },
    }


def _helm_payload(release: Release, created: str, manifest: str) -> str:
    """Helm's encoding of a release: JSON, gzipped, base64 (``encodeRelease`` in Helm's storage driver)."""
    document = {
        "name": release.name,
        "info": {
            "first_deployed": created,
            "last_deployed": created,
            "deleted": _ZERO_TIME,
            "description": "Install complete" if release.revision == 1 else "Upgrade complete",
            "status": release.status,
        },
        "chart": {
            "metadata": {
                "name": release.chart,
                "version": release.version,
                "appVersion": release.app_version,
                "apiVersion": "v2",
            },
            "lock": None,
            "templates": [],
            "values": {},
            "schema": None,
            "files": [],
        },
        "config": {},
        "manifest": manifest,
        "version": release.revision,
        "namespace": release.namespace,
    }
    raw = json.dumps(document, separators=(",", ":")).encode()
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode()


def release_objects(release: Release, created: str) -> list[dict[str, Any]]:
    """The objects a release leaves in the cluster, as the API shows them: its Secret, then its
    Deployment when it has images (no ``resourceVersion``; the store assigns one)."""
    workload = _deployment(release, created) if release.images else None
    manifest = ""
    if workload is not None:
        manifest = "---\n# Source: deployment.yaml\n" + yaml.safe_dump(workload, sort_keys=True)
    payload = _helm_payload(release, created, manifest)
    when = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "helm.sh/release.v1",
        "metadata": {
            "name": release.secret_name,
            "namespace": release.namespace,
            "labels": {
                "createdAt": str(int(when.timestamp())),
                "name": release.name,
                "owner": "helm",
                "status": release.status,
                "version": str(release.revision),
            },
            "uid": _uid("Secret", release.namespace, release.secret_name),
            "creationTimestamp": created,
        },
        # A Secret's data is base64 on the wire: Helm's payload (already base64 text) encoded once more.
        "data": {"release": base64.b64encode(payload.encode()).decode()},
    }
    return [secret, workload] if workload else [secret]


def install_releases(fleet: Fleet, releases: list[Release], created: str) -> None:
    """Store each release's objects in the fleet (a fleet spec has checked that no two releases share a
    namespace and a name)."""
    for release in releases:
        for obj in release_objects(release, created):
            meta = obj["metadata"]
            meta["resourceVersion"] = fleet.next_revision()
            fleet.objects[object_key(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])] = obj

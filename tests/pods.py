"""Pods for tests that ask an API server, emulated or real, what it admits."""

from __future__ import annotations

import uuid
from typing import Any

from steps.readiness.launchers.jobspec import JobSettings, render_group_job
from steps.readiness.models import Subject
from steps.readiness.outcomes import RunRef

__all__ = ["bare_pod", "rank_job", "rank_pod"]


def rank_job(namespace: str, service_account: str = "default") -> dict[str, Any]:
    """A real group Job as dsx renders it, its rank pods running as ``service_account``."""
    settings = JobSettings(
        namespace=namespace,
        image="ghcr.io/dsx-dev/dsx-gpu:0.1.0",
        service_account=service_account,
        gpus_per_node=2,
        run=RunRef(name="dsx-certify-x", uid=str(uuid.uuid4()), namespace=namespace),
    )
    return render_group_job(
        "allreduce-sweep",
        Subject(kind="node", name="node-00", members=["node-00"]),
        "steps.x",
        [],
        settings,
        60,
    ).job


def rank_pod(namespace: str) -> dict[str, Any]:
    """A pod with the template of a real group Job's rank pods, as dsx renders it."""
    template = rank_job(namespace)["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rank", **template["metadata"]},
            "spec": template["spec"]}  # fmt: skip


def bare_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare"},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
    }

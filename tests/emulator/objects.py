"""Objects and waits the doubles' tests and the cluster port's tests build on: a rank Job as dsx's Job
launcher makes one, its headless Service, its pods, conditions by type, a wait for a condition."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.emulator.apiserver import Emulator

GPU_FLEET = "sim:nodes=16,gpu=h100,racks=4,workloads=false"


def group_job(
    name: str,
    members: list[str],
    gpus: int = 8,
    command: tuple[str, ...] = ("sleep", "600"),
    deadline: int | None = None,
    backoff: int = 0,
    namespace: str = "dsx",
) -> dict[str, Any]:
    """An Indexed Job shaped like a dsx group test: one pod per member node, all its GPUs, apart."""
    label = {"dsx.dev/group-test": name}
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": len(members),
        "parallelism": len(members),
        "backoffLimit": backoff,
        "template": {
            "metadata": {"labels": dict(label)},
            "spec": {
                "subdomain": name,
                "restartPolicy": "Never",
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "kubernetes.io/hostname", "operator": "In", "values": members}
                                    ]
                                }
                            ]
                        }
                    },
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "labelSelector": {"matchLabels": dict(label)},
                                "topologyKey": "kubernetes.io/hostname",
                            }
                        ]
                    },
                },
                "tolerations": [{"key": "dsx.dev/unhealthy", "operator": "Exists"}],
                "containers": [
                    {
                        "name": "ranks",
                        "image": "registry.example/dsx-gpu:1",
                        "command": list(command),
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    }
                ],
            },
        },
    }
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(label)},
        "spec": spec,
    }


def headless_service(name: str, namespace: str = "dsx") -> dict[str, Any]:
    """The headless Service that gives a group's pods their DNS names (``JOB-INDEX.NAME``)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"dsx.dev/group-test": name},
            "ports": [{"name": "rendezvous", "port": 29500}],
        },
    }


def job_pods(emulator: Emulator, job: str, namespace: str = "dsx") -> list[dict[str, Any]]:
    """The Job's pods, by completion index."""
    pods = [
        p
        for p in emulator.objects("pods", namespace)
        if (p["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-name") == job
    ]
    return sorted(
        pods, key=lambda p: int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
    )


def conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """An object's conditions by type."""
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def eventually(check: Callable[[], Any], timeout: float = 20.0, what: str = "the condition") -> Any:
    """Poll ``check`` until it returns something truthy (for the controllers that run in threads)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.02)

"""Argo's names for nodes and pods, so a local run's IDs are the ones a cluster would give.

Mirrors ``workflow/util/pod_name.go`` (``GeneratePodName``, v2 names), the node ID Argo derives from a
node's name (FNV-1a, 32 bits), and ``getStepOrDAGTaskName`` from ``workflow/controller/operator.go``.
Tests, logs and ``workflow.json`` compare these with what ``argo get`` shows, so they must match.
"""

from __future__ import annotations

__all__ = ["fnv32a", "node_id", "pod_name", "step_or_task_name"]


def fnv32a(text: str) -> int:
    """The 32-bit FNV-1a hash of ``text`` (UTF-8), as Go's ``hash/fnv`` computes it."""
    value = 0x811C9DC5
    for byte in text.encode():
        value ^= byte
        value = (value * 0x01000193) & 0xFFFFFFFF
    return value


def node_id(workflow: str, name: str) -> str:
    """Argo's node ID: the workflow name for the root, else ``<workflow>-<fnv32a(node name)>``."""
    return workflow if name == workflow else f"{workflow}-{fnv32a(name)}"


def pod_name(workflow: str, name: str, template: str | None) -> str:
    """Argo's (v2) pod name: ``<workflow>-<template>-<fnv32a(node name)>``."""
    if name == workflow:
        return workflow
    prefix = f"{workflow}-{template}" if template else workflow
    return f"{prefix[:242]}-{fnv32a(name)}"


def step_or_task_name(node_name: str) -> str:
    """Argo's getStepOrDAGTaskName: ``wf.fan(0:a)(1)`` -> ``fan``, ``wf[0].flip`` -> ``flip``."""
    name = node_name
    opener = ""
    for index in range(len(name) - 1, -1, -1):
        char = name[index]
        if opener and char == opener:
            opener = ""
        elif opener:
            continue
        elif char == ")":
            opener = "("
        elif char == "]":
            opener = "["
        else:
            name = name[: index + 1]
            break
    return name.rsplit(".", 1)[-1]

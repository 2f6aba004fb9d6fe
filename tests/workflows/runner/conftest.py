"""Helpers for the runner tests: load a fixture workflow and run it into a temporary run folder."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests import yamltext
from workflows.runner import NodeStatus, RunOptions, RunResult, run

FIXTURES = Path(__file__).parent / "fixtures"


def load(filename: str, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The workflow ``name`` of a fixture file, and the file's other documents as its library."""
    docs = [d for d in yamltext.load_all((FIXTURES / filename).read_text()) if d]
    entry = next(d for d in docs if d["metadata"]["name"] == name)
    return entry, [d for d in docs if d is not entry]


RunFixture = Callable[..., RunResult]


@pytest.fixture
def run_fixture(tmp_path: Path) -> RunFixture:
    """Run a fixture workflow into ``tmp_path/run-N``; keyword arguments go to :class:`RunOptions`."""
    counter = iter(range(1000))

    def go(
        filename: str,
        name: str,
        parameters: dict[str, str] | None = None,
        approve: Sequence[str] = (),
        **options: Any,
    ) -> RunResult:
        entry, library = load(filename, name)
        options.setdefault("allow_host_commands", True)  # the fixtures' steps are not dsx's own
        opts = RunOptions(
            out_dir=tmp_path / f"run-{next(counter)}", approve=approve, workflow_name="wf", **options
        )
        return run(entry, library, parameters or {}, opts)

    return go


def by_name(result: RunResult, display: str) -> list[Any]:
    """Every node with this display name, in name order."""
    return sorted((n for n in result.nodes.values() if n.display_name == display), key=lambda n: n.name)


def printed(result: RunResult, node: NodeStatus) -> str:
    """What a step printed (its stdout log in the run folder), less the final newline.

    Argo keeps that as ``outputs.result`` only when the step's DAG or steps template references it;
    tests read the log to see what a step said either way.
    """
    assert node.folder is not None, f"{node.display_name} has no folder"
    text = (result.run_dir / node.folder / "stdout.log").read_text()
    return text[:-1] if text.endswith("\n") else text


def workflow(templates: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A small WorkflowTemplate written inline; ``main`` is its entrypoint unless ``spec`` says."""
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "WorkflowTemplate",
        "metadata": {"name": "dsx-inline"},
        "spec": {"entrypoint": "main", "templates": templates, **spec},
    }


def shell(name: str, command: str, **extra: Any) -> dict[str, Any]:
    """A container template that runs ``sh -c command``; ``extra`` adds template fields."""
    return {
        "name": name,
        "container": {"image": "alpine", "command": ["sh", "-c"], "args": [command]},
        **extra,
    }

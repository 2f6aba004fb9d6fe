"""The arrows of the design hold: the import contracts catch an upward import, and the cluster port
loads without the simulator (a node agent pays for it on every GPU node)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def _imported(code: str) -> list[str]:
    """The modules ``python -X importtime -c CODE`` imports, in order."""
    done = _run([sys.executable, "-X", "importtime", "-c", code], REPO)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return [line.rsplit("|", 1)[1].strip() for line in lines]


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: install the dev extra (import-linter)"
    return _run([str(LINT_IMPORTS), "--no-logo", "--no-cache"], root)


def test_importing_the_cluster_port_leaves_the_simulator_unloaded() -> None:
    modules = _imported("import steps.cluster")
    assert "steps.cluster.connect" in modules and "steps.cluster.health" in modules
    assert [m for m in modules if m.startswith("steps.cluster.sim")] == []


def test_a_real_cluster_spec_made_shareable_loads_no_simulator() -> None:
    modules = _imported("import pathlib, steps.cluster as c; c.shareable('kube', pathlib.Path('.'))")
    assert "steps.cluster.connect" in modules
    assert [m for m in modules if m.startswith("steps.cluster.sim")] == []


def test_a_sim_spec_loads_the_simulator_when_asked() -> None:
    modules = _imported("from steps.cluster import connect; connect('sim:nodes=1')")
    assert "steps.cluster.sim.cluster" in modules


def test_the_import_contracts_hold_on_the_tree() -> None:
    done = _lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 broken" in done.stdout and "kept" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        (
            "steps/cluster/errors.py",
            "import workflows.compiler",
            "layers: workflows > steps parts > steps.cluster > shared helpers > steps.errors",
        ),
        ("steps/readiness/judge.py", "import hera.workflows", "no hera and no workflows under steps"),
        (
            "steps/runtime/criteria.py",
            "import steps.readiness.models",
            "the steps' parts never import each other",
        ),
        (
            "steps/readiness/ranks/sweep.py",
            "from steps.cluster import ClusterPort",
            "rank programs touch neither the cluster nor their launchers",
        ),
        (
            "steps/readiness/ranks/rankenv.py",
            "import steps.readiness.launchers.local",
            "rank programs touch neither the cluster nor their launchers",
        ),
        (
            "workflows/runner/exit_handler.py",
            "from workflows.runner.templates import execute",
            "steps, DAG and exit handler reach templates through the run state",
        ),
        (
            "workflows/runner/events.py",
            "import steps.sentinel.node",
            "the runner runs only YAML: no templates, compiler, CLI, player or steps' parts",
        ),
        (
            "workflows/runner/host.py",
            "from workflows.compiler import compiled_documents",
            "the runner runs only YAML: no templates, compiler, CLI, player or steps' parts",
        ),
    ],
)
def test_an_import_against_the_arrows_breaks_its_contract(
    tmp_path: Path, module: str, line: str, broken: str
) -> None:
    for package in ("steps", "workflows"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # against the arrows\n")
    done = _lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{broken} BROKEN" in done.stdout
    assert module.removesuffix(".py").replace("/", ".") in done.stdout

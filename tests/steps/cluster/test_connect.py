"""Choosing the cluster: ``--cluster`` specs, ``DSX_CLUSTER``, and what is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from steps.cluster import ClusterConfigError, ClusterPort, connect, shareable
from steps.cluster.sim import SimCluster
from tests.emulator.apiserver import write_kubeconfig


def test_environment_names_the_cluster_when_no_spec_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSX_CLUSTER", "sim:nodes=3,gpu=a100")
    port = connect()
    assert isinstance(port, SimCluster)
    assert isinstance(port, ClusterPort)
    assert port.endpoint == "sim:nodes=3,gpu=a100"
    assert [n.gpu_product for n in port.list_nodes()] == ["NVIDIA-A100-SXM4-80GB"] * 3


def test_plain_sim_gives_the_default_fleet() -> None:
    assert len(connect("sim:").list_nodes()) == 8


@pytest.mark.parametrize("spec", ["kubernetes", "sim:fleet.json", "cluster.txt"])
def test_unknown_spec_forms_are_refused_with_the_accepted_ones(spec: str) -> None:
    with pytest.raises(ClusterConfigError, match="expected sim:KEY=VALUE"):
        connect(spec)


def test_kubeconfig_options_do_not_apply_to_a_simulated_fleet() -> None:
    with pytest.raises(ClusterConfigError, match="--kubeconfig and --context apply to a real cluster"):
        connect("sim:nodes=2", kubeconfig="some/config")


def test_missing_fleet_state_is_named(tmp_path: Path) -> None:
    with pytest.raises(ClusterConfigError, match=r"fleet state .*gone.json does not exist"):
        connect(f"state:{tmp_path / 'gone.json'}")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ClusterConfigError, match="is unreadable"):
        connect(f"state:{broken}").list_nodes()


#: In a fresh interpreter: import what port_modules names, then open the port; print what connect imported
#: beyond that, of dsx's cluster modules and the Kubernetes client.
_IMPORTS_AFTER = """
import importlib, sys
from steps.cluster import connect, port_modules
spec = sys.argv[1]
for module in port_modules(spec):
    importlib.import_module(module)
before = set(sys.modules)
port = connect(spec, sys.argv[2] if len(sys.argv) > 2 else None)
if spec.startswith(("sim:", "state:")):
    port.list_nodes()
print(sorted(m for m in set(sys.modules) - before if m.startswith(("steps.cluster", "kubernetes"))))
"""


@pytest.mark.parametrize("kind", ["sim", "state", "kube"])
def test_port_modules_name_everything_connect_imports_to_open_the_port(kind: str, tmp_path: Path) -> None:
    """A fork server imports these once for every step of a run (workflows.runner.engine.preload)."""
    args = {
        "sim": ["sim:nodes=2"],
        "state": [shareable("sim:nodes=2", tmp_path)],
        "kube": ["kube", str(write_kubeconfig(tmp_path / "config", "https://127.0.0.1:1"))],
    }[kind]
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS_AFTER, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

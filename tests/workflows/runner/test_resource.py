"""Resource templates through the cluster port, on a simulated fleet shared by every step."""

from pathlib import Path

import pytest

from tests.workflows.runner.conftest import RunFixture, printed
from workflows.runner import Phase


def test_resource_templates_create_wait_patch_read_and_delete(run_fixture: RunFixture) -> None:
    from steps.cluster import connect

    result = run_fixture("resource.yaml", "dsx-fixture-resource", cluster="sim:")
    assert result.phase is Phase.Succeeded
    assert result.node("create").outputs["parameters"] == [{"name": "name", "value": "dsx-fixture"}]
    assert result.node("wait").phase is Phase.Succeeded
    read = result.node("read")
    assert (read.phase, read.message) == (
        Phase.Failed,
        "failure condition 'data.phase == Broken' evaluated true",
    )
    fleet = result.run_dir / "fleet.json"
    assert fleet.exists()
    port = connect(f"state:{fleet}")
    assert port.get_object("v1", "ConfigMap", "dsx-fixture", "dsx") is None  # deleted by the last step


def test_a_resource_template_without_a_cluster_fails_saying_so(
    run_fixture: RunFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.delenv("DSX_CLUSTER", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = run_fixture("resource.yaml", "dsx-fixture-resource")
    create = result.node("create")
    assert create.phase is Phase.Error
    assert "needs a cluster" in create.message
    assert result.phase is Phase.Failed


def test_every_step_shares_one_simulated_fleet(tmp_path: Path) -> None:
    from workflows.runner import RunOptions, run

    doc = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "fleet-"},
        "spec": {
            "entrypoint": "main",
            "templates": [
                {
                    "name": "main",
                    "container": {"image": "x", "command": ["sh", "-c"], "args": ["echo $DSX_CLUSTER"]},
                },
            ],
        },
    }
    result = run(doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", cluster="sim:"))
    spec = printed(result, result.nodes[result.root_id])
    assert spec == f"state:{result.run_dir / 'fleet.json'}"
    assert (result.run_dir / "fleet.json").exists()

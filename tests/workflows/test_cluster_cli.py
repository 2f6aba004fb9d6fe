"""``dsx cluster``: nodes, cordon, uncordon and taint on a simulated fleet and a (emulated) real cluster."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

from steps.cluster import load_fleet, shareable
from tests.cli import dsx
from tests.emulator.apiserver import Emulator, write_kubeconfig


def _run(*args: str, env: dict[str, str] | None = None) -> str:
    """Run a command in this process (fast); returns its standard output, failing on a non-zero exit."""
    from typer.testing import CliRunner

    from workflows.cli.main import app

    result = CliRunner().invoke(app, list(args), env={"DSX_CLUSTER": "", **(env or {})})
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def _dsx(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``dsx`` command in a new process, as a user would (exit codes, standard error)."""
    full_env = {k: v for k, v in os.environ.items() if k != "DSX_CLUSTER"}
    full_env.update(DSX_RETRY_BASE_DELAY="0", DSX_RETRY_ATTEMPTS="2")
    return dsx(*args, env=full_env, timeout=60)


def test_nodes_lists_a_simulated_fleet_with_gpu_labels_as_json() -> None:
    result = _dsx("cluster", "nodes", "--cluster", "sim:nodes=8,gpu=h100", "-o", "json")
    assert result.returncode == 0, result.stderr
    nodes = json.loads(result.stdout)
    assert [n["name"] for n in nodes] == [f"node-0{i}" for i in range(8)]
    for node in nodes:
        assert node["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert node["labels"]["nvidia.com/gpu.count"] == "8"
        assert node["allocatable"]["nvidia.com/gpu"] == "8"


def test_nodes_table_and_selector() -> None:
    table = _run(
        "cluster",
        "nodes",
        "--cluster",
        "sim:nodes=4,racks=2,faults=node-03:not-ready",
        "-l",
        "topology.dsx.dev/rack=rack-01",
    )
    assert "node-02" in table and "NotReady" in table
    assert "node-00" not in table
    yaml_out = _run("cluster", "nodes", "--cluster", "sim:nodes=1", "-o", "yaml")
    assert "nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3" in yaml_out


def test_levers_change_a_shared_fleet(tmp_path: Path) -> None:
    spec = shareable("sim:nodes=4", tmp_path)
    cordoned = json.loads(
        _run(
            "cluster",
            "cordon",
            "node-02",
            "--reason",
            "bad NIC",
            "--by",
            "alice",
            "--cluster",
            spec,
            "-o",
            "json",
        )
    )
    assert cordoned["node"]["unschedulable"] is True
    assert cordoned["node"]["annotations"]["dsx.dev/cordoned-by"] == "alice"
    assert cordoned["summary"] == "node-02 cordoned by alice: bad NIC"
    tainted = json.loads(_run("cluster", "taint", "node-02", "--cluster", spec, "-o", "json"))
    assert tainted["taints"] == [{"effect": "NoSchedule", "key": "dsx.dev/unhealthy", "value": ""}]
    custom = json.loads(
        _run("cluster", "taint", "node-02", "maintenance=rma:NoExecute", "--cluster", spec, "-o", "json")
    )
    assert len(custom["taints"]) == 2
    _run("cluster", "taint", "node-02", "maintenance:NoExecute-", "--cluster", spec, "-o", "json")
    removed = json.loads(_run("cluster", "taint", "node-02", "--remove", "--cluster", spec, "-o", "json"))
    assert removed["taints"] == []
    uncordoned = json.loads(
        _run("cluster", "uncordon", "node-02", "--by", "alice", "--cluster", spec, "-o", "json")
    )
    assert uncordoned["node"]["unschedulable"] is False
    assert "dsx.dev/cordoned-by" not in uncordoned["node"]["annotations"]
    assert uncordoned["previous"]["owner"] == "alice"
    listed = json.loads(_run("cluster", "nodes", "-o", "json", env={"DSX_CLUSTER": spec}))
    assert [n["unschedulable"] for n in listed] == [False] * 4


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_someone_elses_cordon_is_refused_with_exit_2_naming_whose_it_is(tmp_path: Path) -> None:
    spec = shareable("sim:nodes=4,cordoned=node-03", tmp_path)
    table = _run("cluster", "cordon", "node-01", "--by", "alice", "--reason", "bad NIC", "--cluster", spec)
    assert table.splitlines()[0] == "node-01 cordoned by alice: bad NIC"
    line = _one_line_error(_dsx("cluster", "cordon", "node-01", "--by", "bob", "--cluster", spec))
    assert line.startswith(
        "error: cordon node/node-01: refused: node-01 carries alice's cordon (bad NIC, since "
    )
    line = _one_line_error(_dsx("cluster", "uncordon", "node-01", "--by", "bob", "--cluster", spec))
    assert line.startswith("error: uncordon node/node-01: refused: node-01 carries alice's cordon (bad NIC")
    assert line.endswith("(uncordon it as alice, or --force)")
    line = _one_line_error(_dsx("cluster", "uncordon", "node-03", "--by", "alice", "--cluster", spec))
    assert line.startswith(
        "error: uncordon node/node-03: refused: node-03 carries a cordon made outside dsx;"
    )

    table = _run("cluster", "uncordon", "node-01", "--by", "bob", "--force", "--cluster", spec)
    assert table.splitlines()[0].startswith("node-01 uncordoned: released alice's cordon (bad NIC, since ")
    assert table.splitlines()[0].endswith("(forced)")
    nodes = _run("cluster", "nodes", "--cluster", spec)
    assert "outside dsx" in nodes  # node-03's cordon column: not dsx's
    forced = json.loads(
        _run("cluster", "uncordon", "node-03", "--by", "bob", "--force", "--cluster", spec, "-o", "json")
    )
    assert forced["forced"] is True and forced["node"]["unschedulable"] is False
    assert forced["summary"] == "node-03 uncordoned: released a cordon made outside dsx (forced)"


def test_unknown_node_is_one_line_naming_node_and_call() -> None:
    line = _one_line_error(_dsx("cluster", "cordon", "node-42", "--cluster", "sim:nodes=4"))
    assert line == 'error: cordon node/node-42: not found (404): nodes "node-42" not found'


def test_rbac_refusal_is_one_line_naming_node_and_call() -> None:
    line = _one_line_error(
        _dsx("cluster", "cordon", "node-01", "--cluster", "sim:nodes=4,forbid=patch nodes")
    )
    assert line.startswith("error: cordon node/node-01: forbidden (403): ")
    assert 'cannot patch resource "nodes"' in line


def test_missing_kubeconfig_and_bad_input_exit_2(tmp_path: Path) -> None:
    line = _one_line_error(_dsx("cluster", "nodes", "--kubeconfig", str(tmp_path / "none")))
    assert "does not exist" in line
    line = _one_line_error(_dsx("cluster", "taint", "node-01", "x:Sometimes", "--cluster", "sim:nodes=2"))
    assert "the effect must be NoSchedule, PreferNoSchedule or NoExecute" in line
    line = _one_line_error(_dsx("cluster", "nodes", "--cluster", "sim:nodes=2,gpu=tpu"))
    assert "unknown GPU 'tpu'" in line


def test_unreachable_api_exits_2(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = write_kubeconfig(tmp_path / "config", f"http://127.0.0.1:{port}")
    line = _one_line_error(_dsx("cluster", "cordon", "node-01", "--kubeconfig", str(config)))
    assert line.startswith(
        f"error: cordon node/node-01: cannot reach the Kubernetes API at http://127.0.0.1:{port}"
    )


def test_commands_work_on_a_real_cluster_api(tmp_path: Path) -> None:
    with Emulator() as emulator:
        emulator.seed(load_fleet("sim:nodes=3,gpu=b200").manifests())
        config = write_kubeconfig(tmp_path / "config", emulator.url)
        cordoned = _run(
            "cluster", "cordon", "node-01", "--kubeconfig", str(config), "--context", "emulator", "-o", "json"
        )
        assert json.loads(cordoned)["node"]["unschedulable"] is True
        nodes = json.loads(_run("cluster", "nodes", "--kubeconfig", str(config), "-o", "json"))
        assert [n["unschedulable"] for n in nodes] == [False, True, False]
        emulator.forbid("patch", "nodes")
        line = _one_line_error(_dsx("cluster", "taint", "node-00", "--kubeconfig", str(config)))
        assert line.startswith("error: add_taint node/node-00: forbidden (403): ")

"""Snapshot and drift through the cluster port, on the simulated fleet."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from steps.cluster import connect
from steps.runtime.catalogue import default_catalogue_dir
from steps.runtime.snapshot import take_snapshot

H100 = ["--service", "eks", "--accelerator", "h100", "--os", "ubuntu", "--intent", "training"]


def _dsx(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workflows.cli", *args], capture_output=True, text=True, cwd=cwd, check=False
    )


def test_snapshot_reads_node_software_and_gpu_labels() -> None:
    snapshot = take_snapshot(connect("sim:nodes=4,gpu=h100"), cluster="sim")
    assert [n.name for n in snapshot.nodes] == ["node-00", "node-01", "node-02", "node-03"]
    node = snapshot.nodes[0]
    assert node.gpuProduct == "NVIDIA-H100-80GB-HBM3"
    assert node.gpuCount == 8
    assert node.driverVersion.count(".") == 2
    assert node.kubeletVersion.startswith("v1.")
    assert node.osImage.startswith("Ubuntu")
    assert node.kernelVersion and node.containerRuntimeVersion.startswith("containerd://")


def test_drift_against_the_fleet_names_nodes_and_exits_by_result(tmp_path: Path) -> None:
    fleet = "sim:nodes=8,gpu=h100"
    driver = take_snapshot(connect(fleet)).nodes[0].driverVersion

    drifted = _dsx("drift", "--cluster", fleet, *H100, "--scope", "nodes", "-o", "json", cwd=tmp_path)
    assert drifted.returncode == 1, drifted.stderr
    report = json.loads(drifted.stdout)
    assert report["driftedNodes"] == [f"node-{i:02d}" for i in range(8)]
    assert {(f["field"], f["actual"]) for f in report["findings"]} == {("driverVersion", driver)}

    # The same fleet against a catalogue pinning the driver it runs: no drift, exit 0.
    catalogue = tmp_path / "my-recipes"
    shutil.copytree(default_catalogue_dir(), catalogue, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    values = catalogue / "components" / "gpu-operator" / "values.yaml"
    data = yaml.safe_load(values.read_text())
    data["driver"]["version"] = driver
    values.write_text(yaml.safe_dump(data))
    clean = _dsx(
        "drift", "--cluster", fleet, *H100, "--recipes", str(catalogue), "--scope", "nodes", cwd=tmp_path
    )
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no drift" in clean.stdout

    snapshot_file = tmp_path / "snapshot.json"
    written = _dsx("snapshot", "--cluster", fleet, "-o", "json", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    snapshot_file.write_text(written.stdout)
    offline = _dsx(
        "drift", "--snapshot", str(snapshot_file), *H100, "--scope", "nodes", "-o", "json", cwd=tmp_path
    )
    assert offline.returncode == 1
    assert json.loads(offline.stdout)["findings"] == report["findings"]

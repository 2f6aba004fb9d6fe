"""``dsx sentinel probe`` on the machine the tests run on, in a new process as a user runs it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import dsx, dsx_here

FLEET = "sim:nodes=2,gpu=h100,workloads=false"


def _nvml_here() -> bool:
    """Whether NVML initialises on this machine (an NVIDIA GPU and its driver)."""
    code = "import pynvml\ntry:\n    pynvml.nvmlInit()\nexcept Exception:\n    raise SystemExit(1)\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, check=False).returncode == 0


def test_probe_says_whether_nvml_is_there_and_never_fails_with_a_traceback(tmp_path: Path) -> None:
    net = tmp_path / "sys" / "class" / "net" / "eth0"
    net.mkdir(parents=True)
    (net / "operstate").write_text("up\n")
    (net / "speed").write_text("100000\n")
    (net / "device").mkdir()  # a physical NIC (virtual ones have no device)
    done = dsx("sentinel", "probe", "--node", "node-01", "--sysfs", str(tmp_path / "sys"), "-o", "json")
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr and "unexpected" not in done.stderr
    events = json.loads(done.stdout)
    assert ("nic", "eth0", True) in [(e["check"], e["entity"], e["healthy"]) for e in events]
    unavailable = [e for e in events if e["check"] == "nvml" and not e["healthy"]]
    if _nvml_here():
        assert unavailable == []
    else:  # no GPU here: said on stderr and as the nvml reading, exit 1 (the node is not healthy)
        assert done.returncode == 1
        assert "NVML is not available on this machine" in done.stderr
        ((event,),) = [unavailable]
        assert event["code"] == "nvml-unavailable" and event["severity"] == "degraded"
        assert {e["check"] for e in events} == {"nvml", "nic"}


def test_a_probe_that_hangs_is_reported_and_the_others_still_run(tmp_path: Path) -> None:
    # The NIC's operstate is a pipe nobody writes: reading it blocks, as a wedged driver's sysfs does.
    net = tmp_path / "sys" / "class" / "net" / "eth0"
    (net / "device").mkdir(parents=True)
    (net / "speed").write_text("100000\n")
    os.mkfifo(net / "operstate")
    args = ("sentinel", "probe", "--node", "node-01", "--sysfs", str(tmp_path / "sys"), "-o", "json")
    done = dsx(*args, "--probe-timeout", "0.5")
    assert done.returncode == 1, done.stderr
    events = json.loads(done.stdout)
    (hung,) = [e for e in events if e["check"] == "probe"]
    assert (hung["entity"], hung["code"], hung["severity"]) == ("nic", "probe-timeout", "degraded")
    assert "probe nic did not return within 0.5 s" in hung["message"]
    assert "nvml" in {e["check"] for e in events}  # the GPU probe ran all the same


def test_probe_watches_only_the_fabric_nics_it_is_given(tmp_path: Path) -> None:
    for name, state in (("eth0", "up"), ("eth1", "down")):
        net = tmp_path / "sys" / "class" / "net" / name
        (net / "device").mkdir(parents=True)
        (net / "operstate").write_text(f"{state}\n")
        (net / "speed").write_text("100000\n")
    args = ("sentinel", "probe", "--node", "node-01", "--sysfs", str(tmp_path / "sys"), "-o", "json")
    done = dsx(*args, "--fabric-nics", "eth0")
    assert [e["entity"] for e in json.loads(done.stdout) if e["check"] == "nic"] == ["eth0"]
    bad = dsx(*args, "--fabric-nics", "eth0,,")
    assert bad.returncode == 2 and "--fabric-nics" in bad.stderr and "Traceback" not in bad.stderr


def test_agent_once_on_a_node_the_cluster_lacks_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = dsx_here(capsys, "sentinel", "agent", "--once", "--cluster", FLEET, "--node", "node-99")
    assert code == 2 and "--node node-99: no such node in the cluster" in err


def test_breaker_reset_needs_a_name_to_record(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = dsx_here(capsys, "sentinel", "breaker", "reset", "--by", " ", "--cluster", FLEET)
    assert code == 2 and "--by: name who resets the breaker" in err
    code, out, _ = dsx_here(
        capsys, "sentinel", "breaker", "reset", "--by", "ops", "--cluster", FLEET, "-o", "json"
    )
    assert code == 0 and json.loads(out)["reset_by"] == "ops"

"""The sentinel agent against the issue's targets: one poll over 8 fake GPUs under 5 ms of CPU; agent RSS
under 80 MB; from a fatal reading to a tainted node (simulated node, emulated API server) under 1 s at
p99; 100,000 kernel-log lines parsed under 0.5 s; and an XID storm (200,000 lines of an application's
Xid 31) read through the agent's kernel-log reader, its time and peak memory (the reader's budget: a
few 256 KiB chunks, never the file).

    python benchmarks/sentinel_agent.py [EVENTS]
"""

from __future__ import annotations

import datetime as dt
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for the tests' emulator

from steps.cluster import RetryPolicy, load_fleet
from steps.cluster import vocabulary as vocab
from steps.cluster.kube import KubeCluster, load_api_client
from steps.cluster.sim import MemoryStore, SimCluster
from steps.sentinel.agent import Agent
from steps.sentinel.catalogue import load_catalogue
from steps.sentinel.kernel_log import parse_lines
from steps.sentinel.node import build_sentinel
from steps.sentinel.probes import NodeProbes
from tests.emulator.apiserver import Emulator, write_kubeconfig
from tests.steps.sentinel.fake_nvml import FakeNvml, gpus

NODE = "node-01"


def poll_cpu_ms() -> float:
    port = SimCluster(MemoryStore(load_fleet("sim:nodes=2,gpu=h100,workloads=false")))
    sentinel = build_sentinel(
        port, NODE, load_catalogue(), source="nvml", nvml_module=FakeNvml(gpus(8)), sysfs="/x"
    )
    sentinel.run_once()
    runs = []
    for _ in range(200):
        start = time.process_time()
        for _, probe in sentinel.agent.probes:
            probe()
        runs.append((time.process_time() - start) * 1000)
    return statistics.median(runs)


def taint_latency(events: int) -> list[float]:
    spec = "sim:nodes=2,gpu=h100,workloads=false"
    hardware = SimCluster(MemoryStore(load_fleet(spec)))
    catalogue = load_catalogue()
    latencies = []
    with Emulator() as emulator, tempfile.TemporaryDirectory() as folder:
        emulator.seed(load_fleet(spec).manifests())
        api, _ = load_api_client(str(write_kubeconfig(Path(folder) / "kubeconfig", emulator.url)))
        port = KubeCluster(api, retry=RetryPolicy(attempts=2, base_delay=0.0, max_delay=0.0, jitter=0.0))
        probes = NodeProbes(NODE, catalogue, hardware, lambda: dt.datetime.now(dt.UTC), 8)
        for i in range(events):
            agent = Agent(NODE, port, probes.probes(), catalogue)
            with hardware.store.transaction() as fleet:  # a fresh fatal reading each time
                gpu = fleet.health[NODE].gpus[i % 8]
                fleet.health[NODE].gpus[i % 8] = gpu.model_copy(update={"xids": (79,)})
            start = time.perf_counter()
            agent.run_once()
            latencies.append(time.perf_counter() - start)
            assert port.get_node(NODE).has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")
            port.remove_taint(NODE)
            with hardware.store.transaction() as fleet:
                gpu = fleet.health[NODE].gpus[i % 8]
                fleet.health[NODE].gpus[i % 8] = gpu.model_copy(update={"xids": ()})
    return latencies


def _peak_rss_mb(args: list[str], env: dict[str, str], seconds: float) -> float:
    """Run ``dsx sentinel agent ARGS`` for ``seconds`` (many passes), then its peak resident set in MB
    (the kernel's VmHWM, read while it still runs)."""
    agent = subprocess.Popen(
        [sys.executable, "-m", "workflows.cli", "sentinel", "agent", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    time.sleep(seconds)
    status = Path(f"/proc/{agent.pid}/status")
    fields = dict(line.split(":", 1) for line in status.read_text().splitlines()) if status.exists() else {}
    agent.terminate()
    _, err = agent.communicate(timeout=30)
    if "VmHWM" in fields:
        peak = int(fields["VmHWM"].split()[0]) / 1024
    else:  # no /proc: the largest child this process has waited for
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert agent.returncode in (-15, 143), err[-2000:]  # it ran until stopped
    return peak


def agent_rss(seconds: float = 8.0) -> dict[str, float]:
    """Peak RSS of the agent process as a DaemonSet runs it: the kubernetes client against an emulated
    API server, the real pynvml (on a machine without a GPU it reports NVML unavailable, as a condition),
    metrics served; and on a simulated node with a fatal fault."""
    found: dict[str, float] = {}
    spec = "sim:nodes=2,gpu=h100,workloads=false"
    with Emulator() as emulator, tempfile.TemporaryDirectory() as folder:
        emulator.seed(load_fleet(spec).manifests())
        config = write_kubeconfig(Path(folder) / "kubeconfig", emulator.url)
        found["kube + NVML"] = _peak_rss_mb(
            ["--node", NODE, "--source", "nvml", "--interval", "0.2", "--metrics-port", "0"],
            {"KUBECONFIG": str(config), "DSX_CLUSTER": "kube", "DSX_SENTINEL_SYSFS": "/sys"},
            seconds,
        )
    found["simulated node"] = _peak_rss_mb(
        [
            "--cluster",
            f"{spec},faults={NODE}:xid=79@3",
            "--node",
            NODE,
            "--interval",
            "0.2",
            "--metrics-port",
            "0",
        ],
        {},
        seconds,
    )
    return found


def parse_seconds(lines: int = 100_000) -> float:
    sample = [
        "[ 1234.567890] NVRM: Xid (PCI:0000:1b:00): 79, pid=1901, name=python, GPU has fallen off the bus.",
        "Mar 03 12:00:05 gpu-7 kernel: eth0: link up",
        "Mar 03 12:00:02 gpu-7 kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=3, Graphics Exception",
        "[ 1235.000001] usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    ]
    text = [sample[i % len(sample)] for i in range(lines)]
    start = time.perf_counter()
    parse_lines(text)
    return time.perf_counter() - start


def storm(lines: int = 200_000) -> tuple[int, float, float]:
    """The storm's size in bytes, the seconds its reads took (each within the reader's budget) and the
    peak memory Python allocated meanwhile, in bytes."""
    import tracemalloc

    from steps.sentinel.kernel_log import Boot, KernelLog

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "kern.log"
        with log.open("w") as out:
            for i in range(lines):
                out.write(
                    f"[ {100 + i / 100:.2f}] NVRM: Xid (PCI:0000:1b:00): 31, pid={i}, MMU Fault @ 0x{i:08x}\n"
                )
        size = log.stat().st_size
        boot = Boot("0b5c1e7a-0000-4000-8000-000000000001", 0.0)
        reader = KernelLog(log, boot)
        start = time.perf_counter()
        while reader.snapshot()["offset"] < size:
            reader.read()
        seconds = time.perf_counter() - start
        reader = KernelLog(log, boot)  # again, its memory traced (which slows it)
        tracemalloc.start()
        while reader.snapshot()["offset"] < size:
            reader.read()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return size, seconds, float(peak)


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    cpu = poll_cpu_ms()
    print(f"one poll, 8 fake GPUs:       {cpu:7.2f} ms CPU (target < 5 ms)")
    parse = parse_seconds()
    print(f"100,000 kernel-log lines:    {parse:7.3f} s (target < 0.5 s)")
    size, seconds, peak = storm()
    print(
        f"XID storm, 200,000 lines:    {seconds:7.2f} s, {size / 1e6:.0f} MB read in {peak / 2**20:.0f} MiB"
    )
    latencies = sorted(taint_latency(events))
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    print(f"fatal reading -> taint, p99: {p99 * 1000:7.1f} ms over {events} events (target < 1000 ms)")
    for where, rss in agent_rss().items():
        print(f"agent peak RSS, {where + ':':15s}{rss:6.1f} MB (target < 80 MB)")


if __name__ == "__main__":
    main()

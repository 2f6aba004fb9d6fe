"""How long one cluster call takes on each adapter, against a goal of 50 ms per call.

The local runner gives every step a ``state:`` fleet (a JSON file shared by processes); each call
there re-reads the file only when another process changed it, and writes it back when the call
changed the fleet or logged itself. The kubernetes adapter is measured against the emulated API
server of the test suite (real HTTP on 127.0.0.1).

    python benchmarks/cluster_calls.py [NODES ...]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from steps.cluster import RetryPolicy, connect, load_fleet, shareable
from steps.cluster.port import ClusterPort
from tests.emulator.apiserver import Emulator, write_kubeconfig

GOAL_S = 0.05


def _median(call: Callable[[], object], runs: int = 15) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _report(label: str, port: ClusterPort, nodes: int) -> None:
    width = max(2, len(str(nodes - 1)))
    first = f"node-{0:0{width}d}"
    rows = {
        "get_node": lambda: port.get_node(first),
        "cordon+uncordon": lambda: (port.cordon(first, "bench"), port.uncordon(first)),
        "list_nodes": lambda: port.list_nodes(),
    }
    for name, call in rows.items():
        median = _median(call, runs=5 if name == "list_nodes" else 15)
        print(
            f"{label:<6} {nodes:>5} nodes  {name:<16} median {median * 1000:8.1f} ms   "
            f"goal {GOAL_S * 1000:.0f} ms   ratio {median / GOAL_S:.2f}"
        )


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [64, 512]
    fast = RetryPolicy(base_delay=0.0)
    with tempfile.TemporaryDirectory() as folder:
        for nodes in sizes:
            spec = f"sim:nodes={nodes},gpu=h100,racks=8"
            _report("sim", connect(spec, retry=fast), nodes)
            _report("state", connect(shareable(spec, Path(folder) / str(nodes)), retry=fast), nodes)
            with Emulator() as emulator:
                emulator.seed(load_fleet(spec).manifests())
                config = write_kubeconfig(Path(folder) / f"kubeconfig-{nodes}", emulator.url)
                _report("kube", connect("kube", kubeconfig=str(config), retry=fast), nodes)


if __name__ == "__main__":
    main()

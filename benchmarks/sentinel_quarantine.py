"""Quarantine decisions per second on one core, and cordons per second on the emulated API server.

Goals: 1,000 health events decided per second (the quarantine policy on a node as the Sensor hands it
over: severity, action, opt-out, the breaker's state); 20 nodes cordoned per second through the
kubernetes adapter against the emulated API server of the test suite (real HTTP on 127.0.0.1: each
cordon reads the node, then patches it with its owner's annotations). For scale: NVSentinel reported
2.5 nodes per second on a 1,500-node cluster.

    python benchmarks/sentinel_quarantine.py [EVENTS] [NODES]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from steps.cluster import RetryPolicy, connect, load_fleet
from steps.sentinel.events import HealthEvent
from steps.sentinel.policy import QuarantinePolicy, decide
from tests.emulator.apiserver import Emulator, write_kubeconfig

DECISIONS_GOAL = 1000.0
CORDONS_GOAL = 20.0
_SEVERITIES = ("fatal", "degraded", "info")
_ACTIONS = ("reset-gpu", "reboot", "replace", "none", "contact-support")


def decisions_per_second(events: int) -> float:
    """Decide ``events`` health events of varied severity and action, on one thread."""
    port = connect("sim:nodes=64,gpu=h100,workloads=false")
    nodes = port.list_nodes()
    readings = [
        HealthEvent(
            node=nodes[i % len(nodes)].name,
            check="xid",
            component="gpu",
            entity=f"GPU-{i % 8}",
            code="79",
            severity=_SEVERITIES[i % 3],  # type: ignore[arg-type]
            action=_ACTIONS[i % 5],  # type: ignore[arg-type]
            healthy=i % 7 == 0,
        )
        for i in range(events)
    ]
    policy = QuarantinePolicy()
    start = time.perf_counter()
    for i, reading in enumerate(readings):
        decide(reading, nodes[i % len(nodes)], policy, breaker_open=i % 11 == 0)
    return events / (time.perf_counter() - start)


def cordons_per_second(nodes: int) -> float:
    """Cordon every node of an emulated ``nodes``-node cluster one after the other, as dsx's owner."""
    with tempfile.TemporaryDirectory() as folder, Emulator() as emulator:
        emulator.seed(load_fleet(f"sim:nodes={nodes},gpu=h100,workloads=false").manifests())
        config = write_kubeconfig(Path(folder) / "kubeconfig", emulator.url)
        port = connect("kube", kubeconfig=str(config), retry=RetryPolicy(base_delay=0.0))
        names = [n.name for n in port.list_nodes()]
        start = time.perf_counter()
        for name in names:
            port.cordon(name, "benchmark: xid 79", by="sentinel")
        return len(names) / (time.perf_counter() - start)


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    nodes = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    rate = decisions_per_second(events)
    print(
        f"quarantine decisions  {events:>6} events  {rate:10.0f} /s   goal {DECISIONS_GOAL:.0f} /s   "
        f"ratio {rate / DECISIONS_GOAL:.1f}"
    )
    rate = cordons_per_second(nodes)
    print(
        f"cordons (emulated API) {nodes:>5} nodes  {rate:10.1f} /s   goal {CORDONS_GOAL:.0f} /s   "
        f"ratio {rate / CORDONS_GOAL:.1f}"
    )


if __name__ == "__main__":
    main()

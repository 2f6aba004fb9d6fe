"""Drift over a large fleet against its goal: 10,000 nodes compared with the recipe in under 2 s.

    python benchmarks/runtime_drift.py [NODES] [--sim]

The snapshot holds NODES GPU nodes (default 10,000) plus the recipe's components; one node in a
hundred runs an older driver and one in a thousand an old kernel, so the report has findings to build.
Measured: comparing and building the report (the part ``dsx drift`` adds to reading the cluster), and,
separately, reading the snapshot file back. With ``--sim``, also the whole ``dsx drift --cluster sim:``
path: building a simulated fleet of NODES nodes, reading it through the cluster port, comparing.
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

from steps.runtime.catalogue import load_catalogue
from steps.runtime.criteria import parse_criteria
from steps.runtime.drift import compare
from steps.runtime.resolve import RecipeResult, ResolvedComponent, resolve
from steps.runtime.snapshot import NodeSnapshot, ReleaseSnapshot, Snapshot, read_snapshot

GOAL_S = 2.0


def _snapshot(count: int, recipe_components: list[ResolvedComponent]) -> Snapshot:
    nodes = [
        NodeSnapshot(
            name=f"node-{i:05d}",
            osImage="Ubuntu 22.04.5 LTS",
            kernelVersion="5.4.0-200-generic" if i % 1000 == 7 else "5.15.0-130-generic",
            kubeletVersion="v1.31.4",
            containerRuntimeVersion="containerd://1.7.24",
            gpuProduct="NVIDIA-H100-80GB-HBM3",
            gpuCount=8,
            driverVersion="570.124.06" if i % 100 == 3 else "580.82.07",
            cudaVersion="13.0",
        )
        for i in range(count)
    ]
    releases = [
        ReleaseSnapshot(
            name=c.release, namespace=c.namespace, chart=c.chart, version=c.version, status="deployed"
        )
        for c in recipe_components
    ]
    return Snapshot(cluster=f"synthetic-{count}", nodes=nodes, releases=releases)


def main() -> None:
    numbers = [a for a in sys.argv[1:] if a.isdigit()]
    count = int(numbers[0]) if numbers else 10_000
    recipe = resolve_recipe()
    snapshot = _snapshot(count, recipe.components)
    times = []
    report = None
    for _ in range(5):
        start = time.perf_counter()
        report = compare(snapshot, recipe)
        times.append(time.perf_counter() - start)
    assert report is not None
    median, best = statistics.median(times), min(times)
    print(
        f"drift over {count} nodes: {len(report.findings)} findings on {len(report.driftedNodes)} nodes; "
        f"median {median:.3f} s (best {best:.3f})   goal {GOAL_S:.1f} s   ratio {median / GOAL_S:.2f}"
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "snapshot.json"
        path.write_text(snapshot.model_dump_json())
        start = time.perf_counter()
        read_snapshot(path)
        print(f"read a {count}-node snapshot file (no goal): {time.perf_counter() - start:.3f} s")
    if "--sim" in sys.argv:
        from steps.cluster import connect
        from steps.runtime.snapshot import take_snapshot

        start = time.perf_counter()
        port = connect(f"sim:nodes={count},gpu=h100,workloads=false")
        built = time.perf_counter()
        simulated = take_snapshot(port, cluster="sim")
        read = time.perf_counter()
        sim_report = compare(simulated, recipe)
        done = time.perf_counter()
        drifted = len(sim_report.driftedNodes)
        print(
            f"simulated fleet of {count} nodes (no goal): build {built - start:.2f} s, snapshot through the "
            f"port {read - built:.2f} s, drift {done - read:.3f} s ({drifted} nodes drifted)"
        )


def resolve_recipe() -> RecipeResult:
    query = parse_criteria({"service": "eks", "accelerator": "h100", "os": "ubuntu", "intent": "training"})
    return resolve(load_catalogue(), query)


if __name__ == "__main__":
    main()

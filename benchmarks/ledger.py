"""The remediation ledger at fleet scale: a year of a 10,000-node fleet at the Llama 3 fault rate (1.4
remediations a node a year, 8 entries each), written to and read back from the emulated API server of the
test suite. Prints the largest object beside the API server's 1 MiB (and what one ConfigMap for the whole
fleet, the ledger before, would have had to hold), the time of one ``ledger.record`` over HTTP (a
node's first entry of a month also sweeps the months past the retention), and the time ``dsx goodput``
takes to read the year back.

    python benchmarks/ledger.py [NODES]
"""

from __future__ import annotations

import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from steps.cluster.kube import KubeCluster, load_api_client
from steps.sentinel import ledger
from steps.sentinel.goodput.ledger_report import account, read_stories
from tests.emulator.apiserver import CONFIGMAP_MAX_BYTES, Emulator, write_kubeconfig
from tests.steps.sentinel.test_ledger import AUTH, YEAR, fleet_history

NAMESPACE = "dsx"
RECORD_GOAL_S = 0.1  # two port calls (read, write) at cluster_calls.py's 50 ms goal
READ_GOAL_S = 60.0  # well inside the dsx-goodput step's deadline


def _months(history: list[dict[str, object]]) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for entry in history:
        out.setdefault(str(entry["at"])[:7], []).append(entry)
    return out


def main() -> None:
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    fleet = fleet_history(nodes, 365)
    remediations = sum(1 for h in fleet.values() for e in h if e["state"] == "requested")
    with Emulator(controllers=False) as server, tempfile.TemporaryDirectory() as folder:
        api_client, _ = load_api_client(str(write_kubeconfig(Path(folder) / "kubeconfig", server.url)))
        port = KubeCluster(api_client, namespace=NAMESPACE)
        server.seed(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": f"gpu-node-{i:05d}"},
                "status": {"allocatable": {"nvidia.com/gpu": "8"}},
            }
            for i in range(nodes)
        )
        begin, made = time.perf_counter(), 0
        for node, history in fleet.items():
            for month, batch in sorted(_months(history).items()):
                manifest = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": ledger.object_name(node, month),
                        "labels": ledger.object_labels(node, month),
                    },
                    "data": {node: ledger.encode(batch)},
                }
                status, answer, _ = server.handle(
                    "POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps", {}, AUTH, manifest
                )
                assert status == 201, answer
                made += 1
        bulk_s = time.perf_counter() - begin

        # One remediation's entries through ledger.record, over HTTP, in January 2026 (new months).
        firsts: list[float] = []
        others: list[float] = []
        moment = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)
        for index, node in enumerate(sorted(fleet)[:20]):
            for step, state in enumerate(("requested", "quarantined", "draining", "awaiting-repair")):
                start = time.perf_counter()
                ledger.record(port, node, state, workflow=f"w{index}", attempt=1, check="xid", now=moment)
                (firsts if step == 0 else others).append(time.perf_counter() - start)
                moment += dt.timedelta(minutes=1)

        sizes = [sum(len(v) for v in (o.get("data") or {}).values()) for o in server.objects("configmaps")]
        begin = time.perf_counter()
        stories = read_stories(port)
        read_s = time.perf_counter() - begin
        begin = time.perf_counter()
        result = account(stories, YEAR.timestamp(), (YEAR + dt.timedelta(days=365)).timestamp())
        account_s = time.perf_counter() - begin

    mib, goal_ms = CONFIGMAP_MAX_BYTES, RECORD_GOAL_S * 1000
    first, other = statistics.median(firsts), statistics.median(others)
    print(f"{nodes:,} nodes, one year: {remediations:,} remediations in {made:,} objects ({bulk_s:.1f} s)")
    print(f"largest object:          {max(sizes):9,} B  {max(sizes) / mib:8.4f} of 1 MiB")
    print(f"one ConfigMap for all:   {sum(sizes):9,} B  {sum(sizes) / mib:8.1f} x 1 MiB (the ledger before)")
    print(f"record, a month's first: {first * 1000:9.1f} ms {first / RECORD_GOAL_S:8.2f} of {goal_ms:.0f} ms")
    print(f"record, the next ones:   {other * 1000:9.1f} ms {other / RECORD_GOAL_S:8.2f} of {goal_ms:.0f} ms")
    print(f"read the year back:      {read_s:9.2f} s  {read_s / READ_GOAL_S:8.2f} of {READ_GOAL_S:.0f} s")
    print(f"account for it:          {account_s:9.2f} s  ({len(result.remediations):,} remediations)")


if __name__ == "__main__":
    main()

"""The remediation ledger lasts: one ConfigMap per node and month, bounded, kept within its retention, the
old single ConfigMap read and migrated, and a year of a 10,000-node fleet written and read back through
the emulated API server without meeting its 1 MiB limit."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import connect
from steps.cluster import vocabulary as vocab
from steps.cluster.kube import KubeCluster, load_api_client
from steps.cluster.port import ClusterPort
from steps.errors import InputError
from steps.sentinel import ledger
from steps.sentinel.goodput.ledger_report import account, read_stories
from tests.cli import dsx_here
from tests.emulator.apiserver import CONFIGMAP_MAX_BYTES, Emulator, write_kubeconfig

NAMESPACE = "dsx"
AUTH = {"authorization": "Bearer emulator-token"}
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

#: The Llama 3 405B run (arXiv:2407.21783): 419 unexpected interruptions in 54 days on 16,384 GPUs, 2,048
#: nodes of 8. Per node and year: 419 / (54 x 2,048) x 365 = 1.38.
FAILURES_PER_NODE_YEAR = 419 / (54 * 2048) * 365
YEAR = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def _at(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's draw: the count of events of a Poisson process of ``mean``."""
    limit, count, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count


def _remediation(rng: random.Random, node: str, start: dt.datetime, attempt: int) -> list[dict[str, Any]]:
    """The entries one remediation writes, spelled as dsx-remediate spells them (about 2 KB): requested,
    quarantined, draining twice (before and after the drain), awaiting-repair, recertifying, in-service
    and ended, over a drain, a repair of hours and a recertification."""
    workflow = f"dsx-remediate-{rng.getrandbits(40):010x}"
    boot, new_boot = (f"{rng.getrandbits(128):032x}" for _ in range(2))
    pods = "; ".join(
        f"{ns}/{name}-{rng.getrandbits(24):06x}-{k} evicted"
        for k, (ns, name) in enumerate(
            [("training", "llama-405b-worker")] * 5 + [("serving", "inference")] * 2
        )
    )
    steps = [
        (0, "requested", f"{node} admitted (4 of 1000 in the window); observed {_at(start)}"),
        (
            20,
            "quarantined",
            f"{node} cordoned by sentinel (dsx-remediate {workflow}: xid); it was schedulable",
        ),
        (2, "draining", ""),
        (
            rng.uniform(60, 1800),
            "draining",
            f"{node}: drained (7 evicted, 3 skipped-daemonset): {pods}; "
            "gpu-operator/nvidia-device-plugin-daemonset-x2 skipped-daemonset",
        ),
        (1, "awaiting-repair", f"repair requested (boot id {boot})"),
        (
            rng.uniform(1800, 8 * 3600),
            "recertifying",
            f"repaired: boot {new_boot} (was {boot}), Ready, condition DsxGpuXid False since the new boot",
        ),
        (
            rng.uniform(600, 3600),
            ledger.IN_SERVICE,
            "certified beside node-0042 (pair test passed); all-reduce 8 GPUs: 389.2 GB/s bus bandwidth "
            "(threshold 360.0); training smoke run 212 steps, loss 4.12 (threshold 6.0)",
        ),
        (4, "ended", "workflow Succeeded; node in service"),
    ]
    out, at = [], start
    for after, state, detail in steps:
        at += dt.timedelta(seconds=after)
        entry = {"at": _at(at), "state": state, "workflow": workflow, "attempt": attempt, "check": "xid"}
        out.append({**entry, "detail": detail})
    return out


def fleet_history(nodes: int, days: float, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Every node's ledger over ``days`` from 2025-01-01 at the Llama 3 rate: the nodes that failed."""
    rng = random.Random(seed)
    fleet: dict[str, list[dict[str, Any]]] = {}
    seconds = days * 86400
    for index in range(nodes):
        node = f"gpu-node-{index:05d}"
        starts = sorted(
            rng.uniform(0, seconds - 12 * 3600)
            for _ in range(_poisson(rng, FAILURES_PER_NODE_YEAR * days / 365))
        )
        history: list[dict[str, Any]] = []
        for offset in starts:
            start = YEAR + dt.timedelta(seconds=offset)
            if history and _at(start) <= history[-1]["at"]:
                continue  # still in its last remediation: the fault is that one's
            history += _remediation(rng, node, start, 1)
        if history:
            fleet[node] = history
    return fleet


def record_history(port: ClusterPort, node: str, history: list[dict[str, Any]]) -> None:
    """Write entries as dsx-remediate does, one ``ledger.record`` each, at their own times."""
    for e in history:
        moment = dt.datetime.fromisoformat(e["at"])
        ledger.record(
            port,
            node,
            e["state"],
            workflow=e["workflow"],
            attempt=e["attempt"],
            check=e["check"],
            detail=e["detail"],
            now=moment,
        )


def _months(history: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for e in history:
        out.setdefault(e["at"][:7], []).append(e)
    return out


def _values_bytes(obj: dict[str, Any]) -> int:
    """What ValidateConfigMap counts: the values' bytes."""
    return sum(len(str(v).encode()) for v in (obj.get("data") or {}).values())


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[tuple[Emulator, KubeCluster]]:
    """An emulated API server without its controllers (nothing here needs them) and a port on it through
    the kubernetes client."""
    with Emulator(controllers=False) as server:
        config = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        api_client, _ = load_api_client(str(config))
        yield server, KubeCluster(api_client, namespace=NAMESPACE)


# ----------------------------------------------------------------------------- the fleet's year


@pytest.mark.story
def test_three_weeks_of_a_big_fleet_overflow_one_configmap_but_not_the_ledger() -> None:
    """Three weeks of a 10,000-node fleet at the Llama 3 rate, through ``ledger.record`` alone, on the
    simulated fleet (which refuses a ConfigMap over 1 MiB as the API server does). One ConfigMap for the
    whole fleet (the ledger before) is full within them: about 520 remediations fit in 1 MiB."""
    fleet = fleet_history(10_000, 21)
    port = connect("sim:nodes=1,gpu=h100,workloads=false")
    for node, history in fleet.items():
        record_history(port, node, history)
    remediations = sum(1 for h in fleet.values() for e in h if e["state"] == "requested")
    stored = port.list_objects("v1", "ConfigMap", port.namespace, f"{vocab.LABEL_LEDGER}=true")
    held = sum(_values_bytes(o) for o in stored)
    assert remediations > 700 and held / remediations > 1500  # each as big as dsx-remediate writes it
    assert held > 1.1 * CONFIGMAP_MAX_BYTES  # what the one ConfigMap would have had to hold
    assert max(_values_bytes(o) for o in stored) < 10_000  # a node's month: a few KB
    assert port.get_state(ledger.LEGACY_CONFIGMAP) == {}
    assert ledger.read_all(port) == fleet
    sample = sorted(fleet)[:: len(fleet) // 20]
    assert all([e.model_dump() for e in ledger.entries(port, n)] == fleet[n] for n in sample)


@pytest.mark.story
def test_a_year_of_a_10000_node_fleet_fits_and_reads_back(emulator: tuple[Emulator, KubeCluster]) -> None:
    """A year of a 10,000-node fleet at the Llama 3 rate (1.4 remediations a node, 8 entries each), every
    object created through the emulated API server's request handling, which refuses a ConfigMap over
    1 MiB; the last remediation of some nodes written through ``ledger.record`` over HTTP, as the workflow
    writes it. The goodput report (``dsx goodput``: :func:`report` is ``account(read_stories(port))``)
    then reads every object back through the kubernetes client."""
    server, port = emulator
    fleet = fleet_history(10_000, 365)
    server.seed(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": f"gpu-node-{i:05d}", "labels": {}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"}},
        }
        for i in range(10_000)
    )
    # The real path: nodes whose last remediation was in December get it through ledger.record, over HTTP.
    december = [n for n, h in sorted(fleet.items()) if h[-8]["at"].startswith("2025-12")][:10]
    assert len(december) == 10
    for node, history in fleet.items():
        bulk = history[:-8] if node in december else history
        for month, batch in sorted(_months(bulk).items()):
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
    for node in december:
        record_history(port, node, fleet[node][-8:])

    stored = server.objects("configmaps", NAMESPACE)
    sizes = [_values_bytes(o) for o in stored]
    assert len(stored) == sum(len(_months(h)) for h in fleet.values())
    assert max(sizes) < 10_000 < ledger.MAX_BYTES < CONFIGMAP_MAX_BYTES
    assert sum(sizes) > 20 * CONFIGMAP_MAX_BYTES  # one ConfigMap would have met its limit 20 times over
    assert {o["metadata"]["labels"][vocab.LABEL_LEDGER] for o in stored} == {"true"}
    assert [e.model_dump() for e in ledger.entries(port, december[0])] == fleet[december[0]]

    stories = read_stories(port)
    assert {s.name: s.ledger for s in stories if s.ledger} == fleet
    result = account(stories, YEAR.timestamp(), (YEAR + dt.timedelta(days=365)).timestamp(), port.endpoint)
    back = [e for h in fleet.values() for e in h if e["state"] == ledger.IN_SERVICE]
    quarantined = [e for h in fleet.values() for e in h if e["state"] == "quarantined"]
    out_s = sum(
        (dt.datetime.fromisoformat(b["at"]) - dt.datetime.fromisoformat(q["at"])).total_seconds()
        for q, b in zip(quarantined, back, strict=True)
    )
    assert result.fleet.nodes == 10_000
    assert len(result.remediations) == len(quarantined) > 13_000
    assert result.fleet.repairs == len(back)
    assert result.fleet.lost_gpu_hours == pytest.approx(out_s * 8 / 3600, rel=1e-6)
    assert {r.outcome for r in result.remediations} == {ledger.IN_SERVICE}


# ----------------------------------------------------------------------------- one object per node and month


def test_names_and_labels_keep_to_what_the_api_server_accepts() -> None:
    assert ledger.object_name("node-01", "2025-06") == "dsx-ledger-node-01-2025-06"
    assert ledger.object_labels("node-01", "2025-06") == {
        "app.kubernetes.io/part-of": "dsx",
        "dsx.dev/ledger": "true",
        "dsx.dev/node": "node-01",
        "dsx.dev/ledger-month": "2025-06",
    }
    long_a = "gpu-" + "a" * 240 + ".example.internal"
    long_b = "gpu-" + "a" * 240 + ".example.external"
    names = {ledger.object_name(n, "2025-06") for n in (long_a, long_b)}
    labels = {ledger.node_label(n) for n in (long_a, long_b)}
    assert len(names) == 2 and len(labels) == 2  # the hash tells them apart
    for name in names:
        assert len(name) <= 253 and DNS_SUBDOMAIN.match(name) and name.endswith("-2025-06")
        assert name.startswith("dsx-ledger-gpu-aaaa")
    for label in labels:
        assert len(label) <= 63 and LABEL_VALUE.match(label) and label.startswith("gpu-aaaa")
    # A name that is no DNS subdomain (the simulated fleet is lenient) still makes a valid object name.
    odd = ledger.object_name("Node_7.", "2025-06")
    assert DNS_SUBDOMAIN.match(odd) and odd != ledger.object_name("node-7", "2025-06")
    assert ledger.node_label("ip-10-0-0-1.ec2.internal") == "ip-10-0-0-1.ec2.internal"


def test_each_month_of_a_node_is_its_own_object_and_its_history_runs_across_them(
    emulator: tuple[Emulator, KubeCluster],
) -> None:
    server, port = emulator
    for day, state in (
        (dt.datetime(2025, 1, 31, 23, 59, 30, tzinfo=dt.UTC), "requested"),
        (dt.datetime(2025, 2, 1, 0, 0, 10, tzinfo=dt.UTC), "quarantined"),
        (dt.datetime(2025, 3, 3, tzinfo=dt.UTC), ledger.IN_SERVICE),
    ):
        ledger.record(port, "node-01", state, workflow="w1", attempt=1, check="xid", now=day)
    ledger.record(
        port, "node-02", "refused", workflow="w2", check="xid", now=dt.datetime(2025, 2, 2, tzinfo=dt.UTC)
    )
    names = [o["metadata"]["name"] for o in server.objects("configmaps", NAMESPACE)]
    assert names == [
        "dsx-ledger-node-01-2025-01",
        "dsx-ledger-node-01-2025-02",
        "dsx-ledger-node-01-2025-03",
        "dsx-ledger-node-02-2025-02",
    ]
    assert [e.state for e in ledger.entries(port, "node-01")] == [
        "requested",
        "quarantined",
        ledger.IN_SERVICE,
    ]
    assert [e.state for e in ledger.entries(port, "node-02")] == ["refused"]
    assert set(ledger.read_all(port)) == {"node-01", "node-02"}
    # A retried step writes the same change again: kept once.
    ledger.record(
        port,
        "node-02",
        "refused",
        workflow="w2",
        check="xid",
        now=dt.datetime(2025, 2, 2, 0, 1, tzinfo=dt.UTC),
    )
    assert len(ledger.entries(port, "node-02")) == 1


def test_a_node_written_over_and_over_never_fills_its_object() -> None:
    """A node refused again and again in one month: its object keeps its newest entries within
    MAX_BYTES, half the API server's limit; a detail past DETAIL_MAX is cut."""
    port = connect("sim:nodes=1,gpu=h100,workloads=false")
    start = dt.datetime(2025, 5, 1, tzinfo=dt.UTC)
    count = ledger.MAX_BYTES // ledger.DETAIL_MAX + 40
    for index in range(count):
        detail = f"refusal {index}: " + "why " * 3000  # cut to DETAIL_MAX
        ledger.record(
            port,
            "node-01",
            "refused",
            workflow=f"w{index}",
            check="xid",
            detail=detail,
            now=start + dt.timedelta(minutes=index),
        )
    stored = port.get_state(ledger.object_name("node-01", "2025-05"))
    assert len(stored["node-01"]) <= ledger.MAX_BYTES
    kept = ledger.entries(port, "node-01")
    assert kept[-1].workflow == f"w{count - 1}" and len(kept) < count  # the newest stay, the oldest went
    assert {len(e.detail) for e in kept} == {ledger.DETAIL_MAX}


# ----------------------------------------------------------------------------- retention


def test_months_past_the_retention_are_deleted_when_the_ledger_is_written(
    emulator: tuple[Emulator, KubeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, port = emulator
    monkeypatch.setenv(vocab.ENV_LEDGER_RETENTION_DAYS, "60")
    january = dt.datetime(2025, 1, 10, tzinfo=dt.UTC)
    ledger.record(port, "node-01", "refused", workflow="w1", check="xid", now=january)
    ledger.record(port, "gone-node", "refused", workflow="w2", check="xid", now=january)  # never again
    ledger.record(
        port, "node-01", "refused", workflow="w3", check="xid", now=dt.datetime(2025, 2, 20, tzinfo=dt.UTC)
    )
    assert len(server.objects("configmaps", NAMESPACE)) == 3  # January is within 60 days of February 20
    # April 15: 60 days back is February 14, so January (ended February 1) goes, for both nodes;
    # February, which ends after the horizon, stays.
    ledger.record(
        port, "node-02", "refused", workflow="w4", check="xid", now=dt.datetime(2025, 4, 15, tzinfo=dt.UTC)
    )
    assert [o["metadata"]["name"] for o in server.objects("configmaps", NAMESPACE)] == [
        "dsx-ledger-node-01-2025-02",
        "dsx-ledger-node-02-2025-04",
    ]
    assert [e.workflow for e in ledger.entries(port, "node-01")] == ["w3"]
    assert ledger.entries(port, "gone-node") == []
    # The sweep asked only for the months outside the retention.
    (swept,) = [
        r
        for r in server.requests
        if "notin" in r.query.get("labelSelector", "") and "2025-04" in r.query["labelSelector"]
    ]
    assert swept.method == "GET"


def test_entries_past_the_retention_leave_the_object_they_are_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vocab.ENV_LEDGER_RETENTION_DAYS, "7")
    port = connect("sim:nodes=1,gpu=h100,workloads=false")
    ledger.record(
        port, "node-01", "refused", workflow="w1", check="xid", now=dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
    )
    ledger.record(
        port, "node-01", "refused", workflow="w2", check="xid", now=dt.datetime(2025, 3, 5, tzinfo=dt.UTC)
    )
    ledger.record(
        port, "node-01", "refused", workflow="w3", check="xid", now=dt.datetime(2025, 3, 20, tzinfo=dt.UTC)
    )
    assert [e.workflow for e in ledger.entries(port, "node-01")] == ["w3"]


@pytest.mark.parametrize("value", ["0", "-3", "abc", "1.5", "3661"])
def test_a_retention_that_is_no_whole_number_of_days_is_an_input_error(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(vocab.ENV_LEDGER_RETENTION_DAYS, value)
    with pytest.raises(InputError, match=r"DSX_LEDGER_RETENTION_DAYS=.*remediate\.ledger\.retentionDays"):
        ledger.record(connect("sim:nodes=1,workloads=false"), "node-01", "refused")
    assert ledger.retention_days({}) == ledger.RETENTION_DAYS
    assert ledger.retention_days({vocab.ENV_LEDGER_RETENTION_DAYS: " 30 "}) == 30


# ----------------------------------------------------------------------------- an install upgraded


def _legacy(server: Emulator, data: dict[str, list[dict[str, Any]]]) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": ledger.LEGACY_CONFIGMAP},
        "data": {node: ledger.encode(entries) for node, entries in data.items()},
    }
    status, answer, _ = server.handle(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps", {}, AUTH, manifest
    )
    assert status == 201, answer


def _entry(at: str, state: str, workflow: str) -> dict[str, Any]:
    return {"at": at, "state": state, "workflow": workflow, "attempt": 1, "check": "xid", "detail": ""}


def test_the_old_single_configmap_is_read_and_migrated_on_write(
    emulator: tuple[Emulator, KubeCluster],
) -> None:
    server, port = emulator
    old_a = [
        _entry("2025-03-01T10:00:00Z", "requested", "w1"),
        _entry("2025-04-02T10:00:00Z", ledger.IN_SERVICE, "w1"),
    ]
    ancient = [_entry("2023-01-05T10:00:00Z", "requested", "w0")]  # past the 400 days kept
    old_b = [_entry("2025-04-20T08:00:00Z", "refused", "w2")]
    ancient_b = [_entry("2023-02-01T00:00:00Z", "refused", "w00")]
    _legacy(server, {"node-a": ancient + old_a, "node-b": ancient_b + old_b})
    # Read as it is, before anything was written.
    assert [e.workflow for e in ledger.entries(port, "node-a")] == ["w0", "w1", "w1"]
    assert ledger.read_all(port) == {"node-a": ancient + old_a, "node-b": ancient_b + old_b}

    now = dt.datetime(2025, 5, 1, tzinfo=dt.UTC)
    ledger.record(port, "node-a", "requested", workflow="w3", attempt=1, check="xid", now=now)
    names = sorted(o["metadata"]["name"] for o in server.objects("configmaps", NAMESPACE))
    assert names == [
        "dsx-ledger-node-a-2025-03",
        "dsx-ledger-node-a-2025-04",
        "dsx-ledger-node-a-2025-05",
        ledger.LEGACY_CONFIGMAP,
    ]
    left = server.get("configmaps", ledger.LEGACY_CONFIGMAP, NAMESPACE)
    # node-a's key went; what is past the retention went from every node's.
    assert left is not None and left["data"] == {"node-b": ledger.encode(old_b)}
    assert [e.workflow for e in ledger.entries(port, "node-a")] == [
        "w1",
        "w1",
        "w3",
    ]  # w0: past the retention
    assert [e.workflow for e in ledger.entries(port, "node-b")] == ["w2"]  # still read from the old one
    # node-b's first write of a month moves its entries too; the emptied old ConfigMap goes.
    ledger.record(port, "node-b", "requested", workflow="w4", attempt=1, check="xid", now=now)
    assert server.get("configmaps", ledger.LEGACY_CONFIGMAP, NAMESPACE) is None
    assert [e.workflow for e in ledger.entries(port, "node-b")] == ["w2", "w4"]
    assert {n: [e["workflow"] for e in h] for n, h in ledger.read_all(port).items()} == {
        "node-a": ["w1", "w1", "w3"],
        "node-b": ["w2", "w4"],
    }


def test_a_migration_cut_short_reads_each_entry_once(emulator: tuple[Emulator, KubeCluster]) -> None:
    """Stopped after the entries reached their month's object but before the old key went: both hold
    them, and the node's history has each once."""
    server, port = emulator
    moved = [
        _entry("2025-04-02T10:00:00Z", "requested", "w1"),
        _entry("2025-04-03T10:00:00Z", ledger.IN_SERVICE, "w1"),
    ]
    _legacy(server, {"node-a": moved})
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ledger.object_name("node-a", "2025-04"),
            "labels": ledger.object_labels("node-a", "2025-04"),
        },
        "data": {"node-a": ledger.encode(moved)},
    }
    assert server.handle("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps", {}, AUTH, manifest)[0] == 201
    assert [e.state for e in ledger.entries(port, "node-a")] == ["requested", ledger.IN_SERVICE]
    assert ledger.read_all(port) == {"node-a": moved}


def test_dsx_goodput_reads_the_ledger_objects_and_the_old_configmap(
    emulator: tuple[Emulator, KubeCluster],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An install upgraded mid-way: node-a's remediation is in its monthly objects, node-b's still in the
    old single ConfigMap; ``dsx goodput`` counts both."""
    server, port = emulator
    server.seed(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": n},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        }
        for n in ("node-a", "node-b")
    )
    rng = random.Random(7)
    start = dt.datetime(2025, 5, 3, 8, 0, tzinfo=dt.UTC)
    _legacy(server, {"node-b": _remediation(rng, "node-b", start, 1)})
    record_history(port, "node-a", _remediation(rng, "node-a", start + dt.timedelta(days=2), 1))
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "goodput-kubeconfig", server.url)))
    monkeypatch.setenv(vocab.ENV_NAMESPACE, NAMESPACE)
    args = ("goodput", "--cluster", "kube", "--since", "30d", "--until", "2025-06-01T00:00:00Z", "-o", "json")
    code, out, err = dsx_here(capsys, *args)
    assert code == 0, err
    result = json.loads(out)
    assert sorted(r["node"] for r in result["remediations"]) == ["node-a", "node-b"]
    assert result["fleet"]["repairs"] == 2

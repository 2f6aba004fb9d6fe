"""Property: however certifications, cordons and kubectl interleave on one fleet, a node's certification
label never disagrees with the report of the last run that finished with it.

Two certifiers race for the same nodes (each run holds its nodes with Leases, so one of them is refused
while the other runs), cordon owners and kubectl change the same Node objects meanwhile, and the API
answers some writes with conflicts. The checks' outcomes are drawn at random and stored as the check
steps store them; the plan, the report and the labels are dsx's own code. Every run ends as Argo ends
one: the report step (which may fail), then the exit handler.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import random
import threading
from typing import Any

import pytest

from steps.cluster import ConflictError, CordonRefusedError, RetryPolicy, connect
from steps.cluster import vocabulary as vocab
from steps.errors import DsxError, InputError
from steps.readiness import certify
from steps.readiness.check import CheckOutcome
from steps.readiness.checks import ALLREDUCE_SWEEP, SWEEP_TEST
from steps.readiness.models import CollectiveRun, Subject, Verdict
from steps.readiness.outcomes import OutcomeStore

SPEC = "sim:nodes=3,gpu=h100,workloads=false,api-conflicts=12"
NODES = ("node-00", "node-01", "node-02")
RECIPE = {"digest": "sha256:prop", "thresholds": {"nccl": {"allReduce": []}}}
PENDING = vocab.Certification.pending.value
RETRY = RetryPolicy(base_delay=0.0, conflict_attempts=60, conflict_delay=0.001)


def _outcome(name: str, rng: random.Random) -> CheckOutcome[CollectiveRun]:
    subject = Subject(kind="node", name=name, members=[name])
    status = "pass" if rng.random() < 0.6 else "fail"
    verdict = Verdict(
        subject=subject, test="allreduce-busbw", status=status, message=f"{name}: drawn {status}"
    )
    return ALLREDUCE_SWEEP.outcome(
        test=SWEEP_TEST,
        subject=subject,
        status=status,
        verdicts=[verdict],
        evidence=[],
        out_dir="",
        elapsed_s=0,
    )


def _reported(workflow: str) -> dict[str, str]:
    """The node statuses of the report a run kept in its ConfigMap (none if it kept no report)."""
    kept = connect().get_object("v1", "ConfigMap", f"dsx-report-{workflow}", connect().namespace)
    if kept is None:
        return {}
    report = json.loads(gzip.decompress(base64.b64decode(kept["binaryData"]["report.json.gz"])))
    return {node["name"]: node["status"] for node in report["nodes"]}


def _certifier(seed: int, runs: int, log: list[tuple[str, Any]], lock: threading.Lock) -> None:
    rng = random.Random(seed)
    for i in range(runs):
        port = connect()
        name = f"dsx-certify-{seed}-{i}"
        manifest = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": name, "namespace": port.namespace},
        }
        uid = port.create_object(manifest)["metadata"]["uid"]
        try:
            plan = certify.plan(workflow_name=name, workflow_uid=uid)
        except InputError:
            continue  # the other certifier holds the nodes: refused, nothing written
        except DsxError:
            # The plan step failed on the API: nodes it marked are pending, the others keep their label.
            with lock:
                log.append(("plan-broken", {n: {PENDING} for n in NODES}))
            certify.release(name, uid)
            continue
        with lock:
            log.append(("planned", {n: {PENDING} for n in plan.nodes}))
        try:
            certify.keep_recipe(plan.run, RECIPE)
            store = OutcomeStore(connect(), plan.run)
            for node in plan.nodes:
                if rng.random() < 0.9:  # now and then a check dies without storing its outcome
                    store.put(_outcome(node, rng))
            if rng.random() < 0.7:  # the API fails a few requests about one node while the report runs
                port.inject(rng.choice(NODES), f"api-errors={rng.randint(1, 4)}")
            certify.report(plan.run)
            with lock:  # before the exit handler lets the next run take the nodes
                log.append(("finished", {n: {s} for n, s in _reported(name).items()}))
        except DsxError:
            # The report step failed: the nodes it labelled carry this run's verdict, the rest pending.
            with lock:
                log.append(("broken", {n: {s, PENDING} for n, s in _reported(name).items()}))
        finally:
            with contextlib.suppress(DsxError):  # Argo retries an exit handler; a later run would wait
                certify.release(name, uid)


def _cordoner(seed: int, ops: int) -> None:
    rng = random.Random(seed)
    port = connect(retry=RETRY)
    for _ in range(ops):
        node = rng.choice(["node-00", "node-01", "node-02"])
        try:
            if rng.random() < 0.5:
                port.cordon(node, "maintenance", by=rng.choice(["alice", "bob"]))
            else:
                port.uncordon(node, by=rng.choice(["alice", "bob"]))
        except (CordonRefusedError, ConflictError):
            pass
        if rng.random() < 0.3:  # someone else's edit of the same object
            port.set_labels(node, {"team": rng.choice(["a", "b"])})


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_labels_always_agree_with_the_last_finished_report(seed: int, sim_fleet, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    sim_fleet(SPEC)
    monkeypatch.setenv("DSX_RETRY_BASE_DELAY", "0")
    monkeypatch.setenv("DSX_RETRY_ATTEMPTS", "2")
    log: list[tuple[str, Any]] = []
    lock = threading.Lock()
    threads = [threading.Thread(target=_certifier, args=(seed * 10 + i, 8, log, lock)) for i in range(2)] + [
        threading.Thread(target=_cordoner, args=(seed * 10 + 5, 30))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    kinds = {kind for kind, _ in log}
    assert kinds & {"finished", "broken"}, f"no run reached its report: the property says nothing ({log})"
    allowed: dict[str, set[str]] = {}
    for kind, what in log:  # in the order the runs held the nodes (the Leases serialise them)
        if kind == "plan-broken":  # some marked pending, some not reached
            for node, states in what.items():
                allowed[node] = allowed.get(node, {None}) | states
        else:
            allowed.update(what)
    labels = {n.name: n.labels.get(vocab.LABEL_CERTIFICATION) for n in connect().list_nodes()}
    for node, label in labels.items():
        assert label in allowed[node], (node, label, allowed[node], log)

"""The faults ``dsx-remediate`` must survive losing nothing, on the emulated API server: the compiled
WorkflowTemplate run by the local runner with ``--cluster kube``, every step talking through the kubernetes
client over HTTP to :mod:`tests.emulator.apiserver` (nodes, the kubelet double, the Job controller, the
scheduler, PodDisruptionBudgets with the API server's disruption semantics).

The cluster is the simulated fleet's objects seeded into the emulator: DaemonSet, ReplicaSet and Job
pods whose controllers live outside it (the emulator replaces a pod that goes), a bare pod, and the
``serving`` budgets (``inference`` minAvailable 1 over 3 replicas; ``gateway`` maxUnavailable 0 with
``blocking-pdb=true``). node-01 carries the sentinel's ``DsxGpuXid`` condition. The repair system is a
thread of the test (:class:`Repairer`): once remediation asks for a repair it reboots the node (a new
``status.nodeInfo.bootID``) and clears the condition, as the provider's repair service would.

Recertification: ``dsx-certify`` is reached through ``templateRef`` with ``launcher=local``, so its
measurements run as gloo ranks of this machine while every cluster action of certification (labels,
Leases, outcome ConfigMaps, node Events) goes through the emulated API server; ``iters=2`` keeps it fast.
Where recertification must fail it runs with ``launcher=job``: rank Jobs the kubelet double runs, whose
pods on the repaired node exit 1.

After every run the promises of :mod:`tests.workflows.test_remediate_faults` are checked against the
emulator's objects and request log (:func:`_lost_nothing`). The scenarios that run alike on the simulated
fleet are written once, for both, in ``tests/workflows/test_remediate_doubles.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import vocabulary as vocab
from steps.cluster.changes import format_time
from steps.sentinel import ledger
from tests.cli import dsx
from tests.emulator.apiserver import Emulator
from tests.emulator.kubelet import EmulatedCluster
from tests.workflows.test_remediate_faults import (
    FAST,
    NODE,
    QUICK,
    _templates,
    _wait_for,
    assert_one_after_the_other,
)
from workflows.compiler import trusted_steps
from workflows.runner import Phase, RunOptions, run

NAMESPACE = "dsx"
# Nodes no certification passed: the pair test has no partner here (its hold is tested on the sim and the
# real control plane).
FLEET = "sim:nodes=4,gpu=h100,faults=node-01:xid=79,certified=none"
CONDITION = vocab.CONDITION_SENTINEL["xid"]
STAMP = "2025-01-06T08:00:00Z"


class Repairer:
    """The repair system: reboots node-01 ``delay`` seconds after each request for its repair.

    ``mode``: ``ok`` (new boot id, Ready, the fault's condition False) or ``never`` (nothing happens);
    ``after`` runs once the node is back (say, the repair left a fault the condition does not show).
    """

    def __init__(
        self,
        emulator: Emulator,
        mode: str = "ok",
        delay: float = 0.3,
        after: Callable[[], None] = lambda: None,
    ) -> None:
        self.emulator, self.mode, self.delay, self.after = emulator, mode, delay, after
        self.repaired = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Repairer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _asked(self) -> str:
        node = self.emulator.get("nodes", NODE)
        return ((node or {}).get("metadata", {}).get("annotations") or {}).get(
            vocab.ANNOTATION_REPAIR_REQUESTED_AT, ""
        )

    def _loop(self) -> None:
        done = ""
        while not self._stop.is_set() and self.mode != "never":
            asked = self._asked()
            if asked and asked != done:  # each new request is repaired once
                self._stop.wait(self.delay)
                self.emulator.update("nodes", "", NODE, _reboot)
                self.after()
                self.repaired.set()
                done = asked
            self._stop.wait(0.05)


def _reboot(node: dict[str, Any]) -> None:
    """The node back on a new boot, its sentinel reading of that boot written as the agent writes one:
    the condition's transition and heartbeat times move with it."""
    node["status"]["nodeInfo"]["bootID"] = str(uuid.uuid4())
    now = format_time(dt.datetime.now(dt.UTC))
    for condition in node["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = "True"
        elif condition["type"] == CONDITION:
            condition.update(
                status="False",
                reason="Repaired",
                message="healthy after the repair",
                lastTransitionTime=now,
                lastHeartbeatTime=now,
            )


def _faulty(node: dict[str, Any]) -> None:
    node["status"]["conditions"].append(
        {
            "type": CONDITION,
            "status": "True",
            "reason": "Xid79",
            "message": "GPU 3: XID 79 (fallen off the bus)",
            "lastTransitionTime": STAMP,
            "lastHeartbeatTime": STAMP,
        }
    )


@pytest.fixture
def cluster(k8s_cluster: Callable[..., EmulatedCluster]) -> Callable[..., EmulatedCluster]:
    """``cluster(spec, **options)``: an emulated cluster of the simulated fleet ``spec``, node-01 faulty
    (``options``: :func:`tests.conftest.k8s_cluster`'s)."""

    def make(spec: str = FLEET, **options: Any) -> EmulatedCluster:
        made = k8s_cluster(spec=spec, **options)
        made.emulator.update("nodes", "", NODE, _faulty)
        return made

    return make


def _params(**extra: str) -> dict[str, str]:
    return {
        "node": NODE,
        "check": "xid",
        "drain-policy": json.dumps(FAST),
        "repair-timeout": "6s",
        "launcher": "local",
        **QUICK,
        **extra,
    }


def _options(made: EmulatedCluster, out: Path) -> RunOptions:
    return RunOptions(
        out_dir=out,
        cluster="kube",
        kubeconfig=str(made.kubeconfig),
        namespace=NAMESPACE,
        trusted=trusted_steps(),
    )


def _remediate(made: EmulatedCluster, out: Path, **extra: str) -> Phase:
    entry, library = _templates()
    return run(entry, library, _params(**extra), _options(made, out)).phase


def _in_background(made: EmulatedCluster, out: Path, **extra: str) -> tuple[threading.Thread, list[Phase]]:
    phases: list[Phase] = []
    thread = threading.Thread(target=lambda: phases.append(_remediate(made, out, **extra)), daemon=True)
    thread.start()
    return thread, phases


def _node(made: EmulatedCluster, name: str = NODE) -> dict[str, Any]:
    node = made.emulator.get("nodes", name)
    assert node is not None, f"{name} is gone"
    return node


def _labels(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"].get("labels") or {})


def _cordoned(node: dict[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def _states(made: EmulatedCluster) -> list[str]:
    return [e.state for e in ledger.entries(made.port(NAMESPACE), NODE)]


def _cordon_by_hand(made: EmulatedCluster, name: str) -> None:
    """``kubectl cordon``: a merge patch of ``spec.unschedulable`` over HTTP."""
    _core(made).patch_node(name, {"spec": {"unschedulable": True}}, _preload_content=False)


def _core(made: EmulatedCluster) -> Any:
    from kubernetes import client

    from steps.cluster.kube import load_api_client

    api_client, _ = load_api_client(str(made.kubeconfig))
    return client.CoreV1Api(api_client)


def _requests(emulator: Emulator, method: str, part: str) -> list[str]:
    return [r.path for r in emulator.requests if r.method == method and part in r.path]


def _lost_nothing(
    made: EmulatedCluster, cordoned_before: frozenset[str] = frozenset(), deleted: str = ""
) -> None:
    """No pod deleted outside the Eviction API (but pods whose name holds ``deleted``, where the drain
    policy says so), no budget below what it asks for, no node cordoned without ``dsx.dev/state``, no
    cordon made outside dsx lifted."""
    emulator = made.emulator
    removed = [p for p in _requests(emulator, "DELETE", "/pods/") if not (deleted and deleted in p)]
    assert not removed, f"pods deleted outside the Eviction API: {removed}"
    emulator.settle()
    pods = emulator.objects("pods")
    for budget in emulator.objects("poddisruptionbudgets"):
        wanted = budget["spec"]["selector"]["matchLabels"].items()
        healthy = [
            p
            for p in pods
            if p["metadata"].get("namespace") == budget["metadata"]["namespace"]
            and wanted <= (p["metadata"].get("labels") or {}).items()
            and (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]
        desired = int(budget["status"]["desiredHealthy"])
        assert len(healthy) >= desired, f"budget {budget['metadata']['name']}: {len(healthy)} < {desired}"
    for node in emulator.objects("nodes"):
        name = node["metadata"]["name"]
        if name in cordoned_before:
            assert _cordoned(node), f"{name}: a cordon made outside dsx was lifted"
        elif _cordoned(node):
            assert _labels(node).get(vocab.LABEL_STATE), f"{name} cordoned with no state label"


def _in_service(made: EmulatedCluster) -> None:
    node = _node(made)
    labels = _labels(node)
    assert not _cordoned(node) and labels[vocab.LABEL_CERTIFICATION] == "passed"
    assert vocab.LABEL_STATE not in labels and vocab.LABEL_RECERTIFY not in labels
    assert not [t for t in node["spec"].get("taints") or [] if t["key"] == vocab.TAINT_UNHEALTHY]
    assert _states(made)[-2:] == [ledger.IN_SERVICE, "ended"]


# ----------------------------------------------------------------------------------------- the faults


@pytest.mark.story
def test_a_repaired_node_is_recertified_and_back_in_service(
    cluster: Callable[..., EmulatedCluster], tmp_path: Path
) -> None:
    made = cluster()
    _cordon_by_hand(made, "node-00")  # an operator's cordon from before: never lifted
    with Repairer(made.emulator) as repairer:
        assert _remediate(made, tmp_path / "run") == Phase.Succeeded
    assert repairer.repaired.is_set()
    _in_service(made)
    evicted = _requests(made.emulator, "POST", "/eviction")
    assert any("/serving/pods/inference" in p for p in evicted) and any("/research/" in p for p in evicted)
    assert not any("nvidia-" in p for p in evicted), "a DaemonSet pod was evicted"
    assert not [
        p
        for p in made.emulator.objects("pods")
        if p["spec"].get("nodeName") == NODE
        and (p["metadata"].get("ownerReferences") or [{}])[0].get("kind") != "DaemonSet"
    ], "the drain left pods on the node"
    _lost_nothing(made, frozenset({"node-00"}))


def _one_after_the_other(made: EmulatedCluster) -> None:
    """Two remediation runs of the node, the second begun after the first ended; the node in service."""
    assert_one_after_the_other(made.port(NAMESPACE))
    _in_service(made)
    _lost_nothing(made)


@pytest.mark.story
def test_a_remediation_in_another_process_waits_for_the_mutex_lease(
    cluster: Callable[..., EmulatedCluster], tmp_path: Path
) -> None:
    """The same story with the second run in another process (another shell, another machine): the mutex
    is a Lease in the cluster, so it waits there, and begins only once the first run ended."""
    made = cluster()
    with Repairer(made.emulator):
        first, phases = _in_background(made, tmp_path / "a")
        _wait_for(lambda: "quarantined" in _states(made), timeout=120)
        params = [a for k, v in _params().items() for a in ("-p", f"{k}={v}")]
        second = dsx(
            "run", "remediate", "--local", "--cluster", "kube", "--kubeconfig", str(made.kubeconfig),
            "--namespace", NAMESPACE, "--out", str(tmp_path / "b"), *params, timeout=300,
        )  # fmt: skip
        first.join(120)
    assert phases == [Phase.Succeeded] and second.returncode == 0, second.stdout[-3000:] + second.stderr
    assert f"Waiting for {NAMESPACE}/Mutex/dsx-remediate-{NODE} lock" in second.stderr
    _one_after_the_other(made)


@pytest.mark.story
def test_a_throttled_eviction_api_is_waited_out_within_the_drain_deadline(
    cluster: Callable[..., EmulatedCluster], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """API Priority and Fairness answers 429 with Retry-After (no disruption budget named): the port waits
    as told, and when its retries run out the drain tries the pod again after its own backoff, as it does
    a budget's refusal, until its deadline. It once failed the run with the node cordoned and
    state=draining, which no Sensor edge would ever pick up again."""
    monkeypatch.setenv(vocab.ENV_RETRY_ATTEMPTS, "2")
    made = cluster()
    made.emulator.fail(8, 429, method="POST", path="/eviction")
    with Repairer(made.emulator):
        assert _remediate(made, tmp_path / "run") == Phase.Succeeded
    throttled = [r for r in made.emulator.requests if r.status == 429]
    assert len(throttled) == 8  # four evictions the port gave up on after its two tries each
    _in_service(made)
    _lost_nothing(made)


# ----------------------------------------------------------------------------------------- RBAC


def _needs(method: str, path: str) -> tuple[str, str, str, str]:
    """The RBAC (namespace or '*', api group, resource, verb) a request needs."""
    parts = path.split("?")[0].strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = "*"
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch"}.get(
        method, method.lower()
    )
    return namespace, group, resource, verb


@pytest.mark.story
def test_every_call_a_remediation_makes_is_granted_to_its_account(
    cluster: Callable[..., EmulatedCluster], tmp_path: Path
) -> None:
    """A remediation that goes through every step on the emulated API server (a drain that evicts and, as
    its namespace mode says, deletes; the repair wait; certification through ``templateRef``; the pair
    test through ``dsx-bisect``'s templates; the exit handler): every request it sent needs a grant the
    chart gives ``dsx-remediate``, as Argo runs templates reached through ``templateRef`` under the calling
    workflow's service account."""
    from tests.test_chart import CHART, _docs, _granted, _template

    granted = set(_granted(_docs(_template(CHART, namespace=NAMESPACE)), "dsx-remediate"))
    made = cluster(f"{FLEET},blocking-pdb=true")
    policy = {**FAST, "namespaces": {"serving": {"mode": "delete-after-timeout", "timeout_s": 0.5}}}
    with Repairer(made.emulator):
        assert _remediate(made, tmp_path / "run", **{"drain-policy": json.dumps(policy)}) == Phase.Succeeded
    needed = {_needs(r.method, r.path) for r in made.emulator.requests}
    missing = sorted(n for n in needed if n not in granted and ("*", *n[1:]) not in granted)
    assert not missing, f"dsx-remediate may not: {missing}"


@pytest.mark.story
def test_a_partner_a_workload_takes_gives_no_verdict_and_the_node_is_not_escalated(
    cluster: Callable[..., EmulatedCluster], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pair test's partner is free when chosen, then a training pod takes all its GPUs: the test's rank
    pods cannot all be scheduled within the budget. That says nothing about node-01: it stays
    recertifying and cordoned, its certification pending, never escalated."""
    made = cluster(service_accounts=("dsx-ranks",))
    for name, value in {
        vocab.ENV_GPU_IMAGE: "registry.example/dsx-gpu:0.1.0",
        vocab.ENV_JOB_POLL_S: "0.1",
        vocab.ENV_SCHEDULE_BUDGET_S: "3",
        vocab.ENV_STALE_WAIT_S: "30",
    }.items():
        monkeypatch.setenv(name, value)
    core = _core(made)
    for name in ("node-00", "node-02", "node-03"):  # what an earlier certification left: known good
        core.patch_node(
            name, {"metadata": {"labels": {vocab.LABEL_CERTIFICATION: "passed"}}}, _preload_content=False
        )
    taken: list[str] = []

    def take_the_partner() -> None:
        while not taken:
            for node in made.emulator.objects("nodes"):
                labels = node["metadata"].get("labels") or {}
                name = node["metadata"]["name"]
                if name != NODE and labels.get(vocab.LABEL_RECERTIFY) == "pair":
                    gpus = node["status"]["allocatable"]["nvidia.com/gpu"]
                    pod = {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": f"train-{name}", "namespace": "research"},
                        "spec": {
                            "nodeName": name,
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.example/train:1",
                                    "command": ["sleep", "600"],
                                    "resources": {"limits": {"nvidia.com/gpu": gpus}},
                                }
                            ],
                        },
                    }
                    core.create_namespaced_pod("research", pod, _preload_content=False)
                    taken.append(name)
                    return
            threading.Event().wait(0.02)

    workload = threading.Thread(target=take_the_partner, daemon=True)
    workload.start()
    # CPU ranks judged relative to each other (the CPU recipe): node-01's own certification passes.
    sizes = {"launcher": "job", "accelerator": "cpu", "service": "local", "min-bytes": "16KiB"}
    sizes |= {"max-bytes": "64KiB", "iters": "2"}
    with Repairer(made.emulator):
        assert _remediate(made, tmp_path / "run", **sizes) == Phase.Failed
    assert taken == ["node-00"]
    node = _node(made)
    labels = _labels(node)
    assert _cordoned(node) and labels[vocab.LABEL_STATE] == vocab.NodeState.recertifying.value
    assert labels[vocab.LABEL_CERTIFICATION] == vocab.Certification.pending.value
    assert vocab.LABEL_REPLACE not in labels
    note = node["metadata"]["annotations"][vocab.ANNOTATION_PAIR_TEST]
    assert note.startswith("no verdict: the test beside node-00 named nothing"), note
    assert "escalated" not in _states(made)
    _lost_nothing(made)

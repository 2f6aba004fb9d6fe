"""PodDisruptionBudgets as the API server's eviction and the disruption controller apply them.

Each rule here is one the test doubles once got wrong in the drain's favour: a terminating pod counted as
healthy, the expected count taken from the pods still there instead of the controller's scale, an empty
selector guarding no pod (policy/v1's guards every pod of its namespace: the real API server, judging the
contract suite, refused the eviction the emulator allowed), a refused eviction that left no trace in the
budget. (kubernetes
``pkg/registry/core/pod/storage/eviction.go`` and ``pkg/controller/disruption/disruption.go``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from steps.cluster import Pod, RetryPolicy, load_fleet
from steps.cluster.kube import KubeCluster, load_api_client
from tests.emulator.apiserver import Emulator, ManualClock, write_kubeconfig
from tests.steps.cluster.conftest import Backend

FAST = RetryPolicy(attempts=6, base_delay=0.0, max_delay=0.0, jitter=0.0)


def _budget(name: str, namespace: str, selector: dict[str, Any] | None, **rule: Any) -> dict[str, Any]:
    """A policy/v1 budget (``selector`` ``None``: none at all)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**({} if selector is None else {"selector": selector}), **rule},
    }


def test_contract_a_budget_with_an_empty_selector_guards_every_pod_of_its_namespace(backend: Backend) -> None:
    port = backend.port
    port.create_object(_budget("everything", "default", {}, minAvailable=1))
    backend.settle()
    result = port.evict("default/debug-shell")
    assert result.outcome == "blocked", result.message
    assert result.message.endswith(
        "The disruption budget everything needs 1 healthy pods and has 1 currently"
    )


def test_contract_a_budget_without_a_selector_guards_no_pod(backend: Backend) -> None:
    port = backend.port
    port.create_object(_budget("nothing", "default", None, minAvailable=1))
    backend.settle()
    assert port.evict("default/debug-shell").outcome == "evicted"


def test_contract_a_budget_over_job_pods_by_max_unavailable_allows_nothing(backend: Backend) -> None:
    # A Job has no scale: the disruption controller cannot count the expected pods and fails safe.
    port = backend.port
    port.create_object(
        _budget("pretrain", "research", {"matchLabels": {"job-name": "pretrain-llama"}}, maxUnavailable=1)
    )
    backend.settle()
    result = port.evict("research/pretrain-llama-0")
    assert result.outcome == "blocked", result.message
    # An integer minAvailable counts the matching pods instead, so it can be met.
    port.delete_object("policy/v1", "PodDisruptionBudget", "pretrain", "research")
    port.create_object(
        _budget("pretrain", "research", {"matchLabels": {"job-name": "pretrain-llama"}}, minAvailable=3)
    )
    backend.settle()
    assert port.evict("research/pretrain-llama-0").outcome == "evicted"


def _emulator(tmp_path: Path, clock: ManualClock | None = None) -> tuple[Emulator, KubeCluster]:
    emulator = Emulator(clock=clock or ManualClock())
    emulator.seed(load_fleet("sim:nodes=6,gpu=h100").manifests())
    emulator.start()
    api_client, _ = load_api_client(str(write_kubeconfig(tmp_path / "kubeconfig", emulator.url)))
    return emulator, KubeCluster(api_client, retry=FAST)


def test_a_terminating_pod_is_not_healthy(tmp_path: Path) -> None:
    emulator, port = _emulator(tmp_path)
    try:
        hold = {"metadata": {"finalizers": ["example.com/hold"]}}
        port.patch_object("v1", "Pod", "inference-5d8f7c-0", hold, "serving")
        assert port.evict("serving/inference-5d8f7c-0").outcome == "evicted"
        terminating = emulator.get("pods", "inference-5d8f7c-0", "serving")
        assert terminating is not None and terminating["metadata"].get("deletionTimestamp")
        # maxUnavailable 1 of 3: the pod still terminating is the one disruption allowed.
        blocked = port.evict("serving/inference-5d8f7c-1")
        assert blocked.outcome == "blocked"
        assert "needs 2 healthy pods and has 2 currently" in blocked.message
        status = emulator.get("poddisruptionbudgets", "inference", "serving")["status"]  # type: ignore[index]
        assert (status["currentHealthy"], status["desiredHealthy"], status["expectedPods"]) == (2, 2, 3)
        assert status["disruptionsAllowed"] == 0
    finally:
        emulator.stop()


def test_a_failed_replica_counts_against_the_controllers_scale(tmp_path: Path) -> None:
    emulator, port = _emulator(tmp_path)
    try:
        emulator.update(
            "pods",
            "serving",
            "inference-5d8f7c-0",
            lambda p: p["status"].update(phase="Failed", conditions=[]),
        )
        # The ReplicaSet wants 3; one failed and is not replaced yet: 2 healthy is all the budget allows.
        assert port.evict("serving/inference-5d8f7c-1").outcome == "blocked"
    finally:
        emulator.stop()


def test_an_eviction_refused_after_the_budget_check_still_holds_a_disruption_for_two_minutes(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    emulator, port = _emulator(tmp_path, clock)
    try:
        pod = next(p for p in port.pods_on("node-00") if p.name == "inference-5d8f7c-0")
        stale = pod.model_copy(update={"uid": "not-the-pod-there"})
        assert port.evict(stale).outcome == "gone"  # 409 on the uid, after the budget was decremented
        status = emulator.get("poddisruptionbudgets", "inference", "serving")["status"]  # type: ignore[index]
        assert list(status["disruptedPods"]) == ["inference-5d8f7c-0"]
        assert port.evict("serving/inference-5d8f7c-1").outcome == "blocked"
        clock.advance(121)  # DeletionTimeout: the controller stops waiting for the deletion
        assert port.evict("serving/inference-5d8f7c-1").outcome == "evicted"
    finally:
        emulator.stop()


def test_a_budget_the_controller_has_not_seen_refuses_every_eviction(tmp_path: Path) -> None:
    emulator = Emulator(controllers=False, clock=ManualClock())
    emulator.seed(load_fleet("sim:nodes=6,gpu=h100").manifests())
    with emulator:
        api_client, _ = load_api_client(str(write_kubeconfig(tmp_path / "kubeconfig", emulator.url)))
        port = KubeCluster(api_client, retry=FAST)
        waiting = port.evict(Pod(name="inference-5d8f7c-0", namespace="serving"))
        assert waiting.outcome == "blocked" and "still being processed" in waiting.message
        emulator.settle()
        assert port.evict("serving/inference-5d8f7c-0").outcome == "evicted"

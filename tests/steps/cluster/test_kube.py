"""The kubernetes-client adapter against the emulated API server: configuration, HTTP, retries."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import (
    ApiUnavailableError,
    ClusterConfigError,
    CordonRefusedError,
    ForbiddenError,
    RetryPolicy,
    connect,
    load_fleet,
)
from steps.cluster.kube import KubeCluster, load_api_client
from tests.emulator.apiserver import Emulator, write_kubeconfig
from tests.steps.cluster.conftest import FAST


@pytest.fixture
def port(k8s_emulator: Emulator, kubeconfig: Path) -> KubeCluster:
    k8s_emulator.seed(load_fleet("sim:nodes=4,gpu=b200,blocking-pdb=true").manifests())
    result = connect("kube", kubeconfig=str(kubeconfig), retry=FAST)
    assert isinstance(result, KubeCluster)
    return result


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_kubeconfig_and_context_are_honoured(k8s_emulator: Emulator, tmp_path: Path) -> None:
    k8s_emulator.seed(load_fleet("sim:nodes=2").manifests())
    config = write_kubeconfig(tmp_path / "config", k8s_emulator.url, context="lab")
    port = connect("kube", kubeconfig=str(config), context="lab", retry=FAST)
    assert port.endpoint == k8s_emulator.url
    assert [n.name for n in port.list_nodes()] == ["node-00", "node-01"]
    with pytest.raises(ClusterConfigError, match="context 'prod'"):
        connect("kube", kubeconfig=str(config), context="prod")


def test_kubeconfig_from_the_environment(
    k8s_emulator: Emulator, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("DSX_NAMESPACE", "ops")
    monkeypatch.delenv("DSX_CLUSTER", raising=False)
    port = connect()
    assert port.endpoint == k8s_emulator.url
    assert port.namespace == "ops"


def test_missing_kubeconfig_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ClusterConfigError) as caught:
        connect("kube", kubeconfig=str(tmp_path / "nope"))
    assert str(caught.value).startswith(f"connect: kubeconfig {tmp_path / 'nope'} does not exist")
    broken = tmp_path / "broken"
    broken.write_text("clusters: [")
    with pytest.raises(ClusterConfigError, match="broken"):
        connect("kube", kubeconfig=str(broken))


def test_unreachable_api_is_retried_then_named(tmp_path: Path) -> None:
    sleeps: list[float] = []
    config = write_kubeconfig(tmp_path / "config", f"http://127.0.0.1:{_free_port()}")
    api_client, _ = load_api_client(str(config))
    port = KubeCluster(
        api_client, retry=RetryPolicy(attempts=3, base_delay=0.1, jitter=0.0, sleep=sleeps.append)
    )
    with pytest.raises(ApiUnavailableError) as caught:
        port.get_node("node-00")
    message = str(caught.value)
    assert message.startswith("get_node node/node-00: cannot reach the Kubernetes API at http://127.0.0.1:")
    assert "gave up after 3 tries" in message
    assert sleeps == [0.1, 0.2]  # capped exponential backoff


def test_backoff_is_capped_and_jittered() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=4.0, jitter=0.5)
    for retry in range(8):
        delay = policy.delay(retry)
        assert min(4.0, 2.0**retry) * 0.5 <= delay <= min(4.0, 2.0**retry)
    assert RetryPolicy(base_delay=0.1, max_delay=2.0, jitter=0.0).delay(0, retry_after=1.0) == 1.0


def test_wrong_credentials_are_reported_as_unauthorized(k8s_emulator: Emulator, tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "config", k8s_emulator.url, token="stale")
    port = connect("kube", kubeconfig=str(config), retry=FAST)
    with pytest.raises(ForbiddenError, match=r"^list_nodes nodes: unauthorized \(401\)"):
        port.list_nodes()


def test_slow_answer_times_out_and_is_retried(k8s_emulator: Emulator, kubeconfig: Path) -> None:
    k8s_emulator.seed(load_fleet("sim:nodes=2").manifests())
    api_client, _ = load_api_client(str(kubeconfig))
    port = KubeCluster(api_client, retry=FAST, timeout=(1.0, 0.2))
    k8s_emulator.slow(0.6, count=1, method="GET")
    assert port.get_node("node-01").name == "node-01"
    assert k8s_emulator.count("GET", "/api/v1/nodes/node-01") == 2


def test_throttling_is_retried_but_a_budget_refusal_is_not(port: KubeCluster, k8s_emulator: Emulator) -> None:
    k8s_emulator.fail(2, status=429)
    assert len(port.list_nodes()) == 4
    result = port.evict("serving/gateway-7f6d5b-0")
    assert result.outcome == "blocked"
    assert k8s_emulator.count("POST", "/eviction") == 1


def test_requests_use_the_api_server_conventions(port: KubeCluster, k8s_emulator: Emulator) -> None:
    port.set_labels("node-01", {"dsx.dev/certification": "passed"})
    port.cordon("node-01", "x")
    port.set_condition("node-01", "DsxNicDegraded", True, "SlowLink", "mlx5_0 at 100 Gb/s")
    port.pods_on("node-01")
    seen = [(r.method, r.path, r.content_type, r.query) for r in k8s_emulator.requests]
    manager = {"fieldManager": "dsx"}  # so managedFields tell dsx's writes from kubectl's
    assert ("PATCH", "/api/v1/nodes/node-01", "application/merge-patch+json", manager) in seen
    assert (
        "PATCH",
        "/api/v1/nodes/node-01/status",
        "application/strategic-merge-patch+json",
        manager,
    ) in seen
    assert ("GET", "/api/v1/pods", "application/json", {"fieldSelector": "spec.nodeName=node-01"}) in seen


def test_labels_and_annotations_travel_in_one_patch(port: KubeCluster, k8s_emulator: Emulator) -> None:
    port.set_node_metadata(
        "node-01",
        labels={"dsx.dev/certification": "passed"},
        annotations={"dsx.dev/certification-reason": "412 GB/s"},
    )
    assert k8s_emulator.count("PATCH", "/api/v1/nodes/node-01") == 1
    node = k8s_emulator.objects("nodes")[1]
    assert node["metadata"]["labels"]["dsx.dev/certification"] == "passed"
    assert node["metadata"]["annotations"]["dsx.dev/certification-reason"] == "412 GB/s"


def test_who_set_unschedulable_is_read_from_managed_fields(k8s_emulator: Emulator, kubeconfig: Path) -> None:
    """dsx cordoned node-01 as alice; kubectl uncordoned and cordoned it again: the annotations still say
    alice, managedFields say kubectl-cordon owns spec.unschedulable now, and dsx leaves it alone."""
    manifests = load_fleet("sim:nodes=2").manifests()
    node = manifests[1]
    node["spec"]["unschedulable"] = True
    node["metadata"]["annotations"] = {
        "dsx.dev/cordoned-by": "alice",
        "dsx.dev/cordon-reason": "bad NIC",
        "dsx.dev/cordoned-before-dsx": "false",
    }

    def entry(manager: str, fields: dict[str, Any], **extra: str) -> dict[str, Any]:
        return {
            "manager": manager,
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2025-03-01T12:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
            **extra,
        }

    node["metadata"]["managedFields"] = [
        entry("kubelet", {"f:status": {"f:conditions": {}}}, subresource="status"),
        entry("dsx", {"f:metadata": {"f:annotations": {"f:dsx.dev/cordoned-by": {}}}}),
        entry("kubectl-cordon", {"f:spec": {"f:unschedulable": {}}}),
    ]
    k8s_emulator.seed(manifests)
    port = connect("kube", kubeconfig=str(kubeconfig), retry=FAST)
    assert port.get_node("node-01").unschedulable_managers == ["kubectl-cordon"]
    with pytest.raises(CordonRefusedError, match=r"carries a cordon made outside dsx \(by kubectl-cordon\)"):
        port.uncordon("node-01", by="alice")
    assert k8s_emulator.count("PATCH") == 0


def test_read_modify_write_sends_the_resource_version(port: KubeCluster, k8s_emulator: Emulator) -> None:
    k8s_emulator.conflict(1)
    port.add_taint("node-02")
    statuses = [r.status for r in k8s_emulator.requests if r.method == "PATCH"]
    assert statuses == [409, 200]  # the stale version was refused, the re-read one accepted


def test_tls_failure_is_named_and_not_mistaken_for_a_refusal(k8s_emulator: Emulator, tmp_path: Path) -> None:
    https = k8s_emulator.url.replace("http://", "https://")
    config = write_kubeconfig(tmp_path / "config", https)
    port = connect("kube", kubeconfig=str(config), retry=FAST)
    with pytest.raises(
        ApiUnavailableError, match=rf"^get_node node/node-00: cannot talk to the Kubernetes API at {https}"
    ):
        port.get_node("node-00")

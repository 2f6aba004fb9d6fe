"""The emulated API server refuses and deletes as the real one does: Events, name conflicts, deletion
propagation and garbage collection, through the kubernetes client over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from steps.cluster import ClusterError
from steps.cluster.kube import KubeCluster, load_api_client
from tests.emulator.apiserver import POD_SECURITY_ENFORCE, Emulator, ManualClock, write_kubeconfig
from tests.emulator.objects import group_job, job_pods
from tests.pods import bare_pod, rank_pod

NODE_EVENT = {
    "apiVersion": "v1",
    "kind": "Event",
    "metadata": {"name": "node-03.17f2a"},
    "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "node-03"},
    "reason": "DsxCertified",
    "message": "certification passed",
    "type": "Normal",
    "source": {"component": "dsx"},
    "firstTimestamp": "2025-03-01T12:00:00Z",
    "lastTimestamp": "2025-03-01T12:00:00Z",
    "count": 1,
}


@pytest.fixture
def api(k8s_emulator: Emulator, kubeconfig: Path) -> Any:
    api_client, _ = load_api_client(str(kubeconfig))
    return api_client


def _refusal(call: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value.status, json.loads(caught.value.body)


# ------------------------------------------------------------------------- events


def test_a_node_event_without_event_time_is_accepted_only_in_default(
    api: Any, k8s_emulator: Emulator
) -> None:
    core = client.CoreV1Api(api)
    status, body = _refusal(lambda: core.create_namespaced_event("gpu-ops", NODE_EVENT))
    assert status == 422
    assert body["reason"] == "Invalid"
    assert body["message"] == (
        'Event "node-03.17f2a" is invalid: involvedObject.namespace: Invalid value: "": '
        "does not match event.namespace"
    )
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "": does not match event.namespace',
            "field": "involvedObject.namespace",
        }
    ]
    assert k8s_emulator.objects("events") == []
    core.create_namespaced_event("default", NODE_EVENT)
    assert [e["metadata"]["namespace"] for e in k8s_emulator.objects("events")] == ["default"]


def test_an_event_about_a_namespaced_object_must_live_in_its_namespace(api: Any) -> None:
    core = client.CoreV1Api(api)
    about_pod = {**NODE_EVENT, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "gpu-ops"}}
    status, body = _refusal(lambda: core.create_namespaced_event("default", about_pod))
    assert status == 422 and 'Invalid value: "gpu-ops": does not match event.namespace' in body["message"]
    core.create_namespaced_event("gpu-ops", about_pod)


def test_a_node_event_with_event_time_goes_to_default_or_kube_system_and_names_its_reporter(api: Any) -> None:
    core = client.CoreV1Api(api)
    timed = {
        **{k: v for k, v in NODE_EVENT.items() if k not in ("firstTimestamp", "lastTimestamp", "count")},
        "eventTime": "2025-03-01T12:00:00.000000Z",
        "reportingComponent": "dsx.dev/certify",
        "reportingInstance": "certify-abc",
        "action": "Label",
    }
    status, body = _refusal(lambda: core.create_namespaced_event("gpu-ops", timed))
    assert status == 422 and "involvedObject.namespace" in body["message"]
    core.create_namespaced_event("kube-system", timed)
    without_action = {k: v for k, v in timed.items() if k != "action"}
    status, body = _refusal(lambda: core.create_namespaced_event("default", without_action))
    assert body["message"] == 'Event "node-03.17f2a" is invalid: action: Required value'


def test_events_k8s_io_v1_needs_event_time_and_keeps_node_events_out_of_other_namespaces(api: Any) -> None:
    events = client.EventsV1Api(api)
    event = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "node-03.17f2b"},
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": "node-03"},
        "reason": "DsxCertified",
        "note": "certification passed",
        "type": "Normal",
        "reportingController": "dsx.dev/certify",
        "reportingInstance": "certify-abc",
        "action": "Label",
        "eventTime": "2025-03-01T12:00:00.000000Z",
    }
    status, body = _refusal(lambda: events.create_namespaced_event("gpu-ops", event))
    assert status == 422 and body["message"].startswith('Event.events.k8s.io "node-03.17f2b" is invalid')
    events.create_namespaced_event("default", event)
    untimed = {k: v for k, v in event.items() if k != "eventTime"} | {"metadata": {"name": "node-03.17f2c"}}
    with pytest.raises(ClusterError, match=r"rejected \(422\).*eventTime: Required value"):
        KubeCluster(api).create_object(untimed)  # the typed client would not even send it


def test_an_event_lives_its_ttl_from_its_last_write(tmp_path: Path) -> None:
    """The API server's ``--event-ttl`` (1 h by default) leases every Event write: an Event is gone a TTL
    after it was last written, an update starting its TTL again (compared with a real API server in the e2e
    tier)."""
    clock = ManualClock()
    with Emulator(clock=clock, event_ttl=60) as emulator:
        api_client, _ = load_api_client(str(write_kubeconfig(tmp_path / "kubeconfig", emulator.url)))
        core = client.CoreV1Api(api_client)
        core.create_namespaced_event("default", NODE_EVENT)
        core.create_namespaced_event("default", {**NODE_EVENT, "metadata": {"name": "node-03.17f2b"}})
        clock.advance(45)
        core.patch_namespaced_event("node-03.17f2b", "default", {"count": 2})
        clock.advance(30)  # 75 s after the first was written, 30 after the second was updated
        kept = [e.metadata.name for e in core.list_namespaced_event("default").items]
        assert kept == ["node-03.17f2b"]
        assert _refusal(lambda: core.read_namespaced_event("node-03.17f2a", "default"))[0] == 404
        clock.advance(31)
        assert core.list_namespaced_event("default").items == []


# ------------------------------------------------------------------------- name conflicts


def _create(api: Any, manifest: dict[str, Any]) -> Any:
    kind = manifest["kind"]
    if kind == "Job":
        return client.BatchV1Api(api).create_namespaced_job("dsx", manifest)
    if kind == "Service":
        return client.CoreV1Api(api).create_namespaced_service("dsx", manifest)
    return client.CoreV1Api(api).create_namespaced_config_map("dsx", manifest)


@pytest.mark.parametrize(
    ("manifest", "plural", "group"),
    [
        (group_job("dsx-sweep-all", ["node-00"]), "jobs", "batch"),
        (
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dsx-sweep-all"}, "spec": {}},
            "services",
            "",
        ),
        (
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dsx-sweep-all"}, "data": {}},
            "configmaps",
            "",
        ),
    ],
)
def test_creating_an_existing_name_is_409_already_exists(
    api: Any, manifest: dict[str, Any], plural: str, group: str
) -> None:
    _create(api, manifest)
    status, body = _refusal(lambda: _create(api, manifest))
    assert status == 409
    assert body["reason"] == "AlreadyExists"
    qualified = f"{plural}.{group}" if group else plural
    assert body["message"] == f'{qualified} "dsx-sweep-all" already exists'
    assert body["details"] == {"name": "dsx-sweep-all", "kind": plural} | ({"group": group} if group else {})


# ------------------------------------------------------------------------- deletion and the garbage collector


def _job_with_pods(emulator: Emulator, api: Any, name: str = "g1") -> list[dict[str, Any]]:
    client.BatchV1Api(api).create_namespaced_job("dsx", group_job(name, ["node-00", "node-01"]))
    emulator.settle()
    pods = job_pods(emulator, name)
    assert len(pods) == 2
    return pods


def test_deleting_a_batch_v1_job_with_no_policy_orphans_its_pods(
    quiet: tuple[Emulator, Any, ManualClock],
) -> None:
    emulator, api, _ = quiet
    pods = _job_with_pods(emulator, api)
    client.BatchV1Api(api).delete_namespaced_job("g1", "dsx")
    emulator.settle()
    assert emulator.get("jobs", "g1", "dsx") is None
    left = job_pods(emulator, "g1")
    assert [p["metadata"]["uid"] for p in left] == [p["metadata"]["uid"] for p in pods]
    assert all(not p["metadata"].get("ownerReferences") and not p["metadata"].get("finalizers") for p in left)


def test_the_dsx_adapter_deletes_in_the_background_and_orphans_only_without_a_policy(
    quiet: tuple[Emulator, Any, ManualClock],
) -> None:
    emulator, api, _ = quiet
    _job_with_pods(emulator, api)
    port = KubeCluster(api, namespace="dsx")
    assert port.delete_object("batch/v1", "Job", "g1", "dsx", propagation=None) is True
    emulator.settle()
    assert len(job_pods(emulator, "g1")) == 2
    for pod in job_pods(emulator, "g1"):
        port.delete_object("v1", "Pod", pod["metadata"]["name"], "dsx")
    emulator.settle()
    _job_with_pods(emulator, api)
    assert port.delete_object("batch/v1", "Job", "g1", "dsx") is True  # Background by default
    emulator.settle()
    assert job_pods(emulator, "g1") == []


def test_background_deletes_the_job_first_and_its_pods_after(
    quiet: tuple[Emulator, Any, ManualClock],
) -> None:
    emulator, api, _ = quiet
    _job_with_pods(emulator, api)
    client.BatchV1Api(api).delete_namespaced_job(
        "g1", "dsx", body=client.V1DeleteOptions(propagation_policy="Background")
    )
    assert emulator.get("jobs", "g1", "dsx") is None
    assert len(job_pods(emulator, "g1")) == 2  # the garbage collector has not run yet
    emulator.settle()
    assert job_pods(emulator, "g1") == []


def test_foreground_deletes_the_pods_first_and_the_job_after(
    quiet: tuple[Emulator, Any, ManualClock],
) -> None:
    emulator, api, _ = quiet
    _job_with_pods(emulator, api)
    client.BatchV1Api(api).delete_namespaced_job("g1", "dsx", propagation_policy="Foreground")
    job = emulator.get("jobs", "g1", "dsx")
    assert job is not None and job["metadata"]["deletionTimestamp"]
    assert job["metadata"]["finalizers"] == ["foregroundDeletion"]
    status, body = _refusal(lambda: _create(api, group_job("g1", ["node-00"])))
    assert (status, body["reason"]) == (409, "AlreadyExists")  # the name stays taken meanwhile
    emulator.settle(passes=1)
    assert job_pods(emulator, "g1") == [] and emulator.get("jobs", "g1", "dsx") is not None
    emulator.settle()
    assert emulator.get("jobs", "g1", "dsx") is None


def test_delete_options_in_a_body_win_over_the_query(quiet: tuple[Emulator, Any, ManualClock]) -> None:
    emulator, api, _ = quiet
    _job_with_pods(emulator, api)
    status, _ = KubeCluster(api)._request(
        "DELETE", "/apis/batch/v1/namespaces/dsx/jobs/g1", {"propagationPolicy": "Background"}, body={}
    )
    assert status == 200
    emulator.settle()
    assert len(job_pods(emulator, "g1")) == 2  # the empty body's default (Orphan), not the query's


def test_an_unknown_propagation_policy_is_refused(quiet: tuple[Emulator, Any, ManualClock]) -> None:
    emulator, api, _ = quiet
    _job_with_pods(emulator, api)
    jobs = client.BatchV1Api(api)
    status, body = _refusal(lambda: jobs.delete_namespaced_job("g1", "dsx", propagation_policy="Cascade"))
    assert status == 422 and 'propagationPolicy: Unsupported value: "Cascade"' in body["message"]
    assert emulator.get("jobs", "g1", "dsx") is not None


def test_dependents_of_an_owner_that_does_not_exist_are_collected(
    quiet: tuple[Emulator, Any, ManualClock],
) -> None:
    emulator, api, _ = quiet
    port = KubeCluster(api, namespace="gpu-ops")
    workflow = port.create_object(
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": "certify-q9", "namespace": "gpu-ops"},
        }
    )
    live = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "certify-q9"}
    live["uid"] = workflow["metadata"]["uid"]
    ghost = {**live, "name": "certify-old", "uid": "0d2c6a1e-0000-4000-8000-000000000000"}

    def configmap(name: str, owners: list[dict[str, Any]]) -> None:
        port.create_object(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "gpu-ops", "ownerReferences": owners},
            }
        )

    configmap("kept", [live])
    configmap("orphan", [ghost])
    configmap("both", [live, ghost])
    emulator.settle()
    assert [c["metadata"]["name"] for c in emulator.objects("configmaps", "gpu-ops")] == ["both", "kept"]
    both = emulator.get("configmaps", "both", "gpu-ops")
    assert both is not None and both["metadata"]["ownerReferences"] == [live]
    # Any other kind is deleted in the background by default: its dependents follow it.
    assert port.delete_object("argoproj.io/v1alpha1", "Workflow", "certify-q9", "gpu-ops") is True
    emulator.settle()
    assert emulator.objects("configmaps", "gpu-ops") == []


def test_seeded_pods_of_controllers_outside_the_store_are_kept(k8s_emulator: Emulator) -> None:
    from steps.cluster import load_fleet

    k8s_emulator.seed(load_fleet("sim:nodes=4").manifests())
    before = [p["metadata"]["name"] for p in k8s_emulator.objects("pods")]
    k8s_emulator.settle()
    assert [p["metadata"]["name"] for p in k8s_emulator.objects("pods")] == before


def test_a_configmap_over_one_mebibyte_is_refused_on_create_and_on_update(api: Any) -> None:
    """``ValidateConfigMap``: data and decoded binaryData together hold at most 1 MiB."""
    core = client.CoreV1Api(api)
    body = {"metadata": {"name": "big"}, "data": {"a": "x" * (512 * 1024), "b": "y" * (512 * 1024)}}
    assert core.create_namespaced_config_map("dsx", body).metadata.name == "big"  # exactly 1 MiB
    status, answer = _refusal(lambda: core.patch_namespaced_config_map("big", "dsx", {"data": {"c": "z"}}))
    assert status == 422
    assert answer["message"] == 'ConfigMap "big" is invalid: : Too long: may not be more than 1048576 bytes'
    bigger = {"metadata": {"name": "bigger"}, "binaryData": {"g": "A" * (1400 * 1024)}}  # 1,050 KiB decoded
    status, _ = _refusal(lambda: core.create_namespaced_config_map("dsx", bigger))
    assert status == 422


def test_a_request_body_over_three_mebibytes_is_refused_before_it_is_read(api: Any) -> None:
    """The generic apiserver's ``MaxRequestBodyBytes`` (3 MiB): 413, whatever the object would be."""
    core = client.CoreV1Api(api)
    # Keys do not count toward ValidateConfigMap's 1 MiB, so only the request's size refuses this one.
    keys = {f"k{i:07d}" + "x" * 200: "" for i in range(16_000)}
    status, answer = _refusal(
        lambda: core.create_namespaced_config_map("dsx", {"metadata": {"name": "keys"}, "data": keys})
    )
    assert status == 413
    assert answer["reason"] == "RequestEntityTooLarge"
    assert answer["message"] == "Request entity too large: limit is 3145728"
    assert core.list_namespaced_config_map("dsx").items == []


# ------------------------------------------------------------------------- pod security


def test_a_restricted_namespace_refuses_a_pod_without_its_security_context_and_takes_a_rank_pod(
    api: Any,
) -> None:
    """Pod Security admission as the real API server applies it (tests/e2e/test_doubles.py compares the two):
    dsx's rank pods meet ``restricted``; a pod that sets nothing does not, and is refused naming each rule."""
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "locked", "labels": {POD_SECURITY_ENFORCE: "restricted"}}})
    status, body = _refusal(lambda: core.create_namespaced_pod("locked", bare_pod()))
    assert status == 403
    assert body["message"].startswith('pods "bare" is forbidden: violates PodSecurity "restricted:latest": ')
    for rule in ("allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true",
                 "seccompProfile"):  # fmt: skip
        assert rule in body["message"]
    assert core.create_namespaced_pod("locked", rank_pod("locked")).metadata.name == "rank"
    core.create_namespace({"metadata": {"name": "open"}})
    assert core.create_namespaced_pod("open", bare_pod()).metadata.name == "bare"

"""The emulator's Job controller does what Kubernetes 1.33's does: pods per index, start time, deadline
from the start (Pending included), back-off limit, completion; on a clock the test moves."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.emulator.apiserver import Emulator, ManualClock
from tests.emulator.objects import conditions, group_job, job_pods

Quiet = tuple[Emulator, Any, ManualClock]
MEMBERS = ["node-00", "node-01", "node-02", "node-03"]


def _start(quiet: Quiet, **kwargs: Any) -> list[dict[str, Any]]:
    emulator, api, _ = quiet
    client.BatchV1Api(api).create_namespaced_job("dsx", group_job("g1", MEMBERS, **kwargs))
    emulator.settle()
    return job_pods(emulator, "g1")


def _end_pod(emulator: Emulator, pod: dict[str, Any], phase: str, code: int) -> None:
    """Finish a pod as its kubelet would report it."""

    def change(p: dict[str, Any]) -> None:
        p["status"].update(
            phase=phase,
            containerStatuses=[{"name": "ranks", "state": {"terminated": {"exitCode": code}}}],
        )

    emulator.update("pods", "dsx", pod["metadata"]["name"], change)


def test_an_indexed_job_gets_one_pod_per_index_as_the_job_controller_makes_them(quiet: Quiet) -> None:
    emulator, _, clock = quiet
    pods = _start(quiet)
    job = emulator.get("jobs", "g1", "dsx")
    assert job is not None
    uid = job["metadata"]["uid"]
    assert job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert job["status"]["startTime"] == "2025-03-01T12:00:00Z"
    assert (job["status"]["active"], job["status"]["ready"], job["status"]["succeeded"]) == (4, 0, 0)
    assert len(pods) == 4
    for index, pod in enumerate(pods):
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["name"].startswith(f"g1-{index}-") and len(meta["name"]) == len(f"g1-{index}-") + 5
        assert meta["labels"] == {
            "dsx.dev/group-test": "g1",
            "batch.kubernetes.io/job-completion-index": str(index),
            "batch.kubernetes.io/job-name": "g1",
            "job-name": "g1",
            "batch.kubernetes.io/controller-uid": uid,
            "controller-uid": uid,
        }
        assert meta["annotations"] == {"batch.kubernetes.io/job-completion-index": str(index)}
        assert meta["finalizers"] == ["batch.kubernetes.io/job-tracking"]
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "g1",
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert (spec["hostname"], spec["subdomain"]) == (f"g1-{index}", "g1")
        assert spec["containers"][0]["env"] == [
            {
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {
                    "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-completion-index']"}
                },
            }
        ]
        assert spec["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "8"}  # from the limits
    clock.advance(30)
    emulator.settle()
    again = emulator.get("jobs", "g1", "dsx")
    assert again is not None and again["status"]["startTime"] == "2025-03-01T12:00:00Z"  # set once


def test_the_deadline_counts_from_the_start_with_pending_pods_included(quiet: Quiet) -> None:
    emulator, _, clock = quiet
    pods = _start(quiet, deadline=3)
    assert all(p["status"]["phase"] == "Pending" for p in pods)  # no kubelet: nothing ever runs
    clock.advance(2.9)
    emulator.settle()
    assert len(job_pods(emulator, "g1")) == 4 and conditions(emulator.get("jobs", "g1", "dsx")) == {}
    clock.advance(0.1)
    emulator.settle()
    job = emulator.get("jobs", "g1", "dsx")
    found = conditions(job)
    assert set(found) == {"FailureTarget", "Failed"}
    assert (found["Failed"]["reason"], found["Failed"]["message"]) == (
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
    )
    assert job_pods(emulator, "g1") == []  # every active pod deleted
    assert job is not None and (job["status"]["active"], job["status"]["failed"]) == (0, 4)
    assert "completionTime" not in job["status"]


def test_a_failed_pod_past_the_backoff_limit_fails_the_job_and_stops_the_others(quiet: Quiet) -> None:
    emulator, _, _ = quiet
    pods = _start(quiet, backoff=0)
    _end_pod(emulator, pods[2], "Failed", 1)
    emulator.settle()
    job = emulator.get("jobs", "g1", "dsx")
    assert conditions(job)["Failed"]["reason"] == "BackoffLimitExceeded"
    assert conditions(job)["Failed"]["message"] == "Job has reached the specified backoff limit"
    (left,) = job_pods(emulator, "g1")  # the running pods are deleted; the failed one stays, finished
    assert (left["metadata"]["name"], left["status"]["phase"]) == (pods[2]["metadata"]["name"], "Failed")
    assert not left["metadata"].get("finalizers")
    assert job is not None and job["status"]["failed"] == 4


def test_a_failed_pod_within_the_limit_is_replaced_after_the_controllers_back_off(quiet: Quiet) -> None:
    emulator, _, clock = quiet
    pods = _start(quiet, backoff=1)
    _end_pod(emulator, pods[1], "Failed", 1)
    emulator.settle()
    job = emulator.get("jobs", "g1", "dsx")
    assert job is not None and (job["status"]["failed"], job["status"]["active"]) == (1, 3)
    assert conditions(job) == {}
    clock.advance(9.9)
    emulator.settle()
    assert len(job_pods(emulator, "g1")) == 4  # the failed pod stays, no replacement yet
    clock.advance(0.2)
    emulator.settle()
    indexes = [
        p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in job_pods(emulator, "g1")
    ]
    assert sorted(indexes) == ["0", "1", "1", "2", "3"]


def test_with_a_backoff_limit_per_index_a_failed_index_ends_the_job_once_the_others_have_ended(
    quiet: Quiet,
) -> None:
    """dsx's group Jobs: ``backoffLimitPerIndex: 0`` and no ``backoffLimit`` (then MaxInt32). A failed
    index is not started again and the others run on; the Job fails (FailedIndexes) once all have ended."""
    emulator, api, clock = quiet
    job = group_job("g1", MEMBERS)
    del job["spec"]["backoffLimit"]
    job["spec"]["backoffLimitPerIndex"] = 0
    client.BatchV1Api(api).create_namespaced_job("dsx", job)
    emulator.settle()
    pods = job_pods(emulator, "g1")
    made = emulator.get("jobs", "g1", "dsx")
    assert made is not None and made["spec"]["backoffLimit"] == 2**31 - 1
    _end_pod(emulator, pods[1], "Failed", 1)
    clock.advance(30)  # past any back-off: still no replacement for index 1
    emulator.settle()
    made = emulator.get("jobs", "g1", "dsx")
    assert made is not None and made["status"]["failedIndexes"] == "1" and conditions(made) == {}
    assert len(job_pods(emulator, "g1")) == 4 and made["status"]["active"] == 3
    for pod in (pods[0], pods[2], pods[3]):
        _end_pod(emulator, pod, "Succeeded", 0)
    emulator.settle()
    made = emulator.get("jobs", "g1", "dsx")
    assert made is not None and conditions(made)["Failed"]["reason"] == "FailedIndexes"
    assert (made["status"]["completedIndexes"], made["status"]["failedIndexes"]) == ("0,2-3", "1")


def test_deleting_a_running_pod_counts_as_a_failure(quiet: Quiet) -> None:
    emulator, api, _ = quiet
    pods = _start(quiet, backoff=0)
    client.CoreV1Api(api).delete_namespaced_pod(pods[0]["metadata"]["name"], "dsx")
    emulator.settle()
    assert conditions(emulator.get("jobs", "g1", "dsx"))["Failed"]["reason"] == "BackoffLimitExceeded"


def test_the_job_completes_when_every_index_succeeded(quiet: Quiet) -> None:
    emulator, _, clock = quiet
    pods = _start(quiet, deadline=60)
    clock.advance(5)
    for pod in pods[:3]:
        _end_pod(emulator, pod, "Succeeded", 0)
    emulator.settle()
    job = emulator.get("jobs", "g1", "dsx")
    assert job is not None and job["status"]["completedIndexes"] == "0-2" and conditions(job) == {}
    _end_pod(emulator, pods[3], "Succeeded", 0)
    emulator.settle()
    job = emulator.get("jobs", "g1", "dsx")
    found = conditions(job)
    assert list(found) == ["SuccessCriteriaMet", "Complete"]
    assert found["Complete"]["reason"] == "CompletionsReached"
    assert job is not None and job["status"]["completionTime"] == "2025-03-01T12:00:05Z"
    assert (job["status"]["succeeded"], job["status"]["active"], job["status"]["completedIndexes"]) == (
        4,
        0,
        "0-3",
    )
    clock.advance(120)  # past the deadline: a finished Job stays finished
    emulator.settle()
    assert "Failed" not in conditions(emulator.get("jobs", "g1", "dsx"))
    assert all(not p["metadata"].get("finalizers") for p in job_pods(emulator, "g1"))


def test_a_non_indexed_job_keeps_parallelism_pods_until_its_completions(quiet: Quiet) -> None:
    emulator, api, _ = quiet
    job = group_job("plain", ["node-00"])
    job["spec"] = {"completions": 3, "parallelism": 2, "template": job["spec"]["template"]}
    job["spec"]["template"]["spec"].pop("affinity")
    client.BatchV1Api(api).create_namespaced_job("dsx", job)
    emulator.settle()
    pods = emulator.objects("pods", "dsx")
    assert len(pods) == 2 and all(p["metadata"]["name"].startswith("plain-") for p in pods)
    assert emulator.get("jobs", "plain", "dsx")["spec"]["backoffLimit"] == 6  # type: ignore[index]
    _end_pod(emulator, pods[0], "Succeeded", 0)
    emulator.settle()
    assert len(emulator.objects("pods", "dsx")) == 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"restartPolicy": "Always"},
            'Job.batch "g1" is invalid: spec.template.spec.restartPolicy: Unsupported value: "Always": '
            'supported values: "OnFailure", "Never"',
        ),
        (
            {"completions": None},
            'Job.batch "g1" is invalid: spec.completions: Required value: when completion mode is Indexed',
        ),
    ],
)
def test_the_api_refuses_a_job_its_controller_could_not_run(
    quiet: Quiet, change: dict[str, Any], message: str
) -> None:
    _, api, _ = quiet
    job = group_job("g1", MEMBERS)
    if "restartPolicy" in change:
        job["spec"]["template"]["spec"]["restartPolicy"] = change["restartPolicy"]
    else:
        job["spec"].pop("completions")
    with pytest.raises(ApiException) as caught:
        client.BatchV1Api(api).create_namespaced_job("dsx", job)
    assert caught.value.status == 422 and json.loads(caught.value.body)["message"] == message


def test_a_pod_naming_a_missing_service_account_is_refused(quiet: Quiet) -> None:
    emulator, api, _ = quiet
    job = group_job("g1", MEMBERS)
    job["spec"]["template"]["spec"]["serviceAccountName"] = "dsx-rank"
    client.BatchV1Api(api).create_namespaced_job("dsx", job)
    emulator.settle()
    assert job_pods(emulator, "g1") == []
    (event,) = [e for e in emulator.objects("events", "dsx") if e["reason"] == "FailedCreate"]
    assert event["involvedObject"]["name"] == "g1"
    assert event["message"] == (
        'Error creating: pods "g1-0-" is forbidden: error looking up service account dsx/dsx-rank: '
        'serviceaccount "dsx-rank" not found'
    )
    emulator.seed(
        [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "dsx-rank", "namespace": "dsx"}}]
    )
    emulator.settle()
    assert len(job_pods(emulator, "g1")) == 4

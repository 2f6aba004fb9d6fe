"""The kubelet double runs bound pods to their end, node by node, and plays dsx's rank pods for real."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from steps.cluster.kube import load_api_client
from steps.readiness.models import CollectiveRun
from tests.emulator.kubelet import EmulatedCluster, NodeBehaviour, PodProcess
from tests.emulator.objects import conditions, eventually, group_job, headless_service, job_pods

MakeCluster = Callable[..., EmulatedCluster]


def _pod(name: str, node: str, *command: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "dsx"},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": "busybox:1.36", "command": list(command)}],
        },
    }


def _phase(cluster: EmulatedCluster, name: str, phase: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        pod = cluster.emulator.get("pods", name, "dsx")
        return pod if pod is not None and pod["status"].get("phase") == phase else None

    return check


def _state(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(pod["status"]["containerStatuses"][0]["state"])


def test_the_k8s_cluster_fixture_gives_gpu_nodes_in_racks(k8s_cluster: MakeCluster) -> None:
    cluster = k8s_cluster(nodes=16, racks=4, service_accounts=("dsx-rank",))
    port = cluster.port()
    nodes = port.list_nodes()
    assert len(nodes) == 16
    racks = {n.name: n.labels["topology.dsx.dev/rack"] for n in nodes}
    assert racks["node-00"] == "rack-00" and racks["node-15"] == "rack-03"
    assert sorted(set(racks.values())) == ["rack-00", "rack-01", "rack-02", "rack-03"]
    node = cluster.emulator.get("nodes", "node-07")
    assert node is not None and node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert port.get_object("v1", "ServiceAccount", "dsx-rank", "dsx") is not None
    assert cluster.kubelet is not None and cluster.emulator.objects("pods") == []


def test_pods_run_on_their_node_and_end_with_their_programs_exit_code(k8s_cluster: MakeCluster) -> None:
    cluster = k8s_cluster(nodes=4, racks=2)
    core = client.CoreV1Api(load_api_client(str(cluster.kubeconfig))[0])
    core.create_namespaced_pod("dsx", _pod("server", "node-00", "sleep", "600"))
    core.create_namespaced_pod("dsx", _pod("done", "node-01", "sleep", "0.1"))
    core.create_namespaced_pod("dsx", _pod("broken", "node-02", "false"))
    running = eventually(_phase(cluster, "server", "Running"), what="server running")
    assert running["spec"]["nodeName"] == "node-00" and running["status"]["podIP"].startswith("10.244.")
    assert running["status"]["startTime"] and "running" in _state(running)
    assert conditions(running)["Ready"]["status"] == "True"
    done = eventually(_phase(cluster, "done", "Succeeded"), what="done succeeded")
    assert _state(done)["terminated"]["exitCode"] == 0 and _state(done)["terminated"]["reason"] == "Completed"
    broken = eventually(_phase(cluster, "broken", "Failed"), what="broken failed")
    assert (_state(broken)["terminated"]["exitCode"], _state(broken)["terminated"]["reason"]) == (1, "Error")


def _reported(cluster: EmulatedCluster, name: str, what: str) -> dict[str, Any]:
    """Pod ``name`` once its node's kubelet double has written its container statuses."""
    return eventually(
        lambda: (
            (p := cluster.emulator.get("pods", name, "dsx")) and p["status"].get("containerStatuses") and p
        ),
        what=what,
    )


@pytest.mark.story
def test_each_node_can_start_late_never_start_or_fail_its_pods(k8s_cluster: MakeCluster) -> None:
    behaviours = {
        "node-01": NodeBehaviour(never_starts=True),
        "node-02": NodeBehaviour(start_delay_s=3),
        "node-03": NodeBehaviour(fail_exit_code=3),
    }
    cluster = k8s_cluster(nodes=4, racks=2, behaviours=behaviours)
    port = cluster.port()
    for node in ("node-01", "node-02", "node-03"):
        port.create_object(_pod(f"on-{node}", node, "sleep", "600"))
    stuck = _reported(cluster, "on-node-01", "node-01's pod waiting")
    assert stuck["status"]["phase"] == "Pending"
    assert _state(stuck)["waiting"]["reason"] == "ImagePullBackOff"
    slow = _reported(cluster, "on-node-02", "node-02's pod creating")  # each node's kubelet in its own time
    assert slow["status"]["phase"] == "Pending"
    assert _state(slow)["waiting"]["reason"] == "ContainerCreating"
    eventually(_phase(cluster, "on-node-02", "Running"), what="node-02's pod running after its pull")
    failed = eventually(_phase(cluster, "on-node-03", "Failed"), what="node-03's pod failing")
    assert _state(failed)["terminated"]["exitCode"] == 3


def test_a_job_deadline_counts_the_image_pull_and_stops_the_program(k8s_cluster: MakeCluster) -> None:
    cluster = k8s_cluster(nodes=4, racks=2, behaviours={"node-01": NodeBehaviour(start_delay_s=60)})
    stopped = threading.Event()

    def runs_until_stopped(process: PodProcess) -> int:
        process.stopped.wait()
        stopped.set()
        return 143

    assert cluster.kubelet is not None
    cluster.kubelet.register(("serve",), runs_until_stopped)
    port = cluster.port()
    port.create_object(group_job("pulling", ["node-01"], deadline=1))
    port.create_object(group_job("running", ["node-00"], deadline=1, command=("serve",)))
    for name in ("pulling", "running"):
        job = eventually(
            lambda name=name: (
                "Failed" in conditions(job := port.get_object("batch/v1", "Job", name, "dsx")) and job
            ),
            what=f"{name} failing at its deadline",
        )
        assert conditions(job)["Failed"]["reason"] == "DeadlineExceeded"
        assert job_pods(cluster.emulator, name) == []
    assert stopped.is_set()


def test_a_group_job_completes_when_every_pod_ends_well(k8s_cluster: MakeCluster) -> None:
    cluster = k8s_cluster(nodes=4, racks=2)
    port = cluster.port()
    port.create_object(
        group_job("quick", ["node-00", "node-01", "node-02"], command=("sleep", "0.2"), deadline=30)
    )
    job = eventually(
        lambda: "Complete" in conditions(job := port.get_object("batch/v1", "Job", "quick", "dsx")) and job,
        what="the Job completing",
    )
    assert (job["status"]["succeeded"], job["status"]["completedIndexes"]) == (3, "0-2")


def test_a_deleted_pod_gets_its_grace_period_then_is_killed(k8s_cluster: MakeCluster) -> None:
    cluster = k8s_cluster(nodes=2, racks=1)
    assert cluster.kubelet is not None
    told = threading.Event()

    def stubborn(process: PodProcess) -> int:
        process.stopped.wait()
        told.set()
        process.killed.wait()  # ignores SIGTERM
        return 0

    cluster.kubelet.register(("stubborn",), stubborn)
    port = cluster.port()
    port.create_object(_pod("polite", "node-00", "sleep", "600"))
    stubborn_pod = _pod("stubborn", "node-01", "stubborn")
    stubborn_pod["spec"]["terminationGracePeriodSeconds"] = 2
    port.create_object(stubborn_pod)
    for name in ("polite", "stubborn"):
        eventually(_phase(cluster, name, "Running"), what=f"{name} running")
    assert port.delete_object("v1", "Pod", "polite", "dsx") is True
    eventually(
        lambda: cluster.emulator.get("pods", "polite", "dsx") is None, what="polite gone after SIGTERM"
    )
    assert port.delete_object("v1", "Pod", "stubborn", "dsx") is True
    held = cluster.emulator.get("pods", "stubborn", "dsx")
    assert held is not None and held["metadata"]["deletionGracePeriodSeconds"] == 2
    assert held["status"]["phase"] == "Running"  # terminating: still holds its node
    eventually(told.is_set, what="SIGTERM")
    eventually(lambda: cluster.emulator.get("pods", "stubborn", "dsx") is None, what="stubborn killed")


@pytest.mark.story
def test_groups_that_compete_for_the_same_gpus_fail_at_their_deadline(k8s_cluster: MakeCluster) -> None:
    """Issue 9's third point on the emulator: node checks, rack groups and the whole set started at once
    each ask for every GPU of their nodes; the deadline counts from the start, so the groups that wait
    for GPUs fail."""
    # A node's test takes 3 s of its 5 s deadline (room for a loaded machine); a rack's, started once
    # the node tests free the GPUs, cannot end before 6 s.
    cluster = k8s_cluster(nodes=8, racks=2)
    port = cluster.port()
    nodes = [f"node-{i:02d}" for i in range(8)]
    names = [f"node-{n}" for n in nodes] + ["rack-0", "rack-1", "all"]
    for node in nodes:
        port.create_object(group_job(f"node-{node}", [node], command=("sleep", "3"), deadline=5))
    for rack in range(2):
        port.create_object(
            group_job(f"rack-{rack}", nodes[rack * 4 : rack * 4 + 4], command=("sleep", "3"), deadline=5)
        )
    port.create_object(group_job("all", nodes, command=("sleep", "3"), deadline=5))

    def endings() -> dict[str, str] | None:
        found = {}
        for name in names:
            got = conditions(port.get_object("batch/v1", "Job", name, "dsx"))
            ending = next((got[k].get("reason", "") for k in ("Complete", "Failed") if k in got), None)
            if ending is None:
                return None
            found[name] = ending
        return found

    result = eventually(endings, what="every Job ending")
    assert {result[f"node-{n}"] for n in nodes} == {"CompletionsReached"}
    assert {result["rack-0"], result["rack-1"], result["all"]} == {"DeadlineExceeded"}


RANK_ARGS = [
    "--backend", "nccl", "--min-bytes", "1KiB", "--max-bytes", "4KiB", "--factor", "2",
    "--warmup", "1", "--iters", "2", "--timeout", "60", "--out", "/tmp/dsx-out/result.json",
]  # fmt: skip


def _state_configmap(name: str) -> dict[str, Any]:
    """The state ConfigMap a group test's step creates before its Job; rank 0 only patches it."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "dsx"}}


def _rank_job(name: str, members: list[str], *extra: str) -> dict[str, Any]:
    command = (
        "python", "-m", "steps.readiness.launchers.rankpod",
        "--publish", name, "--result", "/tmp/dsx-out/result.json",
        "--nnodes", str(len(members)), "--nproc-per-node", "8",
        "--master-addr", f"{name}-0.{name}", "--master-port", "29500",
        "--", "steps.readiness.ranks.sweep", *RANK_ARGS, *extra,
    )  # fmt: skip
    return group_job(name, members, command=command, deadline=240)


@pytest.mark.story
def test_rank_pods_play_their_group_and_rank_zero_publishes_the_result(k8s_cluster: MakeCluster) -> None:
    cluster = k8s_cluster(nodes=4, racks=2)
    port = cluster.port()
    port.create_object(_state_configmap("sweep-r0"))
    port.create_object(headless_service("sweep-r0"))
    port.create_object(_rank_job("sweep-r0", ["node-02", "node-03"]))
    job = eventually(
        lambda: (
            set(conditions(job := port.get_object("batch/v1", "Job", "sweep-r0", "dsx")))
            & {"Complete", "Failed"}
            and job
        ),
        timeout=240,
        what="the rank Job ending",
    )
    state = port.get_state("sweep-r0")
    assert state["exit-code"] == "0", state
    run = CollectiveRun.model_validate_json(state["result.json"])
    assert run.hosts == ["node-02", "node-03"]
    assert "Complete" in conditions(job)


@pytest.mark.story
def test_a_failed_group_run_ends_the_other_pods_and_rank_zero_still_publishes(
    k8s_cluster: MakeCluster,
) -> None:
    cluster = k8s_cluster(nodes=4, racks=2)
    port = cluster.port()
    port.create_object(_state_configmap("failing"))
    port.create_object(headless_service("failing"))
    port.create_object(_rank_job("failing", ["node-00", "node-01"], "--inject", "1:fail"))
    job = eventually(
        lambda: "Failed" in conditions(job := port.get_object("batch/v1", "Job", "failing", "dsx")) and job,
        timeout=240,
        what="the rank Job failing",
    )
    assert conditions(job)["Failed"]["reason"] == "BackoffLimitExceeded"
    # Rank 0 published, within its grace period if its pod was the one deleted.
    state = eventually(lambda: port.get_state("failing"), what="rank 0's result")
    assert state["exit-code"] == "1" and "rank 0 wrote no result" in state["result.json"]
    left = {
        p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]: p
        for p in job_pods(cluster.emulator, "failing")
    }
    # The pod that failed first stays; the Job controller deleted any other still active when the Job
    # failed. Which one failed first, and whether the other failed too before the controller saw the
    # first, is the race of two processes: no pod is left running either way.
    assert left and {p["status"]["phase"] for p in left.values()} == {"Failed"}, left


def test_rank_pods_without_their_headless_service_fail_and_say_why(k8s_cluster: MakeCluster) -> None:
    cluster = k8s_cluster(nodes=4, racks=2)
    port = cluster.port()
    port.create_object(_state_configmap("lonely"))
    # One member: with two, the Job fails at whichever pod fails first and deletes the other while it runs
    # (backoffLimit 0), rank 0's pod with it when rank 1 is first, as the real Job controller does.
    port.create_object(_rank_job("lonely", ["node-00"]))
    job = eventually(
        lambda: "Failed" in conditions(job := port.get_object("batch/v1", "Job", "lonely", "dsx")) and job,
        what="the rank Job failing",
    )
    assert conditions(job)["Failed"]["reason"] == "BackoffLimitExceeded"
    state = port.get_state("lonely")
    assert state["exit-code"] == "1" and "rank 0 wrote no result" in state["result.json"]
    (rank0,) = [p for p in job_pods(cluster.emulator, "lonely") if p["metadata"]["labels"][
        "batch.kubernetes.io/job-completion-index"] == "0"]  # fmt: skip
    assert _state(rank0)["terminated"]["message"] == (
        "torchrun: cannot resolve lonely-0.lonely: no Service dsx/lonely"
    )

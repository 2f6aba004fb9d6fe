"""The emulated API server against the real one: the same request, the same answer.

Each scenario runs on :class:`tests.emulator.apiserver.Emulator` and on the real control plane, and the test
compares what each said. Where they differ, the double changes.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from steps.cluster import ClusterPort, connect, holds, load_fleet
from steps.cluster import vocabulary as vocab
from steps.cluster.kube import KubeCluster, load_api_client
from tests.e2e.cluster import Cluster
from tests.e2e.conftest import RealCluster
from tests.emulator.apiserver import POD_SECURITY_ENFORCE, Emulator, ManualClock, write_kubeconfig
from tests.pods import bare_pod, rank_pod

pytestmark = pytest.mark.e2e


def _answers(core: client.CoreV1Api, namespace: str, dry_run: str | None) -> dict[str, Any]:
    """What the server says to a restricted namespace, a bare pod and a rank pod in it."""
    core.create_namespace({"metadata": {"name": namespace, "labels": {POD_SECURITY_ENFORCE: "restricted"}}})
    deadline = time.monotonic() + 30
    while (
        dry_run and time.monotonic() < deadline
    ):  # the service-account controller makes "default" soon after
        try:
            core.read_namespaced_service_account("default", namespace)
            break
        except ApiException:
            time.sleep(0.2)
    answers: dict[str, Any] = {}
    for name, pod in (("bare", bare_pod()), ("rank", rank_pod(namespace))):
        try:
            if dry_run:
                core.create_namespaced_pod(namespace, pod, dry_run=dry_run)
            else:
                core.create_namespaced_pod(namespace, pod)
            answers[name] = "created"
        except ApiException as exc:
            answers[name] = (exc.status, json.loads(exc.body)["message"])
    return answers


def test_pod_security_restricted_refuses_and_admits_the_same_pods(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    namespace = f"psa-{uuid.uuid4().hex[:8]}"
    real_api, _ = load_api_client(str(real_cluster.kubeconfig))
    try:
        real = _answers(client.CoreV1Api(real_api), namespace, dry_run="All")
    finally:
        client.CoreV1Api(real_api).delete_namespace(namespace)
    with Emulator() as emulator:
        fake_api, _ = load_api_client(str(write_kubeconfig(tmp_path / "kubeconfig", emulator.url)))
        emulated = _answers(client.CoreV1Api(fake_api), namespace, dry_run=None)
    assert real["rank"] == "created", real
    assert real["bare"][0] == 403 and 'violates PodSecurity "restricted:latest"' in real["bare"][1]
    assert emulated == real


def _gpu_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    """A pod that asks for ``gpus`` GPUs on ``node`` (its node selector), and sleeps."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "command": ["sleep", "600"],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def _scheduled(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    """The pod's PodScheduled condition once the scheduler has written one (status, reason, message)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled":
                return {"status": condition.status, "reason": condition.reason, "message": condition.message}
        time.sleep(0.5)
    raise AssertionError(f"pod {name}: the scheduler wrote no PodScheduled condition in 60 s")


def _busy(core: client.CoreV1Api, namespace: str, node: str, gpus: int) -> dict[str, Any]:
    """A workload holds every GPU of ``node``; what the scheduler says to a test pod that wants them."""
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_pod(namespace, _gpu_pod("workload", node, gpus))
    assert _scheduled(core, namespace, "workload")["status"] == "True"
    core.create_namespaced_pod(namespace, _gpu_pod("test", node, gpus))
    return _scheduled(core, namespace, "test")


def test_a_node_whose_gpus_a_workload_holds_leaves_a_test_pod_unschedulable_alike(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    namespace = f"busy-{uuid.uuid4().hex[:8]}"
    real_api, _ = load_api_client(str(real_cluster.kubeconfig))
    nodes = client.CoreV1Api(real_api).list_node().items
    gpus = int(nodes[0].status.allocatable["nvidia.com/gpu"])
    core = client.CoreV1Api(real_api)
    try:
        real = _busy(core, namespace, "node-03", gpus)
    finally:
        core.delete_namespace(namespace)
        deadline = time.monotonic() + 120  # the GPUs are free again only once the workload is gone
        while core.list_namespaced_pod(namespace).items and time.monotonic() < deadline:
            time.sleep(1)
    with Emulator() as emulator:
        emulator.seed(
            load_fleet(f"sim:nodes={len(nodes)},gpu=h100,gpus={gpus},racks=2,workloads=false").manifests()
        )
        fake_api, _ = load_api_client(str(write_kubeconfig(tmp_path / "kubeconfig", emulator.url)))
        emulated = _busy(client.CoreV1Api(fake_api), namespace, "node-03", gpus)
    assert real["status"] == "False" and real["reason"] == "Unschedulable", real
    assert "Insufficient nvidia.com/gpu" in real["message"], real
    assert emulated == real


#: A Workflow that waits (a ``suspend`` template: no pod) until ``argo resume``: a run that holds a node.
_WAITING_RUN = {
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "Workflow",
    "metadata": {"generateName": "dsx-certify-"},
    "spec": {"entrypoint": "wait", "templates": [{"name": "wait", "suspend": {}}]},
}
_ARGO = ("argoproj.io", "v1alpha1", "workflows")


def _phase(custom: client.CustomObjectsApi, namespace: str, name: str, phases: set[str]) -> str:
    """The Workflow's phase once it is one of ``phases`` (the real controller takes a moment)."""
    deadline = time.monotonic() + 60
    phase = ""
    while time.monotonic() < deadline:
        workflow = custom.get_namespaced_custom_object(*_ARGO[:2], namespace, _ARGO[2], name)
        phase = str((workflow.get("status") or {}).get("phase") or "")
        if phase in phases:
            return phase
        time.sleep(0.5)
    raise AssertionError(f"Workflow {namespace}/{name}: phase {phase!r}, not one of {sorted(phases)} in 60 s")


def _holds(
    api: Any, namespace: str, run: Callable[[str, str], None], finish: Callable[[str, str], None]
) -> list[str]:
    """A run's Workflow holds a node's Lease; another run tries to take the node while that Workflow runs,
    once it finished, and once it is deleted. What dsx's holds decided each time."""
    custom = client.CustomObjectsApi(api)
    port = KubeCluster(api, namespace=namespace)
    created = custom.create_namespaced_custom_object(*_ARGO[:2], namespace, _ARGO[2], _WAITING_RUN)
    name, uid = created["metadata"]["name"], created["metadata"]["uid"]
    run(namespace, name)
    holder = holds.run_holder(namespace, name, uid)
    holds.take(port, holder, ["node-03"], 3600, "the test")
    said: list[str] = []

    def another(attempt: int) -> None:
        other = holds.run_holder(namespace, f"dsx-certify-other-{attempt}", f"uid-{attempt}")
        try:
            holds.take(port, other, ["node-03"], 3600, "another run")
        except holds.NodeHeldError as exc:
            said.append(f"refused ({exc.holder == holder})")
            return
        said.append(f"taken (holder {holds.lease_holder(port, 'node-03') == other})")
        holds.release(port, other, ["node-03"])
        holds.take(port, holder, ["node-03"], 3600, "the test")  # as it was, for the next attempt

    another(1)
    finish(namespace, name)
    said.append(_phase(custom, namespace, name, {"Succeeded", "Failed", "Error"}))
    another(2)
    custom.delete_namespaced_custom_object(*_ARGO[:2], namespace, _ARGO[2], name)
    another(3)
    return said


def test_a_hold_whose_workflow_finished_or_went_is_taken_over_alike(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    """The real workflow-controller runs a Workflow that waits; ``argo resume`` finishes it. The emulated
    API server stores Workflows as any custom resource, and the test writes the phases Argo's controller
    would. dsx's holds see a live holder refuse, and a finished or deleted one taken over, on both."""
    namespace = f"holds-{uuid.uuid4().hex[:8]}"
    real_api, _ = load_api_client(str(real_cluster.kubeconfig))
    core = client.CoreV1Api(real_api)
    core.create_namespace({"metadata": {"name": namespace}})

    def running(namespace: str, name: str) -> None:
        _phase(client.CustomObjectsApi(real_api), namespace, name, {"Running"})

    def resume(namespace: str, name: str) -> None:
        real_cluster.argo("resume", "-n", namespace, name)

    try:
        real = _holds(real_api, namespace, running, resume)
    finally:
        core.delete_namespace(namespace)
    with Emulator() as emulator:
        fake_api, _ = load_api_client(str(write_kubeconfig(tmp_path / "kubeconfig", emulator.url)))
        custom = client.CustomObjectsApi(fake_api)

        def write_phase(phase: str) -> Callable[[str, str], None]:
            def write(namespace: str, name: str) -> None:
                body = {"status": {"phase": phase}}
                custom.patch_namespaced_custom_object(*_ARGO[:2], namespace, _ARGO[2], name, body)

            return write

        emulated = _holds(fake_api, namespace, write_phase("Running"), write_phase("Succeeded"))
    assert real == ["refused (True)", "Succeeded", "taken (holder True)", "taken (holder True)"], real
    assert emulated == real


#: The Event TTL of the second API server the expiry test starts (the session's keeps the default hour).
_EVENT_TTL_S = 20


def _event_kept(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespaced_event(name, "default")
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _recorded(port: KubeCluster, core: client.CoreV1Api) -> str:
    """dsx records an Event about node-03 as its steps do; its name."""
    before = {e.metadata.name for e in core.list_namespaced_event("default").items}
    assert port.record_event("node-03", "DsxExpiryProbe", "an Event the test watches expire")
    (name,) = {e.metadata.name for e in core.list_namespaced_event("default").items} - before
    return name


def test_an_event_outlives_its_ttl_on_neither_server(own_cluster: Cluster, tmp_path: Path) -> None:
    """A second real API server on the same etcd, with ``--event-ttl`` of 20 s: the Event dsx records
    through it is there a few seconds before its TTL and gone a few seconds after (its etcd lease, of the
    TTL and at most 5% more). The emulated API server, given the same TTL, keeps and drops it at the same
    times of its clock."""
    ttl = _EVENT_TTL_S
    admin, _ = load_api_client(str(own_cluster.kubeconfig))
    with own_cluster.apiserver(
        "kube-apiserver-event-ttl", f"--event-ttl={ttl}s", "--endpoint-reconciler-type=none"
    ) as url:
        short, _ = load_api_client(str(own_cluster.kubeconfig))
        short.configuration.host = url
        name = _recorded(KubeCluster(short), client.CoreV1Api(short))
        written = time.monotonic()
        core = client.CoreV1Api(admin)  # read through the session's API server: one store behind both
        real = [_event_kept(core, name)]
        time.sleep(max(0.0, written + ttl - 3 - time.monotonic()))
        real.append(_event_kept(core, name))
        time.sleep(max(0.0, written + ttl + 8 - time.monotonic()))
        real.append(_event_kept(core, name))
    clock = ManualClock()
    with Emulator(clock=clock, event_ttl=ttl) as emulator:
        fake, _ = load_api_client(str(write_kubeconfig(tmp_path / "kubeconfig", emulator.url)))
        core = client.CoreV1Api(fake)
        port = KubeCluster(fake, clock=lambda: dt.datetime.fromtimestamp(clock(), dt.UTC))
        name = _recorded(port, core)
        emulated = [_event_kept(core, name)]
        clock.advance(ttl - 3)
        emulated.append(_event_kept(core, name))
        clock.advance(11)
        emulated.append(_event_kept(core, name))
    assert real == [True, True, False], real
    assert emulated == real


#: How long the reboot comparison watches both nodes: the process kubelet's Ready after 20 s and cleared
#: condition 40 s after that, with room to spare.
_REBOOT_WATCH_S = 75.0


def _marked(port: ClusterPort, node: str) -> None:
    """The sentinel's fatal XID condition on ``node``, True, as the agent writes it."""
    message = "fatal (reset-gpu): XID 79 on GPU 0: GPU has fallen off the bus"
    port.set_condition(node, vocab.CONDITION_GPU_XID, True, "FatalResetGpu", message)


def _seen(port: ClusterPort, node: str, boot: str) -> tuple[bool, bool, bool, tuple[str, ...]]:
    """What dsx's repair wait reads of a rebooting node: a new boot id, Ready, its sentinel condition
    still True; and the node's taints."""
    current = port.get_node(node)
    condition = current.condition(vocab.CONDITION_GPU_XID)
    return (
        current.node_info.boot_id != boot,
        current.ready,
        condition is not None and condition.status == "True",
        tuple(sorted(f"{t.key}:{t.effect}" for t in current.taints)),
    )


def test_a_reboot_comes_back_in_the_same_stages_on_the_simulated_fleet_and_the_real_cluster(
    own_cluster: Cluster,
) -> None:
    """A node that runs no pod (node-03 when free) carries the sentinel's fatal condition and reboots: on
    the real control plane through the
    process kubelet, on the simulated fleet (``reboot-ready=20s,reboot-clear=40s``) through dsx's repair
    request. Each is watched through dsx's port until the condition clears; the stages seen are the same:
    the new boot id while NotReady (with the node lifecycle controller's not-ready taints), then Ready,
    then the condition cleared."""
    real_api, _ = load_api_client(str(own_cluster.kubeconfig))
    real = KubeCluster(real_api, namespace="gpu-ops")
    # A reboot kills the node's pods: reboot one that runs none (the Events tier's pods run somewhere).
    running = {
        p.spec.node_name
        for p in client.CoreV1Api(real_api).list_pod_for_all_namespaces().items
        if p.status.phase in ("Pending", "Running")
    }
    free = [n.name for n in real.list_nodes() if n.name not in running]
    assert free, f"every node runs a pod: {sorted(map(str, running))}"
    node = "node-03" if "node-03" in free else free[-1]
    sim = connect("sim:nodes=4,gpu=h100,repair-delay=0,reboot-ready=20s,reboot-clear=40s")
    boots = {}
    for port in (real, sim):
        _marked(port, node)
        boots[id(port)] = port.get_node(node).node_info.boot_id
    stages = {id(port): [_seen(port, node, boots[id(port)])] for port in (real, sim)}
    (own_cluster.dir / "kubelet" / "nodes" / node / "reboot").touch()
    requested = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    sim.set_annotations(node, {vocab.ANNOTATION_REPAIR_REQUESTED_AT: requested})
    deadline = time.monotonic() + _REBOOT_WATCH_S
    while time.monotonic() < deadline:
        for port in (real, sim):
            seen = _seen(port, node, boots[id(port)])
            if stages[id(port)][-1] != seen:
                stages[id(port)].append(seen)
        if all(not s[-1][2] for s in stages.values()):
            break
        time.sleep(0.5)
    # the stages dsx's repair wait reads, (new boot id, Ready, condition True), each with the taints seen
    read: dict[str, list[tuple[tuple[bool, bool, bool], set[str]]]] = {}
    for name, port in (("real", real), ("sim", sim)):
        read[name] = []
        for *stage, taints in stages[id(port)]:
            if not read[name] or read[name][-1][0] != tuple(stage):
                read[name].append((tuple(stage), set()))  # type: ignore[arg-type]
            read[name][-1][1].update(taints)
    expected = [(False, True, True), (True, False, True), (True, True, True), (True, True, False)]
    assert [stage for stage, _ in read["real"]] == expected, read
    assert [stage for stage, _ in read["sim"]] == expected, read
    # The taints: while NotReady, the node lifecycle controller's not-ready taints (NoSchedule and
    # NoExecute) on both; otherwise the same, except that the real controller may take its NoExecute taint
    # off a moment after Ready (its tainting pass), which the double does in the same write.
    taints = {name: [seen for _, seen in stages_read] for name, stages_read in read.items()}
    not_ready = {"node.kubernetes.io/not-ready:NoSchedule", "node.kubernetes.io/not-ready:NoExecute"}
    assert taints["sim"][1] == taints["real"][1] and not_ready <= taints["real"][1], read
    for sim_seen, real_seen in zip(taints["sim"], taints["real"], strict=True):
        assert sim_seen <= real_seen and real_seen - sim_seen <= not_ready, read

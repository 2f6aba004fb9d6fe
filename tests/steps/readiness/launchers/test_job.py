"""Group jobs on a cluster, through the kubernetes client against the emulated cluster.

The emulated API server runs the Job controller, the scheduler (GPU capacity, affinity, its own
messages) and the garbage collector; its kubelet double runs the pods. A rank pod's program is chosen
per test: :func:`playing` plays each index as told (fast), :func:`real_rankpod` runs the pod's own
command (``python -m steps.readiness.launchers.rankpod`` starting torchrun) on this machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import ApiUnavailableError, connect, load_fleet
from steps.cluster import vocabulary as vocab
from steps.cluster.kube import KubeCluster
from steps.errors import DsxError, InputError
from steps.readiness.checks import SweepRequest, run_sweep
from steps.readiness.launchers import jobspec
from steps.readiness.launchers.job import JobLauncher
from steps.readiness.launchers.rankpod import MAX_PACKED, PLAIN_LIMIT, publish, read_published
from steps.readiness.launchers.rankpod import main as rankpod_main
from steps.readiness.models import CollectiveRun, RankInfo, Subject
from steps.readiness.nccl_tests import parse_nccl_tests_file
from steps.readiness.outcomes import RunRef
from tests.emulator.apiserver import Emulator, ManualClock, write_kubeconfig
from tests.emulator.kubelet import RANK_POD_COMMAND, Kubelet, PodProcess, Program, RankPodArgs
from tests.paths import REPO as REPO_ROOT

NS = "gpu-ops"
UID = "0b1c2d3e-run-one"
LOGS = Path(__file__).parent.parent / "logs"
RESULT = parse_nccl_tests_file(LOGS / "new_layout_clean.txt").model_dump_json()
THRESHOLDS = {"nccl": {"allReduce": [{"size": "2MiB", "busBwGBps": 60, "scope": "multi-node"}]}}
GROUP = Subject(kind="group", name="rack-00", members=["node-01", "node-00"])


@dataclass(frozen=True)
class Options:
    namespace: str = NS
    image: str = ""


@dataclass(frozen=True)
class Plan:
    gpus_per_node: int = 8
    options: Options = field(default_factory=Options)
    run: RunRef = field(default_factory=lambda: RunRef(name="dsx-certify-x1", uid=UID, namespace=NS))


@dataclass
class Rank:
    """How one completion index's program behaves in :func:`playing`."""

    run_s: float | None = 0.05  # None: runs until its pod is deleted
    exit: int = 0
    publish: str | None = None  # index 0: the result it publishes as it exits


def playing(ranks: Callable[[int], Rank], kubeconfig: Path) -> Program:
    """A rank pod program that plays each index as ``ranks`` says; index 0 publishes as rankpod does."""

    def program(process: PodProcess) -> int:
        args = RankPodArgs.parse(process.command[len(RANK_POD_COMMAND) :])
        index = int(process.env["JOB_COMPLETION_INDEX"])
        rank = ranks(index)
        if rank.run_s is None or not process.wait(rank.run_s):
            process.stopped.wait()
            return 143
        if index == 0 and rank.publish is not None:
            result = process.kubelet.work_dir / f"{process.name}.json"
            result.write_text(rank.publish)
            port = connect("kube", kubeconfig=str(kubeconfig), namespace=process.env["DSX_NAMESPACE"])
            publish(args.publish, str(result), rank.exit, port)
        return rank.exit

    return program


def real_rankpod(folder: Path, kubeconfig: Path) -> Program:
    """Run the pod's own command on this machine: cluster addresses become localhost, NCCL gloo."""
    rendezvous = str(_free_port())

    def program(process: PodProcess) -> int:
        args = list(process.command)
        args[0] = sys.executable if args[0] == "python" else args[0]
        args[args.index("--master-addr") + 1] = "127.0.0.1"
        args[args.index("--master-port") + 1] = rendezvous
        args[args.index("--backend") + 1] = "gloo"
        result = str(folder / f"{process.name}.json")
        args = [result if a == jobspec.RESULT_FILE else a for a in args]
        env = {**process.env, "PATH": os.environ["PATH"], "PYTHONPATH": str(REPO_ROOT)}
        env["KUBECONFIG"] = str(kubeconfig)
        with open(folder / f"{process.name}.log", "wb") as log:
            child = subprocess.Popen(args, env=env, stdout=log, stderr=log)
            while child.poll() is None:
                if process.stopped.wait(0.05):
                    child.send_signal(signal.SIGTERM)  # the pod was deleted
                    return child.wait()
        return child.returncode

    return program


@dataclass
class Cluster:
    """The emulated cluster of one test: API server (its time moved by hand), kubelet double, a port."""

    emulator: Emulator
    clock: ManualClock
    kubelet: Kubelet
    kubeconfig: Path
    port: KubeCluster

    def ranks(self, ranks: Callable[[int], Rank]) -> None:
        """Play rank pods as ``ranks`` says."""
        self.kubelet.register(RANK_POD_COMMAND, playing(ranks, self.kubeconfig))


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """Four H100 nodes (two racks), the run's Workflow and the rank service account in gpu-ops."""
    for name, value in {
        "DSX_JOB_POLL_S": "0.02",
        "DSX_SCHEDULE_BUDGET_S": "5",
        "DSX_STALE_WAIT_S": "5",
        "DSX_GPU_IMAGE": "registry.example/dsx-gpu:1",
    }.items():
        monkeypatch.setenv(name, value)
    clock = ManualClock(time.time())
    emulator = Emulator(clock=clock)
    emulator.seed(load_fleet("sim:nodes=4,gpu=h100,racks=2,workloads=false").manifests())
    emulator.seed(
        [
            {
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Workflow",
                "metadata": {"name": "dsx-certify-x1", "namespace": NS, "uid": UID},
            },
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "dsx-ranks", "namespace": NS},
            },
        ]
    )
    emulator.start()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", emulator.url)
    kubelet = Kubelet(emulator, kubeconfig, tmp_path).start()
    port = connect("kube", kubeconfig=str(kubeconfig), namespace=NS)
    assert isinstance(port, KubeCluster)
    try:
        yield Cluster(emulator, clock, kubelet, kubeconfig, port)
    finally:
        kubelet.stop()
        emulator.stop()


@pytest.fixture
def port(cluster: Cluster) -> KubeCluster:
    return cluster.port


@pytest.fixture
def kubeconfig(cluster: Cluster) -> Path:
    return cluster.kubeconfig


def _left(port: KubeCluster) -> dict[str, list[str]]:
    """What is left in the namespace of the group tests' kinds."""
    kinds = (("batch/v1", "Job"), ("v1", "Pod"), ("v1", "Service"), ("v1", "ConfigMap"))
    return {kind: [o["metadata"]["name"] for o in port.list_objects(api, kind, NS)] for api, kind in kinds}


NOTHING = {"Job": [], "Pod": [], "Service": [], "ConfigMap": []}


def _sweep(port: KubeCluster, timeout_s: float = 5.0, plan: Plan | None = None, **kwargs: Any) -> Any:
    request = SweepRequest(subject=GROUP, thresholds=THRESHOLDS, scope="multi-node", timeout_s=timeout_s)
    return run_sweep(request, JobLauncher.for_plan(plan or Plan(), port, **kwargs))


# ----------------------------------------------------------------------------- rendering


def test_rank_pods_follow_the_rankpod_contract_with_shared_memory_and_an_outer_deadline() -> None:
    settings = jobspec.settings_for(Plan(options=Options(image="registry.example/dsx-gpu:2")))
    assert (settings.image, settings.service_account) == ("registry.example/dsx-gpu:2", "dsx-ranks")
    owner = [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "dsx-certify-x1", "uid": UID}]
    group = jobspec.render_group_job(
        "allreduce-sweep",
        GROUP,
        "steps.readiness.ranks.sweep",
        ["--max-bytes", "8GiB"],
        settings,
        120,
        owner_references=owner,
    )
    name = group.name
    for manifest in (group.state, group.service, group.job):
        meta = manifest["metadata"]
        assert (meta["name"], meta["namespace"]) == (name, NS)
        assert meta["labels"][vocab.LABEL_CERTIFICATION_RUN] == UID
        assert meta["labels"][vocab.LABEL_GROUP_TEST] == name
        assert meta["ownerReferences"] == owner
        assert meta["annotations"][vocab.ANNOTATION_MEMBERS] == "node-00,node-01"
    spec = group.job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert spec["backoffLimitPerIndex"] == 0 and "backoffLimit" not in spec
    assert spec["activeDeadlineSeconds"] == 900 + 120 + 60  # scheduling budget + run deadline + grace
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "dsx-ranks" and pod["subdomain"] == name
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "steps.readiness.launchers.rankpod"]
    assert container["args"] == [
        "--publish", name, "--result", "/tmp/dsx-out/result.json", "--nnodes", "2", "--nproc-per-node", "8",
        "--master-addr", f"{name}-0.{name}", "--master-port", "29500",
        "--", "steps.readiness.ranks.sweep", "--max-bytes", "8GiB",
    ]  # fmt: skip
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert group.service["spec"]["selector"] == {vocab.LABEL_GROUP_TEST: name}
    assert "data" not in group.state  # rank 0 fills it


def test_a_pod_patch_shapes_the_rank_pod_template() -> None:
    def profile(template: dict[str, Any]) -> dict[str, Any]:
        spec = template["spec"]
        spec["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] = "4"
        spec["priorityClassName"] = "gpu-certification"
        template["metadata"]["annotations"] = {"k8s.v1.cni.cncf.io/networks": "rdma-net"}
        return template

    settings = jobspec.settings_for(Plan(options=Options(image="registry.example/dsx-gpu:2")))
    group = jobspec.render_group_job("t", GROUP, "m", [], settings, 60, pod_patch=profile)
    pod = group.job["spec"]["template"]["spec"]
    assert group.job["spec"]["template"]["metadata"]["annotations"] == {
        "k8s.v1.cni.cncf.io/networks": "rdma-net"
    }
    assert pod["priorityClassName"] == "gpu-certification"
    assert pod["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "4",
    }


def test_names_carry_the_run_and_stay_short_enough_for_pod_host_names() -> None:
    long = Subject(kind="group", name="rack-" + "x" * 80, members=["node-00", "node-01"])
    one = jobspec.job_name(UID, "allreduce-sweep", long)
    assert len(one) <= 52 and one.startswith("dsx-allreduce-sweep-rack-xx")
    assert jobspec.job_name("another-run", "allreduce-sweep", long) != one
    assert jobspec.job_name(UID, "allreduce-sweep", long.model_copy(update={"members": ["node-02"]})) != one
    assert jobspec.job_name(UID, "allreduce-sweep", long) == one


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSX_GPU_IMAGE", raising=False)
    with pytest.raises(InputError, match=r"group jobs need a GPU image: .*DSX_GPU_IMAGE"):
        jobspec.settings_for(Plan())
    monkeypatch.setenv("DSX_GPU_IMAGE", "registry.example/dsx-gpu:3")
    monkeypatch.setenv("DSX_RANK_SERVICE_ACCOUNT", "ranks")
    monkeypatch.setenv("DSX_SCHEDULE_BUDGET_S", "30")
    settings = jobspec.settings_for(Plan())
    assert (settings.image, settings.service_account, settings.schedule_budget_s) == (
        "registry.example/dsx-gpu:3",
        "ranks",
        30.0,
    )
    monkeypatch.setenv("DSX_SCHEDULE_BUDGET_S", "soon")
    with pytest.raises(InputError, match="DSX_SCHEDULE_BUDGET_S='soon' is not a number of seconds"):
        jobspec.settings_for(Plan())


# ----------------------------------------------------------------------------- rankpod


FAKE_RANK = """
import json, os, signal, sys, time
out = sys.argv[sys.argv.index("--out") + 1]
if sys.argv[1] == "sleep":
    def stop(signum, frame):
        open(f"{out}.stopped-{os.environ['RANK']}", "w").close()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    open(f"{out}.started-{os.environ['RANK']}", "w").close()
    time.sleep(120)
if os.environ["RANK"] == "0":
    with open(f"{out}.part", "w") as handle:
        json.dump({"world": os.environ["WORLD_SIZE"], "node_rank": os.environ["GROUP_RANK"]}, handle)
    os.replace(f"{out}.part", out)
else:
    # torchrun stops every rank once one fails: the others leave only after rank 0 wrote its result
    deadline = time.monotonic() + 60
    while not os.path.exists(out) and time.monotonic() < deadline:
        time.sleep(0.05)
sys.exit(int(sys.argv[1]))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rankpod(
    tmp_path: Path, kubeconfig: Path, index: int, mode: str, name: str = "state"
) -> subprocess.Popen[str]:
    (tmp_path / "fake_rank.py").write_text(textwrap.dedent(FAKE_RANK))
    out = str(tmp_path / "out" / "result.json")
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{tmp_path}",
        "KUBECONFIG": str(kubeconfig),
        "DSX_CLUSTER": "kube",
        "DSX_NAMESPACE": NS,
        "JOB_COMPLETION_INDEX": str(index),
    }
    args = ["--publish", "state", "--result", out, "--nnodes", "1", "--nproc-per-node", "2"]
    args += [
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        "--",
        "fake_rank",
        mode,
        "--out",
        out,
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "steps.readiness.launchers.rankpod", *args],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )


def _state_configmap(port: KubeCluster, name: str = "state") -> None:
    port.create_object({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}})


@pytest.mark.story
def test_rank_zero_publishes_its_result_and_torchruns_exit_code_into_the_existing_state(
    port: KubeCluster, kubeconfig: Path, tmp_path: Path
) -> None:
    _state_configmap(port)
    ran = _rankpod(tmp_path, kubeconfig, 0, "3")
    assert ran.wait(120) == 1  # torchrun's own code for a failed rank
    state = port.get_state("state")
    assert state["exit-code"] == "1"
    assert json.loads(state["result.json"]) == {"world": "2", "node_rank": "0"}


def test_publishing_updates_the_state_the_step_made_and_never_creates_one(
    port: KubeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _state_configmap(port)
    assert publish("state", str(tmp_path / "absent.json"), 2, port) is True
    state = port.get_state("state")
    assert state["exit-code"] == "2" and "result.json" not in state
    assert state["error"].startswith(f"rank 0 wrote no result at {tmp_path / 'absent.json'}: ")
    assert publish("never-made", str(tmp_path / "absent.json"), 0, port) is False
    assert "state ConfigMap gpu-ops/never-made is gone (the step stopped waiting)" in capsys.readouterr().err
    assert port.get_object("v1", "ConfigMap", "never-made", NS) is None


def _large_run(ranks: int) -> str:
    """The clean log's run as a group of ``ranks`` ranks reports it (one record per rank)."""
    run = CollectiveRun.model_validate_json(RESULT)
    infos = [
        RankInfo(
            rank=r, host=f"node-{r // 8:04d}", device=r % 8, bus_id=f"0000:{r % 8:02x}:00.0", pid=1000 + r
        )
        for r in range(ranks)
    ]
    return run.model_copy(update={"ranks": infos}).model_dump_json()


def test_a_large_groups_result_travels_compressed_and_one_too_large_is_an_error(
    port: KubeCluster, tmp_path: Path
) -> None:
    _state_configmap(port)
    big = _large_run(8192)  # 1024 nodes of 8 GPUs
    assert len(big) > PLAIN_LIMIT
    (tmp_path / "big.json").write_text(big)
    assert publish("state", str(tmp_path / "big.json"), 0, port) is True
    stored = port.get_object("v1", "ConfigMap", "state", NS)
    assert stored is not None and "result.json" not in stored["data"]
    assert read_published(stored) == {"exit-code": "0", "result.json": big}
    (tmp_path / "noise.json").write_bytes(os.urandom(MAX_PACKED + 1))
    assert publish("state", str(tmp_path / "noise.json"), 0, port) is True
    state = read_published(port.get_object("v1", "ConfigMap", "state", NS))
    assert state["error"].startswith("rank 0's result takes ")
    assert state["error"].endswith(f"bytes compressed, more than the state ConfigMap holds ({MAX_PACKED})")


@pytest.mark.story
def test_rankpod_passes_sigterm_to_torchrun_and_publishes_nothing(
    port: KubeCluster, kubeconfig: Path, tmp_path: Path
) -> None:
    _state_configmap(port)
    ran = _rankpod(tmp_path, kubeconfig, 0, "sleep")
    out = tmp_path / "out"
    deadline = time.monotonic() + 120
    while len(list(out.glob("result.json.started-*"))) < 2:
        assert ran.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    ran.send_signal(signal.SIGTERM)
    assert ran.wait(60) != 0
    assert sorted(p.name for p in out.glob("result.json.stopped-*")) == [
        "result.json.stopped-0",
        "result.json.stopped-1",
    ]
    assert port.get_state("state") == {}
    assert "stopped by signal 15; nothing published" in (ran.stderr.read() if ran.stderr else "")


def test_rankpod_usage_errors_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "3")
    base = [
        "--publish",
        "s",
        "--result",
        "r",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--master-addr",
        "h",
        "--master-port",
        "1",
    ]
    assert rankpod_main(base) == 2  # no module
    assert rankpod_main([*base, "--", "m"]) == 2  # index 3 of 2 nodes
    assert rankpod_main(["--publish", "s", "--", "m"]) == 2


# ----------------------------------------------------------------------------- the step on a cluster


@pytest.mark.story
def test_a_sweep_job_runs_rank_pods_for_real_and_passes_leaving_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The kubelet runs the pods' own command (rankpod, torchrun, the sweep) on this machine over gloo."""
    cluster.kubelet.register(RANK_POD_COMMAND, real_rankpod(tmp_path, cluster.kubeconfig))
    request = SweepRequest(
        subject=GROUP,
        thresholds={"nccl": {"allReduce": []}},
        scope="multi-node",
        timeout_s=120,
        min_bytes="1KiB",
        max_bytes="16KiB",
        iters=2,
        warmup=1,
    )
    seen: dict[str, dict[str, Any]] = {}
    watcher = threading.Thread(target=_watch, args=(cluster.port, seen), daemon=True)
    watcher.start()
    outcome = run_sweep(request, JobLauncher.for_plan(Plan(gpus_per_node=1), cluster.port))
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]
    assert (
        outcome.result is not None and outcome.result.status == "complete" and len(outcome.result.ranks) == 2
    )
    assert _left(cluster.port) == NOTHING
    watcher.join(5)
    for kind in ("Job", "Service", "ConfigMap"):
        meta = seen[kind]["metadata"]
        assert meta["labels"][vocab.LABEL_CERTIFICATION_RUN] == UID
        assert meta["ownerReferences"][0]["uid"] == UID


def test_rank_zeros_address_is_its_pod_behind_the_headless_service(cluster: Cluster) -> None:
    """The kubelet double's rank pods (the emulator's own) resolve --master-addr as cluster DNS would:
    rank 0's host name and subdomain, behind a headless Service that selects it; then run the group."""
    request = SweepRequest(
        subject=GROUP,
        thresholds={"nccl": {"allReduce": []}},
        scope="multi-node",
        timeout_s=120,
        min_bytes="1KiB",
        max_bytes="4KiB",
        iters=2,
        warmup=1,
    )
    outcome = run_sweep(request, JobLauncher.for_plan(Plan(gpus_per_node=1), cluster.port))
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]
    assert outcome.result is not None and outcome.result.hosts == ["node-00", "node-01"]
    assert _left(cluster.port) == NOTHING


def _watch(port: KubeCluster, seen: dict[str, dict[str, Any]]) -> None:
    """Keep the first Job, Service and state ConfigMap of a group test that appear in gpu-ops."""
    deadline = time.monotonic() + 60
    while len(seen) < 3 and time.monotonic() < deadline:
        for api, kind in (("batch/v1", "Job"), ("v1", "Service"), ("v1", "ConfigMap")):
            found = port.list_objects(api, kind, NS, vocab.LABEL_GROUP_TEST)
            if found and kind not in seen:
                seen[kind] = found[0]
        time.sleep(0.01)


def _wait_for(check: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds}s for {what}"
        time.sleep(0.02)


def _running(port: KubeCluster, count: int) -> Callable[[], bool]:
    def check() -> bool:
        pods = port.list_objects("v1", "Pod", NS, vocab.LABEL_GROUP_TEST)
        return sum(1 for p in pods if p["status"].get("phase") == "Running") >= count

    return check


def _stale(port: KubeCluster, kinds: tuple[str, ...]) -> jobspec.GroupJob:
    """The objects a killed earlier try of the step left; its pods (if any) sleep until deleted."""

    def sleeping(template: dict[str, Any]) -> dict[str, Any]:
        template["spec"]["containers"][0].update(command=["sleep", "600"], args=[])
        return template

    settings = jobspec.settings_for(Plan(), port)
    group = jobspec.render_group_job(
        "allreduce-sweep", GROUP, "steps.readiness.ranks.sweep", [], settings, 5, pod_patch=sleeping
    )
    for kind in kinds:
        port.create_object({"ConfigMap": group.state, "Service": group.service, "Job": group.job}[kind])
    return group


def test_stale_objects_of_a_killed_try_are_replaced_not_a_conflict(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.ranks(lambda index: Rank(publish=RESULT))
    port = cluster.port
    stale = _stale(port, ("ConfigMap", "Service"))  # killed before it made its Job
    outcome = _sweep(port)
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]
    assert f"group test {NS}/{stale.name}: replacing what an earlier try left" in capsys.readouterr().err
    assert _left(port) == NOTHING

    _stale(port, ("ConfigMap", "Service", "Job"))  # killed while its pods held the GPUs
    _wait_for(_running(port, 2), "the stale try's pods to run")
    outcome = _sweep(port)
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]
    assert "replacing what an earlier try left (job/" in capsys.readouterr().err
    assert _left(port) == NOTHING


def test_an_object_of_the_same_name_that_dsx_did_not_make_is_left_alone(port: KubeCluster) -> None:
    name = jobspec.render_group_job(
        "allreduce-sweep", GROUP, "m", [], jobspec.settings_for(Plan(), port), 5
    ).name
    port.create_object({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}})
    with pytest.raises(DsxError, match=rf"ConfigMap {NS}/{name} exists and was not made by a dsx group test"):
        _sweep(port)
    assert _left(port) == {**NOTHING, "ConfigMap": [name]}


def test_the_run_deadline_starts_when_every_pod_runs_not_at_a_slow_image_pull(cluster: Cluster) -> None:
    for node in GROUP.members:
        cluster.kubelet.behave(node, start_delay_s=1.0)
    cluster.ranks(lambda index: Rank(run_s=0.1, publish=RESULT))
    outcome = _sweep(cluster.port, timeout_s=0.5)
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]


def test_pods_that_cannot_be_scheduled_are_unschedulable_not_a_node_failure(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node-01's GPUs are held by another pod: the group cannot start, and that is not node-01's fault."""
    cluster.emulator.seed(
        [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "other-test", "namespace": "research"},
                "spec": {
                    "nodeName": "node-01",
                    "containers": [
                        {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
                    ],
                },
                "status": {"phase": "Running"},
            }
        ]
    )
    monkeypatch.setenv("DSX_SCHEDULE_BUDGET_S", "0.5")
    cluster.ranks(lambda index: Rank(run_s=None))
    outcome = _sweep(cluster.port)
    assert outcome.status == "unschedulable"
    (verdict,) = outcome.verdicts
    name = jobspec.job_name(UID, "allreduce-sweep", GROUP)
    assert "not every pod was running within the scheduling budget of 0.5s" in verdict.message
    assert f"pod {name}-1-" in verdict.message and f"pod {name}-0-" not in verdict.message
    # node-00's GPUs went to index 0, node-01's are held by the other pod
    assert "Unschedulable: 0/4 nodes are available: 2 Insufficient nvidia.com/gpu" in verdict.message
    assert outcome.result is None
    assert _left(cluster.port) == NOTHING


def test_a_failed_index_does_not_end_the_wait_before_rank_zero_publishes(cluster: Cluster) -> None:
    cluster.ranks(lambda index: Rank(run_s=0.5, publish=RESULT) if index == 0 else Rank(run_s=0.0, exit=1))
    outcome = _sweep(cluster.port)
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]


def test_a_large_groups_result_reaches_the_step(cluster: Cluster) -> None:
    big = _large_run(8192)
    cluster.ranks(lambda index: Rank(publish=big))
    outcome = _sweep(cluster.port)
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]
    assert outcome.result is not None and len(outcome.result.ranks) == 8192


def _flaky_port(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> KubeCluster:
    """A port that tries each call twice, with no pause: a look at the state fails after two answers."""
    monkeypatch.setenv("DSX_RETRY_ATTEMPTS", "2")
    monkeypatch.setenv("DSX_RETRY_BASE_DELAY", "0")
    port = connect("kube", kubeconfig=str(cluster.kubeconfig), namespace=NS)
    assert isinstance(port, KubeCluster)
    return port


def test_an_api_server_out_of_reach_for_a_few_looks_does_not_end_the_test(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three looks at the state in a row get 503 past the port's retries: the wait looks again, and
    reads what rank 0 published meanwhile."""
    cluster.ranks(lambda index: Rank(run_s=0.5, publish=RESULT if index == 0 else None))
    port = _flaky_port(cluster, monkeypatch)
    cluster.emulator.fail(6, 503, method="GET", path="/configmaps/dsx-allreduce-sweep-")
    outcome = _sweep(port)
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]
    assert capsys.readouterr().err.count("looking again") == 3
    assert _left(cluster.port) == NOTHING


def test_an_api_server_out_of_reach_past_the_outage_budget_is_an_error_not_a_verdict(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``DSX_API_OUTAGE_S`` the wait gives up with the API's error: the step errors (an infrastructure
    error), and no verdict is made of what nobody saw. (Its objects stay while the server is away; they
    carry the run, and the next try recognises and replaces them.)"""
    monkeypatch.setenv("DSX_API_OUTAGE_S", "0.3")
    cluster.ranks(lambda index: Rank(run_s=None))
    port = _flaky_port(cluster, monkeypatch)
    cluster.emulator.fail(100_000, 503, method="GET", path="/configmaps/dsx-allreduce-sweep-")
    with pytest.raises(ApiUnavailableError, match="503"):
        _sweep(port, timeout_s=0.1)


def test_a_run_that_never_publishes_after_all_pods_run_is_a_hang(cluster: Cluster) -> None:
    cluster.ranks(lambda index: Rank(run_s=None))
    outcome = _sweep(cluster.port, timeout_s=0.3)
    assert outcome.status == "hang"
    assert "did not finish within 0.3s of all its pods running" in outcome.verdicts[0].message
    assert _left(cluster.port) == NOTHING


def test_the_jobs_own_deadline_counts_from_its_start_and_ends_a_run_without_a_result(
    cluster: Cluster,
) -> None:
    """The Job's activeDeadlineSeconds is the outer bound: scheduling budget + run deadline + grace."""
    cluster.ranks(lambda index: Rank(run_s=None))

    def expire() -> None:
        _wait_for(_running(cluster.port, 2), "the group's pods to run")
        cluster.clock.advance(5 + 60 + jobspec.JOB_GRACE_S + 1)
        cluster.emulator.settle()

    clock = threading.Thread(target=expire, daemon=True)
    clock.start()
    outcome = _sweep(cluster.port, timeout_s=60)
    clock.join(5)
    assert outcome.status == "error"
    ended = "the Job ended Failed (DeadlineExceeded: Job was active longer than specified deadline)"
    assert f"{ended} without a result from rank 0" in outcome.verdicts[0].message
    assert _left(cluster.port) == NOTHING


STEP = """
from steps.cluster import connect
from steps.readiness.checks import SweepRequest, run_sweep
from steps.readiness.launchers.job import JobLauncher
from tests.steps.readiness.launchers.test_job import GROUP, Plan
run_sweep(SweepRequest(subject=GROUP, timeout_s=60), JobLauncher.for_plan(Plan(), connect()))
"""


def test_sigterm_to_the_step_deletes_its_group_job(cluster: Cluster) -> None:
    cluster.ranks(lambda index: Rank(run_s=None))
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "DSX_CLUSTER": "kube", "DSX_NAMESPACE": NS}
    env["PYTHONPATH"] = str(REPO_ROOT)
    step = subprocess.Popen([sys.executable, "-c", STEP], env=env, stderr=subprocess.PIPE, text=True)
    _wait_for(_running(cluster.port, 2), "the group's pods to run", 60)
    step.send_signal(signal.SIGTERM)
    assert step.wait(30) == 143
    assert "stopped by signal 15; deleting its objects" in (step.stderr.read() if step.stderr else "")
    assert _left(cluster.port) == NOTHING


@pytest.mark.parametrize(
    ("check", "request_"),
    [
        ("sweep", {"subject": Subject(kind="node", name="n", members=["n"]), "ranks": 2}),
        ("smoke", {"subject": Subject(kind="node", name="n", members=["n"]), "ranks": 2}),
        (
            "diag",
            {"subject": Subject(kind="node", name="n", members=["n"]), "run": "memory,memtest", "host": "h"},
        ),
    ],
)
def test_torchrun_hands_every_rank_programs_flags_to_it_as_given(
    check: str, request_: dict[str, Any]
) -> None:
    """torchrun reads the whole command line for its own options, abbreviations included: a program flag
    that starts one of them (``--run`` starts ``--run-path``) is taken as torchrun's, which then refuses
    the line. Each check's program must reach its ranks unchanged (through torchrun's own parser, as the
    kubelet double reads a rank pod's line)."""
    from steps.readiness import checks
    from tests.emulator.kubelet import torchrun_refusal

    made = {
        "sweep": lambda: checks.allreduce_sweep_check(checks.SweepRequest(**request_)),
        "smoke": lambda: checks.training_smoke_check(checks.SmokeRequest(**request_)),
        "diag": lambda: checks.diag_check(checks.DiagRequest(**request_)),
    }[check]()
    program = [*made.program.args, made.program.outputs[0][0], "/tmp/dsx-out/result.json"]
    line = RankPodArgs(
        "state", "/tmp/dsx-out/result.json", 2, 8, "rank-0.svc", 29500, made.program.module, program
    )
    assert torchrun_refusal(line) == ""

"""Group jobs on a cluster, through the kubernetes client against the emulated API server.

A :class:`Cluster` plays, over HTTP, what the cluster does with a Job: the Job controller (one pod per
completion index, the Job's end once every index has ended, a failed index not failing the Job), the
scheduler (a pod lands on its node, or stays Pending with the scheduler's reason), the kubelet (an
image pull, then the pod runs; with ``real=True`` it runs the pod's own command and passes SIGTERM on
when the pod is deleted) and the garbage collector (the pods of a deleted Job go).
"""

from __future__ import annotations

import contextlib
import copy
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

from steps.cluster import NotFoundError, load_fleet
from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ApiStatusError
from steps.cluster.kube import KubeCluster, load_api_client
from steps.cluster.resources import resource
from steps.errors import DsxError, InputError
from steps.readiness import jobs
from steps.readiness.checks import SweepRequest
from steps.readiness.models import Subject
from steps.readiness.nccl_tests import parse_nccl_tests_file
from steps.readiness.outcomes import RunRef
from steps.readiness.rankpod import main as rankpod_main
from steps.readiness.rankpod import publish
from tests.k8s_emulator import Emulator
from tests.paths import REPO as REPO_ROOT

NS = "gpu-ops"
UID = "0b1c2d3e-run-one"
INDEX = "batch.kubernetes.io/job-completion-index"
LOGS = Path(__file__).parent / "logs"
RESULT = parse_nccl_tests_file(LOGS / "new_layout_clean.txt").model_dump_json()
THRESHOLDS = {"nccl": {"allReduce": [{"size": "2MiB", "busBwGBps": 60, "scope": "multi-node"}]}}
GROUP = Subject(kind="group", name="rack-00", members=["node-01", "node-00"])
UNSCHEDULABLE = "0/4 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) didn't match affinity."


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
    """How one completion index behaves on the cluster."""

    schedulable: bool = True
    pull_s: float = 0.0
    run_s: float | None = 0.05  # None: runs until deleted
    exit: int = 0
    publish: str | None = None  # index 0: the result it publishes as it exits
    real: bool = False  # run the pod's own command


def owner_of(pod: dict[str, Any]) -> dict[str, Any]:
    return dict((pod["metadata"].get("ownerReferences") or [{}])[0])


@dataclass
class _PodRun:
    created: float
    running: float | None = None
    process: subprocess.Popen[bytes] | None = None


class Cluster:
    """The Job controller, scheduler, kubelet and garbage collector, acting through the API (see above)."""

    def __init__(self, port: KubeCluster, kubeconfig: Path, tmp: Path, ranks: Callable[[int], Rank]) -> None:
        self.port, self.kubeconfig, self.tmp, self.ranks = port, kubeconfig, tmp, ranks
        self.seen: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, _PodRun] = {}
        self.known: set[str] = set()
        self.quiet: set[str] = set()  # Jobs whose pods never end on their own
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Cluster:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for run in self.runs.values():
            if run.process is not None and run.process.poll() is None:
                run.process.kill()
                run.process.wait()
        assert not self.errors, self.errors

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # reported when the test ends
                self.errors.append(exc)
                return
            time.sleep(0.01)

    def _status(self, api: str, kind: str, name: str, status: dict[str, Any]) -> None:
        """Write through the status subresource, as controllers do; an object deleted meanwhile is fine."""
        try:
            self.port._patch(resource(api, kind), name, NS, {"status": status}, subresource="status")
        except ApiStatusError as exc:
            if exc.status != 404:
                raise

    def _tick(self) -> None:
        found = {j["metadata"]["uid"]: j for j in self.port.list_objects("batch/v1", "Job", NS)}
        for uid, job in found.items():
            if uid not in self.known:
                self.known.add(uid)
                self._start(job)
        pods = self.port.list_objects("v1", "Pod", NS)
        for name in set(self.runs) - {p["metadata"]["name"] for p in pods}:
            self._kill(name)  # the pod was deleted: the kubelet stops its container
        for pod in pods:
            owner = owner_of(pod)
            if owner.get("kind") == "Job" and owner.get("uid") not in found:
                self._collect(pod)
            elif owner.get("kind") == "Job":
                self._advance(pod)
        for job in found.values():
            mine = [p for p in pods if owner_of(p).get("uid") == job["metadata"]["uid"]]
            self._finish(job, mine)

    def _start(self, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        for api, kind in (("v1", "ConfigMap"), ("v1", "Service")):
            self.seen[kind] = self.port.get_object(api, kind, name, NS) or {}
        self.seen["Job"] = job
        template = job["spec"]["template"]
        terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        members = terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
        for index in range(job["spec"]["completions"]):
            rank = self.ranks(index)
            spec = {**copy.deepcopy(template["spec"]), "hostname": f"{name}-{index}"}
            if rank.schedulable:
                spec["nodeName"] = members[index]
                status = {
                    "phase": "Pending",
                    "conditions": [{"type": "PodScheduled", "status": "True"}],
                    "containerStatuses": [
                        {"name": "ranks", "state": {"waiting": {"reason": "ContainerCreating"}}}
                    ],
                }
            else:
                scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
                status = {"phase": "Pending", "conditions": [{**scheduled, "message": UNSCHEDULABLE}]}
            owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "controller": True}
            self.port.create_object(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{name}-{index}-{job['metadata']['uid'][:5]}",
                        "namespace": NS,
                        "labels": {**template["metadata"]["labels"], INDEX: str(index)},
                        "ownerReferences": [{**owner, "uid": job["metadata"]["uid"]}],
                    },
                    "spec": spec,
                    "status": status,
                }
            )

    def _advance(self, pod: dict[str, Any]) -> None:
        name, now = pod["metadata"]["name"], time.monotonic()
        index = int(pod["metadata"]["labels"][INDEX])
        rank, run = self.ranks(index), self.runs.setdefault(name, _PodRun(created=now))
        owner_uid = pod["metadata"]["ownerReferences"][0]["uid"]
        phase = pod["status"].get("phase")
        if phase == "Pending" and pod["spec"].get("nodeName") and now - run.created >= rank.pull_s:
            run.running = now
            if rank.real:
                run.process = self._exec(pod, index)
            self._status("v1", "Pod", name, {"phase": "Running", "containerStatuses": None})
        elif phase == "Running" and run.running is not None and owner_uid not in self.quiet:
            if run.process is not None:
                code = run.process.poll()
            elif rank.run_s is not None and now - run.running >= rank.run_s:
                code = rank.exit
                if index == 0 and rank.publish is not None:
                    data = {"result.json": rank.publish, "exit-code": str(code)}
                    with contextlib.suppress(NotFoundError):  # the step stopped waiting
                        self.port.patch_object(
                            "v1",
                            "ConfigMap",
                            pod["metadata"]["labels"][vocab.LABEL_GROUP_TEST],
                            {"data": data},
                            NS,
                        )
            else:
                code = None
            if code is not None:
                self._status("v1", "Pod", name, {"phase": "Succeeded" if code == 0 else "Failed"})

    def _exec(self, pod: dict[str, Any], index: int) -> subprocess.Popen[bytes]:
        container = pod["spec"]["containers"][0]
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{self.tmp}"}
        env.update(KUBECONFIG=str(self.kubeconfig), JOB_COMPLETION_INDEX=str(index))
        for item in container["env"]:
            env[item["name"]] = item.get("value", pod["spec"]["nodeName"])
        command = [sys.executable if c == "python" else c for c in container["command"]]
        log = open(self.tmp / f"{pod['metadata']['name']}.log", "wb")  # noqa: SIM115 - the process keeps it
        return subprocess.Popen([*command, *container["args"]], env=env, stdout=log, stderr=log, cwd=self.tmp)

    def _kill(self, name: str) -> None:
        run = self.runs.pop(name)
        if run.process is not None and run.process.poll() is None:
            run.process.send_signal(signal.SIGTERM)

    def _collect(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if pod["status"].get("phase") not in ("Succeeded", "Failed"):
            self._status("v1", "Pod", name, {"phase": "Failed"})  # the emulator would replace a live one
        self.port.delete_object("v1", "Pod", name, NS)

    def _finish(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        """Keep the Job's pod counts, and end it once every index has ended (Failed if one failed)."""
        status = job.get("status") or {}
        if status.get("conditions"):
            return
        phases = {int(p["metadata"]["labels"][INDEX]): p["status"].get("phase") for p in pods}
        counts = {
            "active": sum(1 for v in phases.values() if v not in ("Succeeded", "Failed")),
            "succeeded": sum(1 for v in phases.values() if v == "Succeeded"),
            "failed": sum(1 for v in phases.values() if v == "Failed"),
        }
        change: dict[str, Any] = {k: v for k, v in counts.items() if status.get(k, 0) != v}
        if len(phases) == job["spec"]["completions"] and not counts["active"]:
            failed = {"type": "Failed", "status": "True", "reason": "FailedIndexes"}
            ended = {**failed, "message": "Job has failed indexes"} if counts["failed"] else None
            change["conditions"] = [ended or {"type": "Complete", "status": "True"}]
        if change:
            self._status("batch/v1", "Job", job["metadata"]["name"], change)


@pytest.fixture
def port(k8s_emulator: Emulator, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> KubeCluster:
    """A port in namespace gpu-ops on a 4-node H100 fleet with the run's Workflow; fast polls."""
    k8s_emulator.seed(load_fleet("sim:nodes=4,gpu=h100,racks=2").manifests())
    k8s_emulator.seed(
        [
            {
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Workflow",
                "metadata": {"name": "dsx-certify-x1", "namespace": NS, "uid": UID},
            }
        ]
    )
    for name, value in {
        "DSX_JOB_POLL_S": "0.02",
        "DSX_SCHEDULE_BUDGET_S": "5",
        "DSX_STALE_WAIT_S": "5",
        "DSX_GPU_IMAGE": "registry.example/dsx-gpu:1",
    }.items():
        monkeypatch.setenv(name, value)
    api_client, _ = load_api_client(str(kubeconfig))
    return KubeCluster(api_client, namespace=NS)


@pytest.fixture
def cluster(
    port: KubeCluster, kubeconfig: Path, tmp_path: Path
) -> Iterator[Callable[[Callable[[int], Rank]], Cluster]]:
    started: list[Cluster] = []

    def start(ranks: Callable[[int], Rank]) -> Cluster:
        played = Cluster(port, kubeconfig, tmp_path, ranks)
        started.append(played.__enter__())
        return played

    yield start
    for played in started:
        played.__exit__()


def _left(port: KubeCluster) -> dict[str, list[str]]:
    """What is left in the namespace of the group tests' kinds."""
    kinds = (("batch/v1", "Job"), ("v1", "Pod"), ("v1", "Service"), ("v1", "ConfigMap"))
    return {kind: [o["metadata"]["name"] for o in port.list_objects(api, kind, NS)] for api, kind in kinds}


NOTHING = {"Job": [], "Pod": [], "Service": [], "ConfigMap": []}


def _sweep(port: KubeCluster, timeout_s: float = 5.0, plan: Plan | None = None, **kwargs: Any) -> Any:
    request = SweepRequest(subject=GROUP, thresholds=THRESHOLDS, scope="multi-node", timeout_s=timeout_s)
    return jobs.run_sweep_job(request, plan or Plan(), port, **kwargs)


# ----------------------------------------------------------------------------- rendering


def test_rank_pods_follow_the_rankpod_contract_with_shared_memory_and_an_outer_deadline() -> None:
    settings = jobs.settings_for(Plan(options=Options(image="registry.example/dsx-gpu:2")))
    assert (settings.image, settings.service_account) == ("registry.example/dsx-gpu:2", "dsx-ranks")
    owner = [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "dsx-certify-x1", "uid": UID}]
    group = jobs.render_group_job(
        "allreduce-sweep",
        GROUP,
        "steps.readiness.sweep",
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
    assert container["command"] == ["python", "-m", "steps.readiness.rankpod"]
    assert container["args"] == [
        "--publish", name, "--result", "/tmp/dsx-out/result.json", "--nnodes", "2", "--nproc-per-node", "8",
        "--master-addr", f"{name}-0.{name}", "--master-port", "29500",
        "--", "steps.readiness.sweep", "--max-bytes", "8GiB",
    ]  # fmt: skip
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert group.service["spec"]["selector"] == {vocab.LABEL_GROUP_TEST: name}
    assert "data" not in group.state  # rank 0 fills it


def test_a_pod_patch_shapes_the_rank_pod_spec() -> None:
    def profile(spec: dict[str, Any]) -> dict[str, Any]:
        spec["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] = "4"
        spec["priorityClassName"] = "gpu-certification"
        return spec

    settings = jobs.settings_for(Plan(options=Options(image="registry.example/dsx-gpu:2")))
    group = jobs.render_group_job("t", GROUP, "m", [], settings, 60, pod_patch=profile)
    pod = group.job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "gpu-certification"
    assert pod["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "4",
    }


def test_names_carry_the_run_and_stay_short_enough_for_pod_host_names() -> None:
    long = Subject(kind="group", name="rack-" + "x" * 80, members=["node-00", "node-01"])
    one = jobs.job_name(UID, "allreduce-sweep", long)
    assert len(one) <= 52 and one.startswith("dsx-allreduce-sweep-rack-xx")
    assert jobs.job_name("another-run", "allreduce-sweep", long) != one
    assert jobs.job_name(UID, "allreduce-sweep", long.model_copy(update={"members": ["node-02"]})) != one
    assert jobs.job_name(UID, "allreduce-sweep", long) == one


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSX_GPU_IMAGE", raising=False)
    with pytest.raises(InputError, match=r"group jobs need a GPU image: .*DSX_GPU_IMAGE"):
        jobs.settings_for(Plan())
    monkeypatch.setenv("DSX_GPU_IMAGE", "registry.example/dsx-gpu:3")
    monkeypatch.setenv("DSX_RANK_SERVICE_ACCOUNT", "ranks")
    monkeypatch.setenv("DSX_SCHEDULE_BUDGET_S", "30")
    settings = jobs.settings_for(Plan())
    assert (settings.image, settings.service_account, settings.schedule_budget_s) == (
        "registry.example/dsx-gpu:3",
        "ranks",
        30.0,
    )
    monkeypatch.setenv("DSX_SCHEDULE_BUDGET_S", "soon")
    with pytest.raises(InputError, match="DSX_SCHEDULE_BUDGET_S='soon' is not a number of seconds"):
        jobs.settings_for(Plan())


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
    with open(out, "w") as handle:
        json.dump({"world": os.environ["WORLD_SIZE"], "node_rank": os.environ["GROUP_RANK"]}, handle)
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
        [sys.executable, "-m", "steps.readiness.rankpod", *args],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )


def _state_configmap(port: KubeCluster, name: str = "state") -> None:
    port.create_object({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}})


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


def test_a_sweep_job_runs_rank_pods_for_real_and_passes_leaving_nothing(
    port: KubeCluster, cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """The kubelet runs the pods' own command (rankpod, torchrun, the sweep) on this machine over gloo."""
    rendezvous = str(_free_port())
    result = str(tmp_path / "result.json")

    def on_this_machine(spec: dict[str, Any]) -> dict[str, Any]:
        args = spec["containers"][0]["args"]
        args[args.index("--master-addr") + 1] = "127.0.0.1"
        args[args.index("--master-port") + 1] = rendezvous
        args[args.index("--nproc-per-node") + 1] = "1"
        args[args.index("--backend") + 1] = "gloo"
        spec["containers"][0]["args"] = [result if a == jobs.RESULT_FILE else a for a in args]
        return spec

    played = cluster(lambda index: Rank(real=True, run_s=None))
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
    outcome = jobs.run_sweep_job(request, Plan(gpus_per_node=1), port, pod_patch=on_this_machine)
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]
    assert outcome.run is not None and outcome.run.status == "complete" and len(outcome.run.ranks) == 2
    assert _left(port) == NOTHING
    for kind in ("Job", "Service", "ConfigMap"):
        meta = played.seen[kind]["metadata"]
        assert meta["labels"][vocab.LABEL_CERTIFICATION_RUN] == UID
        assert meta["ownerReferences"][0]["uid"] == UID


def test_stale_objects_of_a_killed_try_are_replaced_not_a_conflict(
    port: KubeCluster, cluster: Callable[..., Cluster], capsys: pytest.CaptureFixture[str]
) -> None:
    stale = jobs.render_group_job(
        "allreduce-sweep", GROUP, "steps.readiness.sweep", [], jobs.settings_for(Plan(), port), 5
    )
    played = cluster(lambda index: Rank(publish=RESULT, run_s=0.2))
    for manifest in (stale.state, stale.service, stale.job):
        created = port.create_object(manifest)
    played.quiet.add(created["metadata"]["uid"])
    deadline = time.monotonic() + 10
    while len(port.list_objects("v1", "Pod", NS)) < 2:  # the killed try's pods are running
        assert time.monotonic() < deadline
        time.sleep(0.02)
    old_job = port.get_object("batch/v1", "Job", stale.name, NS)
    assert old_job is not None
    outcome = _sweep(port)
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]
    assert played.seen["Job"]["metadata"]["uid"] != old_job["metadata"]["uid"]
    assert f"group test {NS}/{stale.name}: replacing what an earlier try left" in capsys.readouterr().err
    assert _left(port) == NOTHING


def test_an_object_of_the_same_name_that_dsx_did_not_make_is_left_alone(port: KubeCluster) -> None:
    name = jobs.render_group_job("allreduce-sweep", GROUP, "m", [], jobs.settings_for(Plan(), port), 5).name
    port.create_object({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS}})
    with pytest.raises(DsxError, match=rf"Service {NS}/{name} exists and was not made by a dsx group test"):
        _sweep(port)
    assert _left(port) == {**NOTHING, "Service": [name]}


def test_the_run_deadline_starts_when_every_pod_runs_not_at_a_slow_image_pull(
    port: KubeCluster, cluster: Callable[..., Cluster]
) -> None:
    cluster(lambda index: Rank(pull_s=1.0, run_s=0.1, publish=RESULT))
    outcome = _sweep(port, timeout_s=0.5)
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]


def test_pods_that_cannot_be_scheduled_are_unschedulable_not_a_node_failure(
    port: KubeCluster, cluster: Callable[..., Cluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSX_SCHEDULE_BUDGET_S", "0.3")
    cluster(lambda index: Rank(schedulable=index == 0, run_s=None))
    outcome = _sweep(port)
    assert outcome.status == "unschedulable"
    (verdict,) = outcome.verdicts
    assert "not every pod was running within the scheduling budget of 0.3s" in verdict.message
    name = jobs.job_name(UID, "allreduce-sweep", GROUP)
    assert f"pod {name}-1-" in verdict.message and f"Unschedulable: {UNSCHEDULABLE}" in verdict.message
    assert f"pod {name}-0-" not in verdict.message
    assert outcome.subject == GROUP and outcome.run is None
    assert _left(port) == NOTHING


def test_a_failed_index_does_not_end_the_wait_before_rank_zero_publishes(
    port: KubeCluster, cluster: Callable[..., Cluster]
) -> None:
    cluster(lambda index: Rank(run_s=0.5, publish=RESULT) if index == 0 else Rank(run_s=0.0, exit=1))
    outcome = _sweep(port)
    assert outcome.status == "pass", [v.message for v in outcome.verdicts]


def test_a_run_that_never_publishes_after_all_pods_run_is_a_hang(
    port: KubeCluster, cluster: Callable[..., Cluster]
) -> None:
    cluster(lambda index: Rank(run_s=None))
    outcome = _sweep(port, timeout_s=0.3)
    assert outcome.status == "hang"
    assert "did not finish within 0.3s of all its pods running" in outcome.verdicts[0].message
    assert _left(port) == NOTHING


def test_a_job_that_ends_without_rank_zeros_result_is_an_error_naming_how_it_ended(
    port: KubeCluster, cluster: Callable[..., Cluster]
) -> None:
    cluster(lambda index: Rank(exit=1))
    outcome = _sweep(port)
    assert outcome.status == "error"
    assert "the Job ended Failed (FailedIndexes: Job has failed indexes) without a result from rank 0" in (
        outcome.verdicts[0].message
    )


STEP = """
import sys
from steps.cluster import connect
from steps.readiness.checks import SweepRequest
from steps.readiness.jobs import run_sweep_job
from tests.steps.readiness.test_jobs import GROUP, Plan
run_sweep_job(SweepRequest(subject=GROUP, timeout_s=60), Plan(), connect())
"""


def test_sigterm_to_the_step_deletes_its_group_job(
    port: KubeCluster, cluster: Callable[..., Cluster], kubeconfig: Path
) -> None:
    cluster(lambda index: Rank(run_s=None))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "DSX_CLUSTER": "kube", "DSX_NAMESPACE": NS}
    env["PYTHONPATH"] = str(REPO_ROOT)
    step = subprocess.Popen([sys.executable, "-c", STEP], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(p["status"].get("phase") == "Running" for p in port.list_objects("v1", "Pod", NS)):
        assert step.poll() is None and time.monotonic() < deadline, step.stderr.read() if step.stderr else ""
        time.sleep(0.05)
    step.send_signal(signal.SIGTERM)
    assert step.wait(30) == 143
    assert "stopped by signal 15; deleting its objects" in (step.stderr.read() if step.stderr else "")
    assert _left(port) == NOTHING

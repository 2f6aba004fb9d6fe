"""The simulated fleet: specs, GPU labels, topology, faults, the call log, shared state files."""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import NotFoundError, connect, load_fleet, shareable
from steps.cluster import vocabulary as vocab
from steps.cluster.errors import CordonRefusedError
from steps.cluster.sim import GPU_MODELS, SimCluster
from steps.cluster.sim.gpus import cuda_for_driver
from steps.errors import InputError
from tests.paths import REPO


def _sim(spec: str) -> SimCluster:
    port = connect(spec)
    assert isinstance(port, SimCluster)
    return port


def test_short_spec_builds_named_racked_gpu_nodes() -> None:
    port = _sim("sim:nodes=64,gpu=h100,racks=8,blocks=2")
    nodes = port.list_nodes()
    assert [n.name for n in nodes][:3] == ["node-00", "node-01", "node-02"]
    assert nodes[-1].name == "node-63"
    racks = [n.labels[vocab.LABEL_RACK] for n in nodes]
    assert sorted(set(racks)) == [f"rack-{r:02d}" for r in range(8)]
    assert racks.count("rack-03") == 8
    assert {n.labels[vocab.LABEL_BLOCK] for n in nodes} == {"block-00", "block-01"}
    assert (
        nodes[0].labels[vocab.LABEL_BLOCK] == "block-00" and nodes[-1].labels[vocab.LABEL_BLOCK] == "block-01"
    )
    assert [n.name for n in _sim("sim:nodes=101").list_nodes()][-1] == "node-100"
    assert _sim("sim:nodes=101").list_nodes()[0].name == "node-000"


@pytest.mark.parametrize("key", sorted(GPU_MODELS))
def test_gpu_models_carry_the_labels_gpu_feature_discovery_sets(key: str) -> None:
    model = GPU_MODELS[key]
    node = _sim(f"sim:nodes=2,gpu={key}").get_node("node-01")
    assert node.labels["nvidia.com/gpu.product"] == model.product
    assert node.labels["nvidia.com/gpu.count"] == str(model.count)
    assert node.labels["nvidia.com/gpu.memory"] == str(model.memory_mib)
    assert node.labels["nvidia.com/cuda.driver.major"] == model.driver.split(".")[0]
    assert node.labels["nvidia.com/cuda.runtime.major"] == model.cuda.split(".")[0]
    assert node.labels["nvidia.com/cuda.driver-version.full"] == model.driver
    assert node.labels["nvidia.com/cuda.runtime-version.full"] == model.cuda == cuda_for_driver(model.driver)
    assert node.labels["kubernetes.io/arch"] == model.arch
    assert node.gpu_count == model.count
    assert node.capacity["nvidia.com/gpu"] == str(model.count)


def test_spec_sets_versions_and_gpus_per_node() -> None:
    node = _sim("sim:nodes=2,gpu=gb200,gpus=2,kubelet=v1.32.1,kernel=6.8.0-1015-nvidia").get_node("node-00")
    assert node.gpu_count == 2 and node.labels["nvidia.com/gpu.count"] == "2"
    assert node.node_info.kubelet_version == "v1.32.1"
    assert node.node_info.kernel_version == "6.8.0-1015-nvidia"
    assert node.node_info.os_image.startswith("Ubuntu")


def test_faults_change_the_health_the_other_parts_read() -> None:
    port = _sim(
        "sim:nodes=8,gpu=h100,faults=node-01:slow-nic;node-02:xid=79@3;node-02:xid=48;"
        "node-03:failing-gpu=5;node-04:not-ready;node-05:slow-nic=100;node-06:reading:pcie_gen=3;"
        "node-07:slow-nvlink=50@2;node-07:ecc=4@1"
    )
    assert port.health("node-00").healthy
    assert port.health("node-01").link_gbps == 800.0  # a quarter of 3200
    assert port.health("node-05").link_gbps == 100.0
    gpus = port.health("node-02").gpus
    assert (gpus[3].xids, gpus[0].xids) == ((79,), (48,))
    assert port.health("node-02").faults == ["xid=79@3", "xid=48"]
    assert not port.health("node-03").gpus[5].healthy
    assert port.get_node("node-03").gpu_count == 7  # the device plugin stops offering it
    assert not port.get_node("node-04").ready and not port.health("node-04").ready
    assert port.health("node-06").readings == {"pcie_gen": 3.0}
    assert port.health("node-07").gpus[2].nvlink_gbps == 50.0
    assert port.health("node-07").gpus[1].ecc_uncorrectable == 4
    port.inject("node-00", "xid=94@1")
    assert port.health("node-00").gpus[1].xids == (94,)


def test_a_node_not_ready_carries_the_node_lifecycle_controllers_not_ready_taints() -> None:
    """As Kubernetes' node lifecycle controller taints a node whose Ready is False (NoSchedule and
    NoExecute, ``node.kubernetes.io/not-ready``) and untaints it once Ready: the not-ready fault, and a
    repair's reboot while the node starts (the e2e tier compares the reboot with the real controller)."""
    import time

    not_ready = [
        ("node.kubernetes.io/not-ready", "NoSchedule"),
        ("node.kubernetes.io/not-ready", "NoExecute"),
    ]
    port = _sim("sim:nodes=2,gpu=h100,faults=node-01:not-ready,repair-delay=0,reboot-ready=0.4s")
    assert [(t.key, t.effect) for t in port.get_node("node-01").taints] == not_ready
    assert port.get_node("node-00").taints == []
    port.set_annotations("node-00", {vocab.ANNOTATION_REPAIR_REQUESTED_AT: "2026-01-01T00:00:00Z"})
    rebooting = port.get_node("node-00")
    assert not rebooting.ready and [(t.key, t.effect) for t in rebooting.taints] == not_ready
    time.sleep(0.6)
    back = port.get_node("node-00")
    assert back.ready and back.taints == []


def test_node_scoped_api_errors_hit_only_that_node() -> None:
    port = _sim("sim:nodes=4,faults=node-02:api-errors=2")
    port.get_node("node-01")
    port.get_node("node-02")  # retried past the two failures
    failures = [c for c in port.calls() if c.method.startswith("api:")]
    assert [(c.args["name"], c.error) for c in failures] == [
        ("node-02", "injected 500 for node node-02"),
        ("node-02", "injected 500 for node node-02"),
    ]


def test_cordoned_nodes_in_the_spec_were_cordoned_before_dsx() -> None:
    port = _sim("sim:nodes=4,cordoned=node-01;node-03")
    assert [n.name for n in port.list_nodes() if n.unschedulable] == ["node-01", "node-03"]
    assert port.cordon("node-03", "x").node.annotations[vocab.ANNOTATION_CORDONED_BEFORE] == "true"
    with pytest.raises(CordonRefusedError, match="a cordon made outside dsx, before dsx cordoned it"):
        port.uncordon("node-03")


def test_a_cordon_set_again_outside_dsx_after_dsx_s_was_lifted_is_not_dsx_s() -> None:
    """kubectl uncordon, then kubectl cordon, between dsx's cordon and its uncordon: the annotations
    still name alice, but managedFields say kubectl set spec.unschedulable, so dsx leaves it alone."""
    port = _sim("sim:nodes=4")
    kubectl = SimCluster(port.store, field_manager="kubectl-cordon")
    assert port.cordon("node-02", "bad NIC", by="alice").node.unschedulable_managers == ["dsx"]
    kubectl.patch_object("v1", "Node", "node-02", {"spec": {"unschedulable": None}})
    assert port.get_node("node-02").unschedulable_managers == []
    kubectl.patch_object("v1", "Node", "node-02", {"spec": {"unschedulable": True}})
    node = port.get_node("node-02")
    assert node.unschedulable_managers == ["kubectl-cordon"]
    assert node.annotations[vocab.ANNOTATION_CORDONED_BY] == "alice"  # a stale record
    with pytest.raises(CordonRefusedError, match=r"carries a cordon made outside dsx \(by kubectl-cordon\)"):
        port.uncordon("node-02", by="alice")
    bob = port.cordon("node-02", "xid 79", by="bob")  # alice's record is stale: bob records on top
    assert bob.node.annotations[vocab.ANNOTATION_CORDONED_BEFORE] == "true"
    assert bob.node.unschedulable_managers == ["kubectl-cordon"]  # the cordon stays kubectl's
    with pytest.raises(CordonRefusedError):
        port.uncordon("node-02", by="bob")
    manifest = port.get_object("v1", "Node", "node-02")
    assert manifest is not None
    assert manifest["metadata"]["managedFields"][0]["manager"] == "kubectl-cordon"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sim:nodes=4,colour=blue", "unknown key 'colour'"),
        ("sim:nodes=4,gpu=v100", "unknown GPU 'v100'"),
        ("sim:nodes=zero", "nodes"),
        ("sim:nodes=4,faults=node-09:xid=79", "node 'node-09' is not in the fleet"),
        ("sim:nodes=4,faults=node-01:melted", "expected one of slow-nic"),
        ("sim:nodes=4,faults=node-01:xid", "xid needs a value"),
        ("sim:nodes=4,faults=node-01:xid=79@9", "GPUs 0..7"),
        ("sim:nodes=4,faults=xid=79", "is not NODE:FAULT"),
        ("sim:nodes=4,racks", "is not key=value"),
        ("sim:nodes=4,faults=node-01:driver=latest", "expected a driver version such as 580.82.07"),
        ("sim:nodes=4,faults=node-01:kernel", "kernel needs a value"),
        ("sim:nodes=4,gpus=0,faults=node-01:driver=570.124.06", "the node has no GPUs"),
        ("sim:nodes=4,driver=390.157", "older than every branch the simulation knows"),
        ("sim:nodes=4,releases=gpu-operator", "is not \\[NAMESPACE/\\]NAME@VERSION"),
        ("sim:nodes=4,releases=a@1;a@2", "release a/a is given twice"),
        ("sim:nodes=4,releases=GPU_Operator@1", "is not a valid name"),
        ("sim:nodes=4,faults=node-01:flaky-nic", "flaky-nic needs a value"),
        ("sim:nodes=4,faults=node-01:flaky-nic=1.5", "flaky-nic=P needs a probability 0 < P <= 1"),
        ("sim:nodes=4,faults=node-01:hang=3", "hang takes no value"),
        ("sim:nodes=4,faults=node-01:slow-nic=1.2.3", "cannot read it as KIND"),
        ("sim:nodes=4,faults=node-01:flaky-nic=.", "cannot read it as KIND"),
        ("sim:nodes=4,faults=node-01:slow-nvlink=.@1", "cannot read it as KIND"),
        ("sim:nodes=4,faults=node-01:slow-nic=0", "slow-nic=GBPS needs GBPS > 0"),
        ("sim:nodes=4,noise=0.7", "noise: Input should be less than 0.5"),
        ("sim:nodes=4,seed=one", "seed"),
        ("sim:nodes=4,faults=node-01:slow-rail=200", "only reading and slow-rail take a name"),
        (
            "sim:nodes=4,faults=node-01:slow-rail:mlx5_9=200",
            "no InfiniBand port 'mlx5_9'; the node has mlx5_0/1",
        ),
        ("sim:nodes=4,faults=node-01:slow-rail:mlx5_1", "slow-rail needs a value"),
        ("sim:nodes=4,faults=node-01:slow-gpu=1.5", "slow-gpu=F needs a share 0 < F < 1"),
        ("sim:nodes=4,faults=node-01:slow-gpu@8", "GPUs 0..7"),
        (
            "sim:nodes=4,racks=2,switches=rack-07:slow=0.5",
            "the fleet has no rack 'rack-07' \\(rack-00, rack-01\\)",
        ),
        ("sim:nodes=4,switches=rack-00:slow=1.5", "expected slow=F \\(0 < F < 1\\), flaky=P"),
        ("sim:nodes=4,switches=rack-00:flaky", "expected slow=F"),
        ("sim:nodes=4,switches=rack-00:slow=fast", "'fast' is not a number"),
        ("sim:nodes=4,switches=rack-00", "is not RACK:FAULT"),
    ],
)
def test_bad_specs_are_input_errors_naming_the_problem(spec: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        connect(spec)


def test_fleet_file_is_read_with_file_and_line_in_errors(tmp_path: Path) -> None:
    good = tmp_path / "fleet.yaml"
    good.write_text(
        textwrap.dedent("""\
        nodes: 4
        gpu: h200
        racks: 2
        faults:
          node-01: [slow-nic, xid=79]
        api-errors: 1
    """)
    )
    port = _sim(str(good))
    assert port.get_node("node-00").gpu_product == "NVIDIA-H200"
    assert port.health("node-01").faults == ["slow-nic", "xid=79"]
    assert _sim(f"sim:{good}").list_nodes()[3].labels[vocab.LABEL_RACK] == "rack-01"

    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: 4\ngpu: h100\ncolour: blue\n")
    with pytest.raises(InputError, match=r"bad.yaml:3: unknown key 'colour'"):
        connect(str(bad))
    bad.write_text("nodes: 4\nracks: many\n")
    with pytest.raises(InputError, match=r"bad.yaml:2: racks"):
        connect(str(bad))
    bad.write_text("nodes: 4\nfaults: [\n")
    with pytest.raises(InputError, match=r"bad.yaml:3: not valid YAML"):
        connect(str(bad))
    with pytest.raises(InputError, match="cannot read the fleet file"):
        connect(str(tmp_path / "missing.yaml"))


def test_the_same_spec_gives_the_same_fleet() -> None:
    spec = "sim:nodes=16,gpu=b200,racks=4,faults=node-03:xid=79"
    assert load_fleet(spec).model_dump_json() == load_fleet(spec).model_dump_json()


def test_every_call_is_logged_with_arguments_and_result() -> None:
    port = _sim("sim:nodes=4,blocking-pdb=true")
    port.cordon("node-01", "xid 79", by="sentinel")
    port.evict("serving/gateway-7f6d5b-0")
    port.update_state("s", lambda d: {"a": "1"})
    with pytest.raises(NotFoundError):
        port.get_node("node-99")
    calls = port.calls()
    assert [c.method for c in calls] == ["cordon", "evict", "update_state", "get_node"]
    assert calls[0].args == {"node": "node-01", "reason": "xid 79", "by": "sentinel"}
    assert calls[0].result == {
        "node": "node-01",
        "unschedulable": True,
        "taints": [],
        "summary": "node-01 cordoned by sentinel: xid 79",
    }
    assert calls[1].result["outcome"] == "blocked"
    assert calls[2].args == {"name": "s", "change": "<function>"}
    assert calls[3].error is not None and calls[3].error.startswith("get_node node/node-99: not found")
    assert [c.seq for c in calls] == [1, 2, 3, 4]


def test_shareable_fleet_is_one_fleet_for_many_processes(tmp_path: Path) -> None:
    spec = shareable("sim:nodes=8,gpu=h100", tmp_path)
    assert spec == f"state:{tmp_path.resolve() / 'fleet.json'}"
    assert shareable(spec, tmp_path / "other") == spec
    assert shareable("kube", tmp_path) == "kube"
    worker = textwrap.dedent("""\
        import sys
        from steps.cluster import connect, RetryPolicy
        port = connect(sys.argv[1], retry=RetryPolicy(base_delay=0.0))
        index = int(sys.argv[2])
        port.cordon(f"node-0{index}", f"worker {index}")
        for _ in range(10):
            port.update_state("counter", lambda d: {"count": str(int(d.get("count", "0")) + 1)})
    """)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", worker, spec, str(i)], cwd=REPO, stderr=subprocess.PIPE, text=True
        )
        for i in range(4)
    ]
    for proc in workers:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    port = connect(spec)
    assert port.get_state("counter") == {"count": "40"}
    assert [n.name for n in port.list_nodes() if n.unschedulable] == [
        "node-00",
        "node-01",
        "node-02",
        "node-03",
    ]
    assert isinstance(port, SimCluster)
    assert sum(1 for c in port.calls() if c.method == "update_state") == 40


def test_version_faults_change_what_one_node_reports_as_gpu_feature_discovery_and_the_kubelet_would() -> None:
    port = _sim(
        "sim:nodes=4,gpu=h100,faults=node-03:driver=570.124.06;node-02:kernel=5.15.0-91-generic;"
        "node-02:kubelet=v1.30.8;node-01:os=Ubuntu 20.04.6 LTS;node-01:runtime=containerd://1.6.28"
    )
    old = port.get_node("node-03").labels
    assert {k: v for k, v in old.items() if k.startswith("nvidia.com/cuda.")} == {
        "nvidia.com/cuda.driver-version.full": "570.124.06",
        "nvidia.com/cuda.driver-version.major": "570",
        "nvidia.com/cuda.driver-version.minor": "124",
        "nvidia.com/cuda.driver-version.revision": "06",
        "nvidia.com/cuda.driver.major": "570",
        "nvidia.com/cuda.driver.minor": "124",
        "nvidia.com/cuda.driver.rev": "06",
        "nvidia.com/cuda.runtime-version.full": "12.8",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "8",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "8",
    }
    assert port.get_node("node-00").labels["nvidia.com/cuda.driver-version.full"] == "580.82.07"
    assert port.get_node("node-00").labels["nvidia.com/cuda.runtime-version.full"] == "13.0"
    info = port.get_node("node-02").node_info
    assert (info.kernel_version, info.kubelet_version) == ("5.15.0-91-generic", "v1.30.8")
    info = port.get_node("node-01").node_info
    assert (info.os_image, info.container_runtime_version) == ("Ubuntu 20.04.6 LTS", "containerd://1.6.28")
    assert port.get_node("node-00").node_info.kubelet_version == "v1.33.4"
    # A version skew is not a health fault: the hardware is as healthy as before.
    assert all(port.health(n).healthy for n in ("node-01", "node-02", "node-03"))

    before = port.get_node("node-00").resource_version
    port.inject("node-00", "driver=575.57.08")
    after = port.get_node("node-00")
    assert after.resource_version != before
    assert after.labels["nvidia.com/cuda.driver-version.full"] == "575.57.08"
    assert after.labels["nvidia.com/cuda.runtime-version.full"] == "12.9"


def test_fleet_wide_driver_sets_every_gpu_node_and_its_cuda_labels() -> None:
    nodes = _sim("sim:nodes=3,gpu=b200,driver=570.172.08").list_nodes()
    assert {n.labels["nvidia.com/cuda.driver-version.full"] for n in nodes} == {"570.172.08"}
    assert {n.labels["nvidia.com/cuda.driver.rev"] for n in nodes} == {"08"}
    assert {n.labels["nvidia.com/cuda.runtime.minor"] for n in nodes} == {"8"}
    assert cuda_for_driver("590.10.01") == "13.0"  # a branch newer than the table: the newest known


def _helm_release(secret: dict[str, Any]) -> dict[str, Any]:
    """What ``helm get`` reads: the Secret's data is base64 on the wire, holding base64 of gzipped JSON."""
    data = secret["data"]
    assert isinstance(data, dict)
    decoded: dict[str, object] = json.loads(
        gzip.decompress(base64.b64decode(base64.b64decode(data["release"])))
    )
    return decoded


def test_releases_are_helm_release_secrets_in_their_namespaces(tmp_path: Path) -> None:
    port = _sim("sim:nodes=2,releases=cert-manager@v1.18.2;monitoring/kube-prometheus-stack@75.15.0")
    secrets = port.list_objects("v1", "Secret", None, "owner=helm")
    assert [(s["metadata"]["namespace"], s["metadata"]["name"], s["type"]) for s in secrets] == [
        ("cert-manager", "sh.helm.release.v1.cert-manager.v1", "helm.sh/release.v1"),
        ("monitoring", "sh.helm.release.v1.kube-prometheus-stack.v1", "helm.sh/release.v1"),
    ]
    labels = secrets[1]["metadata"]["labels"]
    assert {k: labels[k] for k in ("name", "owner", "status", "version")} == {
        "name": "kube-prometheus-stack",
        "owner": "helm",
        "status": "deployed",
        "version": "1",
    }
    release = _helm_release(secrets[1])
    assert release["name"] == "kube-prometheus-stack" and release["namespace"] == "monitoring"
    assert release["version"] == 1
    assert release["info"]["status"] == "deployed"
    assert release["chart"]["metadata"]["version"] == "75.15.0"
    assert port.list_objects("v1", "Secret", "monitoring", "owner=helm,status=deployed") == [secrets[1]]
    assert port.list_objects("apps/v1", "Deployment", None, None) == []  # no images given: no workloads

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        textwrap.dedent("""\
        nodes: 2
        releases:
          - name: operator
            namespace: gpu-operator
            chart: gpu-operator
            version: v25.3.1
            status: failed
            revision: 3
            images:
              - nvcr.io/nvidia/gpu-operator:v25.3.1
              - nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04
          - argo-events@2.4.21
    """)
    )
    port = _sim(f"sim:{fleet}")
    (secret,) = port.list_objects("v1", "Secret", "gpu-operator", "owner=helm")
    assert secret["metadata"]["name"] == "sh.helm.release.v1.operator.v3"
    assert (secret["metadata"]["labels"]["status"], secret["metadata"]["labels"]["version"]) == (
        "failed",
        "3",
    )
    release = _helm_release(secret)
    assert release["chart"]["metadata"]["name"] == "gpu-operator"
    (deployment,) = port.list_objects("apps/v1", "Deployment", "gpu-operator", None)
    assert deployment["metadata"]["annotations"]["meta.helm.sh/release-name"] == "operator"
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [(c["name"], c["image"]) for c in containers] == [
        ("gpu-operator", "nvcr.io/nvidia/gpu-operator:v25.3.1"),
        ("dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"),
    ]
    assert [s["metadata"]["namespace"] for s in port.list_objects("v1", "Secret", None, "owner=helm")] == [
        "argo-events",
        "gpu-operator",
    ]

    fleet.write_text("nodes: 2\nreleases:\n  - {name: x, version: '1', status: broken}\n")
    with pytest.raises(
        InputError, match=r"fleet.yaml:2: releases.0.status: status 'broken' is not a Helm status"
    ):
        connect(str(fleet))


def test_a_short_spec_may_start_with_a_fleet_file_and_change_its_keys(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes: 4\ngpu: h200\nreleases: [gpu-operator@v25.3.4]\n")
    port = _sim(f"sim:{fleet},faults=node-03:driver=570.124.06,kubelet=v1.32.9")
    nodes = port.list_nodes()
    assert [n.labels["nvidia.com/cuda.driver-version.full"] for n in nodes] == ["580.82.07"] * 3 + [
        "570.124.06"
    ]
    assert {n.gpu_product for n in nodes} == {"NVIDIA-H200"}
    assert {n.node_info.kubelet_version for n in nodes} == {"v1.32.9"}
    assert len(port.list_objects("v1", "Secret", None, "owner=helm")) == 1
    assert port.endpoint == f"sim:{fleet},faults=node-03:driver=570.124.06,kubelet=v1.32.9"

    with pytest.raises(InputError, match=r"sim:.*fleet.yaml,nodes=many: nodes"):
        connect(f"sim:{fleet},nodes=many")
    fleet.write_text("nodes: 4\ngpu: h200\nracks: many\n")
    with pytest.raises(InputError, match=r"fleet.yaml:3: racks"):
        connect(f"sim:{fleet},nodes=2")
    with pytest.raises(InputError, match="cannot read the fleet file"):
        connect(f"sim:{tmp_path / 'missing.yaml'},nodes=2")


def test_nic_faults_reach_the_health_seam_and_leave_the_gpus_alone() -> None:
    port = _sim("sim:nodes=4,gpu=h100,faults=node-01:flaky-nic=0.25;node-02:hang;node-03:slow-nic")
    flaky, hung, slow = (port.node_report(n) for n in ("node-01", "node-02", "node-03"))
    assert (flaky.link_failure_rate, flaky.link_hangs, flaky.link_gbps) == (0.25, False, 3200.0)
    assert (hung.link_failure_rate, hung.link_hangs) == (0.0, True)
    assert slow.link_gbps == 800.0 and not slow.link_hangs
    for report in (flaky, hung, slow):
        assert all(g.healthy and g.nvlink_gbps == g.nominal_nvlink_gbps for g in report.gpus)
    assert port.health("node-02").faults == ["hang"]
    assert port.node_report("node-00").link_failure_rate == 0.0


def test_noise_and_seed_set_the_modelled_fabric_and_default_to_none() -> None:
    settings = _sim("sim:nodes=2,noise=0.03,seed=7").fabric_settings()
    assert (settings.noise, settings.seed) == (0.03, 7)
    assert _sim("sim:nodes=2").fabric_settings().noise == 0.0

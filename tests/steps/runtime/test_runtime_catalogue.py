"""The shipped catalogue: real pinned versions, every combination resolvable, thresholds per fabric."""

import itertools
import re

import pytest

from steps.runtime.catalogue import Catalogue, default_catalogue_dir, load_catalogue
from steps.runtime.criteria import ALLOWED, Criteria, parse_criteria
from steps.runtime.resolve import compute_digest, resolve


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue()


def _query(**kwargs: object) -> Criteria:
    return parse_criteria(kwargs)


def test_catalogue_ships_the_required_components_and_overlays(catalogue: Catalogue) -> None:
    required = {
        "gpu-operator",
        "network-operator",
        "cert-manager",
        "kube-prometheus-stack",
        "nvidia-dra-driver-gpu",
        "kai-scheduler",
        "kubeflow-trainer",
        "argo-workflows",
        "argo-events",
        "dsx",
    }
    assert required <= set(catalogue.components)
    criteria = {(k, v) for o in catalogue.overlays.values() for k, v in o.criteria.pinned().items()}
    for field in ("service", "accelerator", "os", "intent"):
        for value in ALLOWED[field]:
            assert (field, value) in criteria, f"no overlay for {field}={value}"


def test_every_default_version_names_its_source_in_a_comment() -> None:
    lines = (default_catalogue_dir() / "registry.yaml").read_text().splitlines()
    for index, line in enumerate(lines):
        match = re.match(r"\s+defaultVersion: (\S+)", line)
        if not match:
            continue
        version = match.group(1)
        above = index - 1
        while above >= 0 and lines[above].strip().startswith("#"):
            above -= 1
        comment = " ".join(line.strip() for line in lines[above + 1 : index])
        assert comment, f"registry.yaml:{index + 1}: no source comment above {version}"
        assert version.lstrip("v") in comment, f"registry.yaml:{index + 1}: comment does not name {version}"


def test_eks_h100_training_pins_versions_and_orders_dependencies(catalogue: Catalogue) -> None:
    result = resolve(catalogue, _query(service="eks", accelerator="h100", os="ubuntu", intent="training"))
    gpu = result.component("gpu-operator")
    assert gpu.version == "v25.3.4"
    assert gpu.values["driver"]["version"] == "580.82.07"
    assert result.component("kai-scheduler").manifests[0].name == "queues.yaml"
    assert [o.name for o in result.appliedOverlays] == [
        "base",
        "eks",
        "h100",
        "training",
        "ubuntu",
        "efa-fabric",
        "eks-h100",
    ]
    position = {name: index for index, name in enumerate(result.deploymentOrder)}
    for item in result.components:
        assert item.version, item.name
        for dep in item.dependsOn:
            assert position[dep] < position[item.name]
            assert result.component(dep).tier < item.tier
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", result.digest)
    assert compute_digest(result) == result.digest
    assert result.provenance["gpu-operator.values.driver.version"] == "components/gpu-operator/values.yaml"
    assert result.provenance["kube-prometheus-stack.values.kubeEtcd.enabled"] == "eks"


def test_every_combination_of_criteria_resolves(catalogue: Catalogue) -> None:
    digests = set()
    for service, accelerator, os_, intent, platform in itertools.product(
        ALLOWED["service"], ALLOWED["accelerator"], ALLOWED["os"], ALLOWED["intent"], ALLOWED["platform"]
    ):
        result = resolve(
            catalogue,
            _query(service=service, accelerator=accelerator, os=os_, intent=intent, platform=platform),
        )
        names = set(result.deploymentOrder)
        assert ("gpu-operator" in names) == (accelerator != "cpu")
        assert ("kubeflow-trainer" in names) == (platform == "kubeflow")
        digests.add(result.digest)
    assert len(digests) > 100  # criteria change the recipe, and the digest follows


def test_thresholds_follow_accelerator_and_fabric(catalogue: Catalogue) -> None:
    def floors(**criteria: object) -> dict[tuple[str, str], float]:
        result = resolve(catalogue, _query(**criteria))
        return {(t["scope"], t["size"]): t["busBwGBps"] for t in result.thresholds["nccl"]["allReduce"]}

    bare = floors(service="bare-metal", accelerator="h100")
    eks = floors(service="eks", accelerator="h100")
    gke = floors(service="gke", accelerator="h100")
    assert bare[("node", "1GiB")] == eks[("node", "1GiB")] == 360
    assert bare[("multi-node", "8GiB")] > eks[("multi-node", "8GiB")] > gke[("multi-node", "8GiB")]
    assert floors(accelerator="b200")[("node", "8GiB")] > bare[("node", "8GiB")]
    assert floors(accelerator="a100")[("node", "8GiB")] < bare[("node", "8GiB")]
    h200 = resolve(catalogue, _query(accelerator="h200"))
    assert h200.thresholds["training"]["peakTflops"] == 989
    assert h200.constraints["gpu"]["product"] == "H200"


def test_local_cpu_certification_judges_relatively_only(catalogue: Catalogue) -> None:
    result = resolve(catalogue, _query(service="local", accelerator="cpu", os="ubuntu", intent="training"))
    nccl = result.thresholds["nccl"]
    assert nccl["allReduce"] == []
    assert nccl["relative"]["minGroups"] >= 2
    assert "minMfu" not in result.thresholds["training"]
    assert "peakTflops" not in result.thresholds["training"]
    assert "gpu" not in result.constraints
    assert "gpu-operator" not in result.deploymentOrder


def test_gb200_brings_the_dra_driver_and_newer_kubernetes(catalogue: Catalogue) -> None:
    result = resolve(catalogue, _query(service="bare-metal", accelerator="gb200"))
    assert "nvidia-dra-driver-gpu" in result.deploymentOrder
    assert result.constraints["kubernetes"]["minVersion"] == "1.32"
    assert result.constraints["gpu"]["countPerNode"] == 4
    assert result.component("gpu-operator").dependsOn == ["kube-prometheus-stack", "network-operator"]
    assert [o.name for o in result.appliedOverlays][:3] == ["base", "rdma-fabric", "bare-metal"]


EFA = "vpc.amazonaws.com/efa"


def test_eks_on_efa_instances_deploys_the_efa_device_plugin_and_asks_for_efa(catalogue: Catalogue) -> None:
    result = resolve(catalogue, _query(service="eks", accelerator="h100", os="ubuntu", intent="training"))
    plugin = result.component("aws-efa-k8s-device-plugin")
    assert (plugin.repository, plugin.chart, plugin.version, plugin.namespace) == (
        "https://aws.github.io/eks-charts",
        "aws-efa-k8s-device-plugin",
        "v0.5.30",
        "kube-system",
    )
    assert plugin.dependsOn == ["gpu-operator"]
    assert result.component("gpu-operator").tier < plugin.tier
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in plugin.values[
        "tolerations"
    ]
    rank_pod = result.fabric["rankPod"]
    assert rank_pod["resources"] == {EFA: "32"}  # p5.48xlarge: 32 EFA interfaces
    assert {e["name"]: e["value"] for e in rank_pod["env"]} == {
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "NCCL_NET_PLUGIN": "/opt/dsx-efa/lib/libnccl-net-ofi.so",  # where the GPU image puts aws-ofi-nccl
    }
    assert result.provenance[f"fabric.rankPod.resources.{EFA}"] == "eks-h100"
    assert result.provenance["fabric.rankPod.env"] == "efa-fabric"


@pytest.mark.parametrize(
    ("accelerator", "count"), [("a100", "4"), ("h100", "32"), ("h200", "32"), ("b200", "8")]
)
def test_the_efa_count_follows_the_instance_of_each_accelerator(
    catalogue: Catalogue, accelerator: str, count: str
) -> None:
    result = resolve(catalogue, _query(service="eks", accelerator=accelerator))
    assert "aws-efa-k8s-device-plugin" in result.deploymentOrder
    assert result.fabric["rankPod"]["resources"] == {EFA: count}


@pytest.mark.parametrize(
    "criteria",
    [
        {"service": "gke", "accelerator": "h100"},
        {"service": "eks", "accelerator": "cpu"},
        {"service": "eks", "accelerator": "gb200"},
        {"service": "local", "accelerator": "cpu", "intent": "training"},
    ],
)
def test_recipes_without_efa_neither_deploy_the_plugin_nor_ask_for_efa(
    catalogue: Catalogue, criteria: dict[str, str]
) -> None:
    result = resolve(catalogue, _query(**criteria))
    assert "aws-efa-k8s-device-plugin" not in result.deploymentOrder
    assert EFA not in (result.fabric.get("rankPod") or {}).get("resources", {})


def test_rdma_fabrics_ask_for_the_network_operators_rdma_device(catalogue: Catalogue) -> None:
    for service in ("bare-metal", "aks", "oke"):
        result = resolve(catalogue, _query(service=service, accelerator="h100"))
        rank_pod = result.fabric["rankPod"]
        assert rank_pod["resources"] == {"rdma/rdma_shared_device_a": "1"}, service
        assert rank_pod["capabilities"] == ["IPC_LOCK"], service
        assert "aws-efa-k8s-device-plugin" not in result.deploymentOrder
    assert resolve(catalogue, _query(service="gke", accelerator="h100")).fabric == {}


def test_every_fabric_setting_names_its_source(catalogue: Catalogue) -> None:
    seen = 0
    for service, accelerator in itertools.product(ALLOWED["service"], ALLOWED["accelerator"]):
        fabric = resolve(catalogue, _query(service=service, accelerator=accelerator)).fabric
        rank_pod, sources = fabric.get("rankPod") or {}, fabric.get("sources") or {}
        settings = [f"resources.{name}" for name in rank_pod.get("resources", {})]
        settings += [f"env.{item['name']}" for item in rank_pod.get("env", [])]
        settings += [f"capabilities.{name}" for name in rank_pod.get("capabilities", [])]
        settings += [key for key in rank_pod if key not in ("resources", "env", "capabilities")]
        for setting in settings:
            seen += 1
            assert sources.get(setting, "").strip(), f"{service}/{accelerator}: {setting} cites no source"
            assert all(key.split(".count")[0] in settings for key in sources), f"{service}/{accelerator}"
    assert seen > 0


def test_the_clis_vocabularies_are_the_steps_own() -> None:
    """The CLI reads the runtime's names without importing pydantic; they must be the steps' own."""
    from steps.runtime.bundle import BundleFormat
    from steps.runtime.names import BUNDLE_FORMATS, SCOPES
    from workflows.cli.drift import Scope

    assert tuple(f.value for f in BundleFormat) == BUNDLE_FORMATS
    assert [s.value for s in Scope] == list(SCOPES)

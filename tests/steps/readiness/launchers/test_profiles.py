"""Rank pods reach the fabric: the recipe's profile under the operator's, written into a group Job's pods."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from steps.cluster.vocabulary import LABEL_GROUP_TEST as GROUP_LABEL
from steps.errors import InputError
from steps.readiness.launchers.jobspec import GPU_RESOURCE, JobSettings, render_group_job
from steps.readiness.launchers.profiles import (
    ENV_VAR,
    RankPodProfile,
    apply_profile,
    merge_profiles,
    parse_profile,
    profile_from_env,
    rank_pod_patch,
    recipe_profile,
)
from steps.readiness.models import Subject
from steps.readiness.outcomes import RunRef
from steps.runtime.catalogue import load_catalogue
from steps.runtime.criteria import ALLOWED, parse_criteria
from steps.runtime.resolve import resolve
from steps.runtime.tasks import resolve_recipe
from tests import yamltext
from tests.paths import shared_path

EFA = "vpc.amazonaws.com/efa"
EKS_H100 = {"service": "eks", "accelerator": "h100", "os": "ubuntu", "intent": "training"}


def _template() -> dict[str, Any]:
    """The pod template of a real group Job, as dsx renders it."""
    group = render_group_job(
        "allreduce-sweep",
        Subject(kind="group", name="rack-a", members=["node-1", "node-2"]),
        "steps.readiness.ranks.sweep",
        ["--sizes", "1GiB"],
        JobSettings(
            namespace="gpu-ops",
            image="ghcr.io/dsx-dev/dsx-gpu:0.1.0",
            service_account="sa",
            gpus_per_node=8,
            run=RunRef(name="dsx-certify-x7k2p", uid="3f1c-77ab", namespace="gpu-ops"),
        ),
        60,
    )
    return copy.deepcopy(group.job["spec"]["template"])


def _ranks(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == "ranks"]
    return container


def _env(template: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "(from field)") for e in _ranks(template)["env"]}


def _profile(**fields: Any) -> RankPodProfile:
    return parse_profile(fields, "test")


# --- apply_profile, field by field ---------------------------------------------------------------


def test_resources_go_into_limits_and_requests_beside_the_gpus() -> None:
    out = apply_profile(_template(), _profile(resources={EFA: "32", "hugepages-2Mi": "5120Mi"}))
    resources = _ranks(out)["resources"]
    assert resources["limits"] == {GPU_RESOURCE: "8", EFA: "32", "hugepages-2Mi": "5120Mi"}
    assert resources["requests"] == {EFA: "32", "hugepages-2Mi": "5120Mi"}


def test_env_is_appended_and_replaces_a_variable_of_the_same_name_where_it_stands() -> None:
    template = _template()
    _ranks(template)["env"].insert(0, {"name": "NCCL_DEBUG", "value": "WARN"})
    out = apply_profile(
        template,
        _profile(env=[{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "FI_PROVIDER", "value": "efa"}]),
    )
    names = [e["name"] for e in _ranks(out)["env"]]
    assert names == ["NCCL_DEBUG", "DSX_NAMESPACE", "DSX_CLUSTER", "DSX_NODE_NAME", "FI_PROVIDER"]
    assert _env(out)["NCCL_DEBUG"] == "INFO" and _env(out)["FI_PROVIDER"] == "efa"
    assert _env(out)["DSX_NAMESPACE"] == "gpu-ops"


def test_labels_and_annotations_go_to_the_template_metadata() -> None:
    networks = "gpu-ops/rdma-net-a,gpu-ops/rdma-net-b"
    out = apply_profile(
        _template(),
        _profile(annotations={"k8s.v1.cni.cncf.io/networks": networks}, labels={"team": "ml-infra"}),
    )
    assert out["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": networks}
    assert out["metadata"]["labels"]["team"] == "ml-infra"
    assert out["metadata"]["labels"][GROUP_LABEL].startswith("dsx-allreduce-sweep-rack-a-")
    assert "annotations" not in apply_profile(_template(), _profile())["metadata"]


def test_tolerations_are_appended_once() -> None:
    already = {"key": "nvidia.com/gpu", "operator": "Exists"}
    efa = {"key": "vpc.amazonaws.com/efa", "operator": "Exists", "effect": "NoSchedule"}
    slow = {
        "key": "spot",
        "operator": "Equal",
        "value": "true",
        "effect": "NoExecute",
        "tolerationSeconds": 30,
    }
    out = apply_profile(_template(), _profile(tolerations=[already, efa, slow]))
    tolerations = out["spec"]["tolerations"]
    assert tolerations[-2:] == [efa, slow]
    assert tolerations.count(already) == 1 and len(tolerations) == 5


def test_priority_class_node_selector_and_image_pull_secrets() -> None:
    template = _template()
    template["spec"]["imagePullSecrets"] = [{"name": "ghcr"}]
    out = apply_profile(
        template,
        _profile(
            priorityClassName="gpu-certification",
            nodeSelector={"node.kubernetes.io/instance-type": "p5en.48xlarge"},
            imagePullSecrets=["ghcr", "ngc"],
        ),
    )
    assert out["spec"]["priorityClassName"] == "gpu-certification"
    assert out["spec"]["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5en.48xlarge"}
    assert out["spec"]["imagePullSecrets"] == [{"name": "ghcr"}, {"name": "ngc"}]


def test_dev_shm_is_a_memory_backed_volume_of_16gi_unless_told_otherwise() -> None:
    out = apply_profile(_template(), RankPodProfile())
    assert out["spec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    assert _ranks(out)["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]

    template = _template()
    template["spec"]["volumes"] = [{"name": "dshm", "emptyDir": {}}, {"name": "data", "emptyDir": {}}]
    _ranks(template)["volumeMounts"] = [
        {"name": "old-shm", "mountPath": "/dev/shm"},
        {"name": "data", "mountPath": "/data"},
    ]
    out = apply_profile(template, _profile(shmSize="64Gi"))
    assert out["spec"]["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
    ]
    assert _ranks(out)["volumeMounts"] == [
        {"name": "data", "mountPath": "/data"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    rendered = _template()  # the Job renderer already gives /dev/shm its default size
    untouched = apply_profile(rendered, _profile(shmSize=None))
    assert untouched["spec"]["volumes"] == rendered["spec"]["volumes"]
    assert _ranks(untouched)["volumeMounts"] == _ranks(rendered)["volumeMounts"]


def test_capabilities_are_added_to_the_container_security_context() -> None:
    template = _template()
    _ranks(template)["securityContext"] = {"capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}
    out = apply_profile(template, _profile(capabilities=["IPC_LOCK", "IPC_LOCK", "SYS_RESOURCE"]))
    assert _ranks(out)["securityContext"] == {
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK", "SYS_RESOURCE"]},
        "runAsNonRoot": True,
    }


def test_host_network_keeps_cluster_dns_for_the_rendezvous_service() -> None:
    out = apply_profile(_template(), _profile(hostNetwork=True))
    assert out["spec"]["hostNetwork"] is True
    assert out["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "hostNetwork" not in apply_profile(_template(), _profile(hostNetwork=False))["spec"]


def test_apply_is_pure_and_deterministic() -> None:
    template = _template()
    before = copy.deepcopy(template)
    profile = _profile(
        resources={EFA: "32"},
        env=[{"name": "FI_PROVIDER", "value": "efa"}],
        labels={"team": "a"},
        capabilities=["IPC_LOCK"],
        tolerations=[{"key": "x", "operator": "Exists"}],
    )
    first, second = apply_profile(template, profile), apply_profile(template, profile)
    assert template == before
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert first is not template and first["spec"] is not template["spec"]


def test_what_dsx_sets_for_the_group_test_is_not_silently_changed() -> None:
    with pytest.raises(InputError, match=rf"label '{GROUP_LABEL}' is 'mine', but dsx sets it"):
        apply_profile(_template(), _profile(labels={GROUP_LABEL: "mine"}))
    with pytest.raises(
        InputError, match=r"resources\.limits 'nvidia\.com/gpu' is '4', but dsx sets it to '8'"
    ):
        apply_profile(_template(), _profile(resources={GPU_RESOURCE: "4"}))
    same = apply_profile(_template(), _profile(resources={GPU_RESOURCE: "8"}))  # agreeing is fine
    assert _ranks(same)["resources"]["limits"][GPU_RESOURCE] == "8"


def test_a_template_without_the_rank_container_is_refused_by_name() -> None:
    with pytest.raises(InputError, match=r"no container 'trainer' .*\(ranks\)"):
        apply_profile(_template(), RankPodProfile(), container="trainer")
    with pytest.raises(InputError, match=r"spec\.containers is not a list"):
        apply_profile({"spec": {"containers": "ranks"}}, RankPodProfile())


@pytest.mark.shared
def test_the_patched_template_is_a_valid_kubernetes_pod_template() -> None:
    import jsonschema

    schema = json.loads(shared_path("schemas", "argo-events.schema.json").read_text())
    definitions = schema["definitions"]
    definitions["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["integer", "string"]}
    definitions["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": "string"}
    for definition in definitions.values():  # strict, as the API server is about unknown fields
        if "properties" in definition:
            definition.setdefault("additionalProperties", False)
    validator = jsonschema.Draft202012Validator(
        {"definitions": definitions, "$ref": "#/definitions/io.k8s.api.core.v1.PodTemplateSpec"}
    )
    profile = _profile(
        resources={EFA: "32"},
        env=[{"name": "FI_PROVIDER", "value": "efa"}],
        annotations={"k8s.v1.cni.cncf.io/networks": "rdma-net"},
        labels={"team": "a"},
        tolerations=[{"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
        priorityClassName="high",
        capabilities=["IPC_LOCK"],
        hostNetwork=True,
        nodeSelector={"pool": "train"},
        imagePullSecrets=["ngc"],
    )
    errors = sorted(validator.iter_errors(apply_profile(_template(), profile)), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


# --- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("quantity", ["32", 32, "16Gi", "500m", "1.5Gi", ".5", "1e3", "2E", "+4", "1."])
def test_quantities_in_kubernetes_grammar_are_taken(quantity: object) -> None:
    assert _profile(shmSize=quantity).shm_size == str(quantity)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"shmSize": "16GB"}, r"^test: shmSize: '16GB' is not a Kubernetes quantity"),
        ({"shmSize": "0"}, r"^test: shmSize: '0': /dev/shm needs a positive size"),
        ({"resources": {EFA: "3.5"}}, r"^test: resources\[vpc\.amazonaws\.com/efa\]: '3\.5': .*whole number"),
        ({"resources": {EFA: "2k"}}, None),  # 2000 devices: a whole number, as Kubernetes reads it
        ({"resources": {EFA: "-1"}}, r"^test: resources\[vpc\.amazonaws\.com/efa\]: '-1' is negative"),
        ({"resources": {EFA: True}}, r"^test: resources: True is not a quantity"),
        ({"resources": {"efa": "1"}}, r"^test: resources\[efa\]: a resource without a domain must be"),
        ({"resources": {"Bad_Domain/efa": "1"}}, r"^test: resources\[Bad_Domain/efa\]: not a resource name"),
        ({"env": [{"name": "1NCCL", "value": "x"}]}, r"^test: env\[0\]\.name: '1NCCL' is not an environment"),
        ({"env": [{"name": "DSX_CLUSTER", "value": "sim"}]}, r"^test: env\[0\]\.name: .*dsx's own"),
        (
            {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
            r"^test: env: 'A' is listed twice",
        ),
        ({"env": [{"name": "A"}]}, r"^test: env\[0\]\.value: Field required"),
        ({"labels": {"team": "ml infra"}}, r"^test: labels\[team\]: value 'ml infra' must be"),
        ({"labels": {"-team": "a"}}, r"^test: labels\[-team\]: not a label key"),
        ({"labels": {"x" * 64: "a"}}, r"^test: labels\[x{64}\]: not a label key: .*at most 63"),
        ({"nodeSelector": {"a/b/c": "1"}}, r"^test: nodeSelector\[a/b/c\]: not a label key"),
        ({"annotations": {"k8s.v1.cni.cncf.io/": "x"}}, r"^test: annotations\[k8s\.v1\.cni\.cncf\.io/\]"),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, r"^test: tolerations\[0\]: .*without a key"),
        ({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}, r"Exists takes no value"),
        (
            {"tolerations": [{"key": "a", "tolerationSeconds": 5}]},
            r"tolerationSeconds needs effect NoExecute",
        ),
        ({"tolerations": [{"key": "a", "effect": "NoRun"}]}, r"^test: tolerations\[0\]\.effect: "),
        ({"priorityClassName": "High"}, r"^test: priorityClassName: 'High' is not a PriorityClass name"),
        ({"capabilities": ["ipc_lock"]}, r"^test: capabilities: 'ipc_lock' is not a Linux capability"),
        ({"imagePullSecrets": ["NGC"]}, r"^test: imagePullSecrets: 'NGC' is not a Secret name"),
        ({"hostNetwork": "maybe"}, r"^test: hostNetwork: "),
        ({"rankPods": {}}, r"^test: rankPods: Extra inputs are not permitted"),
    ],
)
def test_bad_fields_are_refused_naming_the_field(fields: dict[str, Any], message: str | None) -> None:
    if message is None:
        parse_profile(fields, "test")
        return
    with pytest.raises(InputError, match=message):
        parse_profile(fields, "test")


def test_a_profile_is_a_mapping() -> None:
    with pytest.raises(InputError, match=r"^DSX_RANK_POD: a rank pod profile is a mapping, not list"):
        parse_profile([], "DSX_RANK_POD")


# --- the operator's profile: DSX_RANK_POD ----------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "  \n", "null"])
def test_no_operator_profile_when_the_variable_is_unset_or_empty(value: str | None) -> None:
    environ = {} if value is None else {ENV_VAR: value}
    assert profile_from_env(environ) is None


def test_the_operator_profile_is_read_from_json() -> None:
    chart_value = {
        "resources": {EFA: 16},
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        "shmSize": "32Gi",
    }
    profile = profile_from_env({ENV_VAR: json.dumps(chart_value)})
    assert profile is not None
    assert profile.resources == {EFA: "16"} and profile.shm_size == "32Gi"
    assert profile.model_fields_set == {"resources", "env", "shm_size"}


def test_the_operator_profile_is_read_from_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, '{"priorityClassName": "certify"}')
    profile = profile_from_env()
    assert profile is not None and profile.priority_class_name == "certify"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"resources": {', r"^DSX_RANK_POD: not valid JSON \(line 1, column 16: .*\); set the chart value"),
        (
            '{"resources": {"vpc.amazonaws.com/efa": "lots"}}',
            r"^DSX_RANK_POD: resources\[vpc\.amazonaws\.com/efa\]",
        ),
        ('{"shm": "1Gi"}', r"^DSX_RANK_POD: shm: Extra inputs are not permitted"),
        ('["IPC_LOCK"]', r"^DSX_RANK_POD: a rank pod profile is a mapping, not list"),
    ],
)
def test_a_malformed_operator_profile_names_the_variable_and_the_field(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        profile_from_env({ENV_VAR: text})


def test_a_bad_operator_profile_fails_before_any_job_is_rendered() -> None:
    with pytest.raises(InputError, match=r"^DSX_RANK_POD: env\[0\]\.name"):
        rank_pod_patch(None, {ENV_VAR: '{"env": [{"name": "DSX_NAMESPACE", "value": "x"}]}'})


# --- merging the recipe's profile with the operator's -----------------------------------------------------


def test_the_operator_wins_field_by_field_and_maps_merge() -> None:
    recipe = _profile(
        resources={EFA: "32", "rdma/ib": "1"},
        env=[{"name": "FI_PROVIDER", "value": "efa"}, {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"}],
        annotations={"a": "recipe"},
        capabilities=["IPC_LOCK"],
        tolerations=[{"key": "recipe", "operator": "Exists"}],
        shmSize="32Gi",
        priorityClassName="recipe",
    )
    operator = _profile(
        resources={EFA: "16", "rdma/ib": None},
        env=[{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "FI_PROVIDER", "value": "efa;ofi_rxm"}],
        annotations={"b": "operator"},
        tolerations=[{"key": "operator", "operator": "Exists"}],
        hostNetwork=True,
    )
    merged = merge_profiles(recipe, operator)
    assert merged.resources == {EFA: "16"}  # the operator's count; null took rdma/ib out
    assert [(e.name, e.value) for e in merged.env] == [
        ("FI_PROVIDER", "efa;ofi_rxm"),
        ("FI_EFA_USE_DEVICE_RDMA", "1"),
        ("NCCL_DEBUG", "INFO"),
    ]
    assert merged.annotations == {"a": "recipe", "b": "operator"}
    assert [t.key for t in merged.tolerations] == ["operator"]  # a list the operator sets replaces
    assert merged.capabilities == ["IPC_LOCK"] and merged.shm_size == "32Gi"  # unset by the operator
    assert merged.priority_class_name == "recipe" and merged.host_network is True


def test_the_operator_can_take_out_what_the_recipe_asks_for() -> None:
    recipe = _profile(env=[{"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"}], capabilities=["IPC_LOCK"])
    merged = merge_profiles(
        recipe, _profile(env=[{"name": "FI_EFA_USE_DEVICE_RDMA", "value": None}], capabilities=[])
    )
    assert merged.env == [] and merged.capabilities == []
    assert merge_profiles(_profile(shmSize="8Gi"), _profile(shmSize=None)).shm_size is None


def test_without_either_profile_a_rank_pod_still_gets_a_large_dev_shm() -> None:
    merged = merge_profiles(None, None)
    assert merged == RankPodProfile() and merged.shm_size == "16Gi"
    assert merge_profiles(_profile(resources={EFA: "4"}), None).shm_size == "16Gi"


# --- the recipe's view of the fabric ------------------------------------------------------------


def test_the_eks_h100_recipe_gets_its_rank_pods_onto_efa(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSX_OUTPUT_DIR", str(tmp_path))
    summary = resolve_recipe(**EKS_H100).model_dump(mode="json")  # what the certify steps are given
    assert "aws-efa-k8s-device-plugin" in summary["deploymentOrder"]
    out = rank_pod_patch(summary, {})(_template())
    resources = _ranks(out)["resources"]
    assert resources["limits"][EFA] == resources["requests"][EFA] == "32"
    assert resources["limits"][GPU_RESOURCE] == "8"
    assert _env(out)["FI_PROVIDER"] == "efa" and _env(out)["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert out["spec"]["volumes"][-1]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}

    # On p5en.48xlarge (16 EFA interfaces) the operator overrides the count through the chart value.
    p5en = rank_pod_patch(summary, {ENV_VAR: json.dumps({"resources": {EFA: "16"}})})(_template())
    assert _ranks(p5en)["resources"]["requests"][EFA] == "16"
    assert _env(p5en)["FI_PROVIDER"] == "efa"


def test_a_recipe_without_a_fabric_asks_for_no_device() -> None:
    gke = resolve(load_catalogue(), parse_criteria({"service": "gke", "accelerator": "h100"}))
    assert recipe_profile(gke.model_dump(mode="json")) is None
    out = rank_pod_patch(gke.model_dump(mode="json"), {})(_template())
    assert _ranks(out)["resources"] == {"limits": {GPU_RESOURCE: "8"}}
    assert recipe_profile(None) is None and recipe_profile({"fabric": {}}) is None
    with pytest.raises(InputError, match=r"^recipe fabric\.rankPod: resources\[efa\]"):
        recipe_profile({"fabric": {"rankPod": {"resources": {"efa": "1"}}}})


def test_every_packaged_recipe_fabric_is_a_valid_rank_pod_profile() -> None:
    catalogue = load_catalogue()
    asked: set[str] = set()
    for service, accelerator in itertools.product(ALLOWED["service"], ALLOWED["accelerator"]):
        recipe = resolve(catalogue, parse_criteria({"service": service, "accelerator": accelerator}))
        profile = recipe_profile(recipe.model_dump(mode="json"))
        if profile is not None:
            apply_profile(_template(), merge_profiles(profile, None))
            asked |= set(profile.resources)
    assert asked == {EFA, "rdma/rdma_shared_device_a"}


def test_the_charts_default_rank_pod_profile_is_taken_and_its_empty_priority_class_overrides_nothing() -> (
    None
):
    """values.yaml's rankPods as the chart renders them into DSX_RANK_POD (``priorityClassName: ""``, empty
    meaning none): a real install's group tests failed on it before they started."""
    values = yamltext.load((Path(__file__).parents[4] / "charts" / "dsx" / "values.yaml").read_text())
    text = json.dumps({**values["rankPods"], "imagePullSecrets": []})
    operator = profile_from_env({ENV_VAR: text})
    assert operator is not None and operator.priority_class_name is None
    recipe = parse_profile({"priorityClassName": "gpu-critical"}, "recipe")
    merged = merge_profiles(recipe, operator)
    assert merged is not None and merged.priority_class_name == "gpu-critical"

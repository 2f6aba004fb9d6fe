"""The small pieces both adapters stand on: selectors, REST paths, patches, vocabulary."""

from __future__ import annotations

import pytest

from steps.cluster import vocabulary as vocab
from steps.cluster.patches import merge_patch, strategic_merge_patch
from steps.cluster.resources import plural_of, resource
from steps.cluster.selectors import matches
from steps.errors import InputError


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", True),
        ("rack=r1", True),
        ("rack==r1", True),
        ("rack!=r1", False),
        ("rack in (r1, r2),gpu", True),
        ("rack notin (r1)", False),
        ("!gpu", False),
        ("!absent,gpu=h100", True),
        ("absent!=x", True),
    ],
)
def test_label_selectors_match_as_the_api_does(selector: str, expected: bool) -> None:
    assert matches(selector, {"rack": "r1", "gpu": "h100"}) is expected


def test_malformed_selector_is_an_input_error() -> None:
    with pytest.raises(InputError, match="'a b c'"):
        matches("a b c", {})


@pytest.mark.parametrize(
    ("api_version", "kind", "name", "namespace", "path"),
    [
        ("v1", "Node", "node-01", None, "/api/v1/nodes/node-01"),
        ("v1", "ConfigMap", "state", "dsx", "/api/v1/namespaces/dsx/configmaps/state"),
        ("v1", "Secret", "s", None, "/api/v1/namespaces/default/secrets/s"),
        (
            "coordination.k8s.io/v1",
            "Lease",
            "l",
            "dsx",
            "/apis/coordination.k8s.io/v1/namespaces/dsx/leases/l",
        ),
        ("policy/v1", "PodDisruptionBudget", "p", "x", "/apis/policy/v1/namespaces/x/poddisruptionbudgets/p"),
        (
            "networking.k8s.io/v1",
            "NetworkPolicy",
            "n",
            "x",
            "/apis/networking.k8s.io/v1/namespaces/x/networkpolicies/n",
        ),
        (
            "nvidia.com/v1",
            "ClusterPolicy",
            "cluster-policy",
            None,
            "/apis/nvidia.com/v1/clusterpolicies/cluster-policy",
        ),
        ("v1", "Endpoints", "e", "x", "/api/v1/namespaces/x/endpoints/e"),
    ],
)
def test_rest_paths_follow_group_version_and_plural(
    api_version: str, kind: str, name: str, namespace: str | None, path: str
) -> None:
    assert resource(api_version, kind).object_path(name, namespace) == path


def test_plurals_and_collection_paths() -> None:
    assert [plural_of(k) for k in ("Ingress", "StorageClass", "Gateway", "Policy")] == [
        "ingresses",
        "storageclasses",
        "gateways",
        "policies",
    ]
    pods = resource("v1", "Pod")
    assert pods.collection_path() == "/api/v1/pods"
    assert pods.object_path("p", "ns", "eviction") == "/api/v1/namespaces/ns/pods/p/eviction"


def test_merge_patch_follows_rfc_7386() -> None:
    target = {"a": 1, "b": {"c": 2, "d": [1, 2]}}
    assert merge_patch(target, {"a": None, "b": {"d": [3], "e": "x"}}) == {"b": {"c": 2, "d": [3], "e": "x"}}
    assert target == {"a": 1, "b": {"c": 2, "d": [1, 2]}}


def test_strategic_merge_patch_merges_conditions_by_type() -> None:
    status = {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "status": "False"}]}
    patched = strategic_merge_patch(
        status, {"conditions": [{"type": "X", "status": "True"}, {"type": "Y", "status": "True"}]}
    )
    assert patched["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "X", "status": "True"},
        {"type": "Y", "status": "True"},
    ]
    removed = strategic_merge_patch(status, {"conditions": [{"type": "X", "$patch": "delete"}]})
    assert removed["conditions"] == [{"type": "Ready", "status": "True"}]


def test_vocabulary_lives_under_dsx_dev() -> None:
    names = [
        vocab.LABEL_CERTIFICATION,
        vocab.LABEL_STATE,
        vocab.LABEL_MANAGED,
        vocab.TAINT_UNHEALTHY,
        *vocab.CORDON_ANNOTATIONS,
    ]
    assert all(n.startswith(vocab.PREFIX) for n in names)
    assert [s.value for s in vocab.Certification] == ["passed", "failed", "pending"]
    assert [s.value for s in vocab.NodeState] == [
        "quarantined",
        "draining",
        "awaiting-repair",
        "recertifying",
        "escalated",
    ]
    assert vocab.TAINT_UNHEALTHY_EFFECT == "NoSchedule"
    assert not vocab.is_managed({vocab.LABEL_MANAGED: "False"})
    assert vocab.is_managed({})

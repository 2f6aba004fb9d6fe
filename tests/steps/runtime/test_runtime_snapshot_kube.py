"""Snapshot through the kubernetes client against the emulated API server: where release Secrets are read."""

from pathlib import Path

import pytest

from steps.cluster import ForbiddenError, connect, load_fleet
from steps.errors import InputError
from steps.runtime.snapshot import take_snapshot
from tests.emulator.apiserver import Emulator
from tests.steps.cluster.conftest import FAST

FLEET = "sim:nodes=1,gpu=h100,releases=gpu-operator/gpu-operator@v25.3.4;cert-manager/cert-manager@v1.18.2"


@pytest.fixture
def emulator(k8s_emulator: Emulator) -> Emulator:
    k8s_emulator.seed(load_fleet(FLEET).manifests())
    return k8s_emulator


def _secret_lists(emulator: Emulator) -> list[str]:
    return sorted(r.path for r in emulator.requests if r.method == "GET" and r.path.endswith("/secrets"))


def test_release_secrets_are_listed_only_in_the_namespaces_named(
    emulator: Emulator, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSX_HELM_NAMESPACES", "gpu-operator, nvidia-network-operator")
    snapshot = take_snapshot(connect("kube", kubeconfig=str(kubeconfig), retry=FAST))
    assert [(r.namespace, r.name, r.version) for r in snapshot.releases] == [
        ("gpu-operator", "gpu-operator", "v25.3.4")
    ]
    assert _secret_lists(emulator) == [
        "/api/v1/namespaces/gpu-operator/secrets",
        "/api/v1/namespaces/nvidia-network-operator/secrets",
    ]
    assert {i.namespace for i in snapshot.images} <= {"gpu-operator"}


def test_without_namespaces_every_namespace_is_read(
    emulator: Emulator, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DSX_HELM_NAMESPACES", raising=False)
    snapshot = take_snapshot(connect("kube", kubeconfig=str(kubeconfig), retry=FAST))
    assert [r.namespace for r in snapshot.releases] == ["cert-manager", "gpu-operator"]
    assert _secret_lists(emulator) == ["/api/v1/secrets"]


def test_a_refused_secret_list_says_which_value_grants_it(emulator: Emulator, kubeconfig: Path) -> None:
    emulator.forbid("list", "secrets")
    port = connect("kube", kubeconfig=str(kubeconfig), retry=FAST)
    with pytest.raises(ForbiddenError) as caught:
        take_snapshot(port, namespaces=["gpu-operator"])
    message = str(caught.value)
    assert "forbidden (403)" in message and "in namespace gpu-operator" in message
    assert "DSX_HELM_NAMESPACES" in message and "drift.helmNamespaces" in message


def test_a_namespace_list_with_a_bad_name_is_refused(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSX_HELM_NAMESPACES", "gpu-operator,GPU Operator")
    with pytest.raises(InputError, match=r"DSX_HELM_NAMESPACES: 'GPU Operator' is not a namespace name"):
        take_snapshot(connect("kube", kubeconfig=str(kubeconfig), retry=FAST))

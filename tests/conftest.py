"""Fixtures shared by every test package, one family for clusters: a simulated fleet the steps find
(``sim_fleet``) or the emulated API server seeded with one (``kube_fleet``), the emulated Kubernetes API
server and a kubeconfig for it (``k8s_emulator``, ``kubeconfig``), whole emulated clusters with a kubelet
double (``k8s_cluster``); and the e2e tier's real control plane (``real_cluster``), which the contract suite
of ``tests/steps/cluster`` shares with ``tests/e2e``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import RetryPolicy, load_fleet, shareable
from steps.cluster import vocabulary as vocab
from steps.cluster.kube import KubeCluster, load_api_client
from tests.emulator.apiserver import Emulator, write_kubeconfig
from tests.emulator.kubelet import EmulatedCluster, emulated_cluster


@pytest.fixture
def sim_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], str]:
    """Points dsx at a simulated fleet: ``sim_fleet(spec)`` builds it and keeps it in ``tmp_path/fleet.json``,
    where every step run in this process, or in any process the test starts, finds it through
    ``DSX_CLUSTER``; evidence goes under ``tmp_path/out`` (``DSX_OUTPUT_DIR``). Returns the spec naming the
    file (``connect(spec)`` opens it). Called again, it starts the fleet over."""
    monkeypatch.setenv(vocab.ENV_OUTPUT_DIR, str(tmp_path / "out"))

    def use(spec: str) -> str:
        shared = shareable(spec, tmp_path)
        monkeypatch.setenv(vocab.ENV_CLUSTER, shared)
        return shared

    return use


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The e2e tier's control plane, one per session (``tests.e2e.conftest.RealCluster``); only tests
    marked ``e2e`` ask for it."""
    from tests.e2e.conftest import open_real_cluster

    yield from open_real_cluster(tmp_path_factory)


@pytest.fixture
def k8s_emulator() -> Iterator[Emulator]:
    """A started, empty emulated API server (seed it with ``k8s_emulator.seed(manifests)``)."""
    with Emulator() as emulator:
        yield emulator


@pytest.fixture
def kubeconfig(k8s_emulator: Emulator, tmp_path: Path) -> Path:
    """A kubeconfig file pointing at the emulated API server."""
    return write_kubeconfig(tmp_path / "kubeconfig", k8s_emulator.url)


@pytest.fixture
def kube_fleet(
    k8s_emulator: Emulator, kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., KubeCluster]:
    """Points dsx at the emulated API server, seeded with a simulated fleet's objects: the twin of
    ``sim_fleet``. ``kube_fleet(spec, retry=None)`` seeds them (called again, it adds another fleet's, as
    a cluster has GPU and system nodes); every step run in this process, or in any it starts, reaches the
    server through ``DSX_CLUSTER=kube`` and ``KUBECONFIG``, its evidence under ``tmp_path/out``. Returns a
    port on the server through the kubernetes client (with ``retry``, that policy)."""
    monkeypatch.setenv(vocab.ENV_CLUSTER, "kube")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv(vocab.ENV_OUTPUT_DIR, str(tmp_path / "out"))

    def use(spec: str, retry: RetryPolicy | None = None) -> KubeCluster:
        k8s_emulator.seed(load_fleet(spec).manifests())
        api_client, _ = load_api_client(str(kubeconfig))
        return KubeCluster(api_client, retry=retry)

    return use


@pytest.fixture
def k8s_cluster(tmp_path: Path) -> Iterator[Callable[..., EmulatedCluster]]:
    """Starts emulated GPU clusters: API server, controllers, scheduler and the kubelet double.

    ``k8s_cluster(nodes=16, racks=4, gpu="h100", kubelet=True, behaviours={...},
    service_accounts=("dsx-rank",), namespace="dsx", spec="")`` seeds a simulated fleet (nodes labelled
    ``kubernetes.io/hostname``, ``topology.dsx.dev/rack=rack-RR``, ``nvidia.com/gpu`` allocatable) and
    returns an :class:`~tests.emulator.kubelet.EmulatedCluster` (``.emulator``, ``.kubelet``, ``.kubeconfig``,
    ``.port(namespace)``). Everything is stopped when the test ends.
    """
    with contextlib.ExitStack() as stack:
        count = 0

        def make(**options: Any) -> EmulatedCluster:
            nonlocal count
            count += 1
            return stack.enter_context(emulated_cluster(tmp_path / f"cluster-{count}", **options))

        yield make


def pytest_configure(config: pytest.Config) -> None:
    """Tables are read as a CI log shows them (200 columns, the CLI's width without a terminal), whatever
    the terminal the tests run from says (pytest-xdist's workers, for one, inherit ``COLUMNS=80``)."""
    os.environ["COLUMNS"] = "200"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many workers ``-n auto`` (the default, in pyproject.toml's addopts) starts: one per CPU and one
    more, at most 8, since a long test spends part of its time waiting on processes and polls (on 2 CPUs, 3
    workers took less time and CPU than 2 or 4; each worker pays its own imports and servers); none for the
    e2e tier, whose tests share one control plane and run in order. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` or
    ``-n N`` says otherwise (``-n 0``: one process)."""
    if _e2e_selected(config):
        return 0
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    if given.isdigit():
        return int(given)
    return min(8, len(os.sched_getaffinity(0)) + 1)  # the CPUs this process may run on


def _e2e_selected(config: pytest.Config) -> bool:
    return "e2e" in (config.getoption("markexpr") or "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The e2e tier runs only when a marker expression names it (``pytest -m e2e tests/e2e
    tests/steps/cluster``, as ``.ci/run`` runs it): any other selection, ``pytest -m "not story"``
    included, leaves it out.

    The long stories come first: under ``--dist worksteal`` the first worker starts on them, and the others
    take over the second half of its queue whenever theirs runs out."""
    if _e2e_selected(config):
        return
    dropped = [item for item in items if item.get_closest_marker("e2e") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.get_closest_marker("e2e") is None]
    items.sort(key=lambda item: item.get_closest_marker("story") is None)

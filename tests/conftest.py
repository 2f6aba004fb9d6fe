"""Fixtures shared by every test package: the emulated Kubernetes API server, a port on it, whole
emulated clusters with a kubelet double."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.emulator.apiserver import Emulator, write_kubeconfig
from tests.emulator.kubelet import EmulatedCluster, emulated_cluster


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
    """How many workers ``-n auto`` (the default, in pyproject.toml's addopts) starts: two per CPU, at most
    8, since a long test spends part of its time waiting on processes and polls; none for the e2e tier,
    whose tests share one control plane and run in order. ``PYTEST_XDIST_AUTO_NUM_WORKERS``
    or ``-n N`` says otherwise (``-n 0``: one process)."""
    if _e2e_selected(config):
        return 0
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    if given.isdigit():
        return int(given)
    return min(8, 2 * len(os.sched_getaffinity(0)))  # the CPUs this process may run on


def _e2e_selected(config: pytest.Config) -> bool:
    return "e2e" in (config.getoption("markexpr") or "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The e2e tier runs only when a marker expression names it (``pytest -m e2e tests/e2e``, as
    ``.ci/run`` runs it): any other selection, ``pytest -m "not story"`` included, leaves it out."""
    if _e2e_selected(config):
        return
    dropped = [item for item in items if item.get_closest_marker("e2e") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.get_closest_marker("e2e") is None]

"""Fixtures shared by every test package: the emulated Kubernetes API server and a port on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s_emulator import Emulator, write_kubeconfig


@pytest.fixture
def k8s_emulator() -> Iterator[Emulator]:
    """A started, empty emulated API server (seed it with ``k8s_emulator.seed(manifests)``)."""
    with Emulator() as emulator:
        yield emulator


@pytest.fixture
def kubeconfig(k8s_emulator: Emulator, tmp_path: Path) -> Path:
    """A kubeconfig file pointing at the emulated API server."""
    return write_kubeconfig(tmp_path / "kubeconfig", k8s_emulator.url)

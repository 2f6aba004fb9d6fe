"""The emulator's own tests' fixture: a quiet emulator whose controllers run only when told."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import load_fleet
from steps.cluster.kube import load_api_client
from tests.emulator.apiserver import Emulator, ManualClock, write_kubeconfig
from tests.emulator.objects import GPU_FLEET


@pytest.fixture
def quiet(tmp_path: Path) -> Iterator[tuple[Emulator, Any, ManualClock]]:
    """An emulator on a 16-node, 4-rack H100 fleet whose controllers run only on ``settle()``, with a
    clock the test moves, and a kubernetes ``ApiClient`` on it: for rules whose order matters."""
    clock = ManualClock()
    emulator = Emulator(controllers=False, clock=clock)
    emulator.seed(load_fleet(GPU_FLEET).manifests())
    with emulator:
        api_client, _ = load_api_client(str(write_kubeconfig(tmp_path / "kubeconfig", emulator.url)))
        yield emulator, api_client, clock

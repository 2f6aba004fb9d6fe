"""The sentinel tests' cluster: a simulated fleet as the nodes' hardware, written to through the sim's own
port or, for ``kube``, through the real client to the emulated API server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from steps.cluster import RetryPolicy, load_fleet
from steps.cluster.kube import KubeCluster, load_api_client
from steps.cluster.port import ClusterPort
from steps.cluster.sim import MemoryStore, SimCluster
from tests.emulator.apiserver import Emulator, write_kubeconfig

FAST = RetryPolicy(
    attempts=2, base_delay=0.0, max_delay=0.0, jitter=0.0, conflict_attempts=3, conflict_delay=0.0
)

Fleet = Callable[..., tuple[ClusterPort, SimCluster, Emulator | None]]


@pytest.fixture(params=["sim", "kube"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    """Builds (cluster port, the fleet's hardware, emulator or None) for a fleet spec and a retry policy
    (default :data:`FAST`); with kube the agents write through the real client to the emulated API server,
    the fleet stays the hardware."""
    emulators: list[Emulator] = []

    def make(spec: str, retry: RetryPolicy = FAST) -> tuple[ClusterPort, SimCluster, Emulator | None]:
        hardware = SimCluster(MemoryStore(load_fleet(spec)), retry=retry)
        if request.param == "sim":
            return hardware, hardware, None
        emulator = Emulator()
        emulator.start()
        emulators.append(emulator)
        emulator.seed(load_fleet(spec).manifests())
        api_client, _ = load_api_client(str(write_kubeconfig(tmp_path / f"kc{len(emulators)}", emulator.url)))
        return KubeCluster(api_client, retry=retry), hardware, emulator

    yield make
    for emulator in emulators:
        emulator.stop()

"""The two adapters side by side, built on the same simulated fleet, with the same fault controls; and,
in the e2e tier (``pytest -m e2e tests/steps/cluster``), the kube adapter against the real API server
(:mod:`tests.e2e.contract`) as a third target."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import RetryPolicy, load_fleet
from steps.cluster.base import PortBase
from steps.cluster.kube import KubeCluster, load_api_client
from steps.cluster.sim import MemoryStore, SimCluster
from steps.cluster.sim.model import Fleet
from tests.emulator.apiserver import Emulator, write_kubeconfig

# the gateway budget blocks every eviction; no node certified before
FLEET = "sim:nodes=6,gpu=h100,racks=2,blocking-pdb=true,certified=none"
KUBECTL = "kubectl-cordon"  # the field manager kubectl cordon and uncordon write as
FAST = RetryPolicy(attempts=6, base_delay=0.0, max_delay=0.0, jitter=0.0)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


@dataclass
class Backend:
    """A port and the levers a test pulls on the server behind it."""

    kind: str
    port: PortBase
    clock: Clock
    new_port: Callable[[], PortBase]
    kubectl: Callable[[], PortBase]
    """A port playing another client (field manager ``kubectl-cordon``): someone cordoning outside dsx."""
    inject_errors: Callable[[int], None]
    inject_conflicts: Callable[[int], None]
    forbid: Callable[[str, str], None]
    injected: Callable[[], int]
    conflicts: Callable[[], int]
    settle: Callable[[], None] = field(default=lambda: None)
    """Wait for what the last call set going to end (a real cluster's kubelets and controllers finish a
    moment after the API answered; the doubles, before)."""


def _kube_ports(config: Path, clock: Clock) -> Callable[..., PortBase]:
    """Makes ports through the kubernetes client on the server ``config`` names (``field_manager``:
    whose writes they are, ``dsx`` unless told)."""

    def new_port(field_manager: str = "dsx") -> PortBase:
        api_client, _ = load_api_client(str(config))
        return KubeCluster(api_client, retry=FAST, clock=clock, field_manager=field_manager)

    return new_port


def _kube(fleet: Fleet, tmp_path: Path, emulator: Emulator, clock: Clock) -> Backend:
    emulator.seed(fleet.manifests())
    new_port = _kube_ports(write_kubeconfig(tmp_path / "kubeconfig", emulator.url), clock)
    return Backend(
        kind="kube",
        port=new_port(),
        clock=clock,
        new_port=new_port,
        kubectl=lambda: new_port(KUBECTL),
        inject_errors=lambda n: emulator.fail(n, 500),
        inject_conflicts=emulator.conflict,
        forbid=emulator.forbid,
        injected=lambda: sum(1 for r in emulator.requests if r.status in (409, 500)),
        conflicts=lambda: sum(1 for r in emulator.requests if r.status == 409),
    )


def _sim(fleet: Fleet, clock: Clock) -> Backend:
    store = MemoryStore(fleet)
    port = SimCluster(store, retry=FAST, clock=clock)

    def forbid(verb: str, resource: str) -> None:
        port.inject_api(forbid=[*port.fleet().api.forbidden, f"{verb} {resource}"])

    return Backend(
        kind="sim",
        port=port,
        clock=clock,
        new_port=lambda: SimCluster(store, retry=FAST, clock=clock),
        kubectl=lambda: SimCluster(store, retry=FAST, clock=clock, field_manager=KUBECTL),
        inject_errors=lambda n: port.inject_api(errors=n),
        inject_conflicts=lambda n: port.inject_api(conflicts=n),
        forbid=forbid,
        injected=lambda: sum(1 for r in port.calls() if r.method.startswith("api:")),
        conflicts=lambda: sum(1 for r in port.calls() if r.error == "injected 409"),
    )


def _real(fleet: Fleet, tmp_path: Path, plane: Any, clock: Clock) -> Backend:
    plane.reset()
    plane.seed(fleet.manifests())
    new_port = _kube_ports(write_kubeconfig(tmp_path / "kubeconfig", plane.proxy.url, token=None), clock)
    answers = plane.proxy.answers
    return Backend(
        kind="real",
        port=new_port(),
        clock=clock,
        new_port=new_port,
        kubectl=lambda: new_port(KUBECTL),
        inject_errors=plane.proxy.fail,
        inject_conflicts=plane.proxy.conflict,
        forbid=plane.forbid,
        injected=lambda: sum(1 for status in answers if status in (409, 500)),
        conflicts=lambda: answers.count(409),
        settle=plane.settle,
    )


@pytest.fixture(scope="package")
def contract_plane(real_cluster: Any) -> Iterator[Any]:
    """A cluster of its own in the e2e tier's control plane for the contract suite
    (:class:`tests.e2e.contract.Plane`); its processes stop once the suite is done, so they take no CPU
    from the e2e tests after it (idle, its API server alone took a tenth of one CPU)."""
    if real_cluster.own is None:
        pytest.skip("DSX_E2E_KUBECONFIG names an existing cluster: no second API server for the contract")
    from tests.e2e.contract import plane

    with plane(real_cluster.own) as made:
        yield made


@pytest.fixture(params=["kube", "sim", pytest.param("real", marks=pytest.mark.e2e)])
def make_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Backend]]:
    """Builds backends of the parametrized kind on a fresh copy of a fleet (default :data:`FLEET`). The
    real API server holds one fleet at a time: a second call starts it over."""
    emulators: list[Emulator] = []

    def make(spec: str = FLEET) -> Backend:
        fleet = load_fleet(spec)
        clock = Clock()
        if request.param == "sim":
            return _sim(fleet, clock)
        if request.param == "real":
            folder = tmp_path / f"real{len(emulators)}"
            folder.mkdir(exist_ok=True)
            return _real(fleet, folder, request.getfixturevalue("contract_plane"), clock)
        emulator = Emulator()
        emulator.start()
        emulators.append(emulator)
        folder = tmp_path / f"kube{len(emulators)}"
        folder.mkdir()
        return _kube(fleet, folder, emulator, clock)

    yield make
    for emulator in emulators:
        emulator.stop()


@pytest.fixture
def backend(make_backend: Callable[..., Backend]) -> Backend:
    """One backend on the default fleet."""
    return make_backend()

"""The two doubles a remediation scenario runs on, behind one face, so that a scenario is written once and
run on both by parametrisation (``tests/workflows/test_remediate_doubles.py``).

``sim``: the simulated fleet shared through its state file (``--cluster state:...``); the fleet repairs a
node by itself ``repair-delay`` seconds after the request. ``kube``: the emulated API server with the
kubelet double (``--cluster kube --kubeconfig ...``); the repair system is a thread of the test
(:class:`~tests.workflows.test_remediate_faults_kube.Repairer`), which reboots the node when asked. Both
start with node-01 carrying the sentinel's XID condition. What a scenario reads of the cluster it reads
through dsx's own port (:attr:`Double.port`), the same calls on both.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol
from unittest import mock

from steps.cluster import ClusterPort
from steps.cluster import vocabulary as vocab
from steps.cluster.errors import NotFoundError
from steps.cluster.sim import FileStore, SimCluster
from steps.sentinel import ledger
from tests.cli import Started, dsx_started
from tests.emulator.kubelet import EmulatedCluster
from tests.workflows import test_remediate_faults as on_sim
from tests.workflows import test_remediate_faults_kube as on_kube
from workflows.runner import Phase

NODE = on_sim.NODE


class Double(Protocol):
    """What a scenario asks of the cluster it runs on, beyond what it reads through :attr:`port`."""

    port: ClusterPort

    def command(self, out: Path, **extra: str) -> list[str]:
        """The arguments of ``dsx run remediate --local`` against this cluster, its run folder ``out``,
        ``extra`` parameters over the scenarios' own."""
        ...

    @property
    def env(self) -> dict[str, str]:
        """The environment the command runs in."""
        ...

    def step_env(self) -> dict[str, str]:
        """The environment a step of a run against this cluster reads it from."""
        ...

    def run(self, out: Path, **extra: str) -> Phase:
        """``dsx-remediate`` run in this process by the local runner, to its end."""
        ...

    def repairs(self) -> contextlib.AbstractContextManager[Any]:
        """While inside, a repair request for node-01 is answered as the double was started to."""
        ...

    def touched_nothing(self) -> bool:
        """No node was cordoned or changed and no pod evicted."""
        ...

    def eviction_refused(self) -> bool:
        """An eviction was refused for a disruption budget (429)."""
        ...

    def uncordon_by_hand(self) -> None:
        """``kubectl uncordon node-01``: it asks nobody."""
        ...

    def fail_api(self) -> None:
        """The API answers some of the next requests 500 (node patches, evictions, ConfigMap writes on
        ``kube``; the next requests of any kind on ``sim``) and some writes 409."""
        ...

    def api_failures_met(self) -> bool:
        """Every 500 and 409 :meth:`fail_api` set up was answered to a request."""
        ...

    def assert_lost_nothing(self, cordoned_before: frozenset[str] = frozenset(), deleted: str = "") -> None:
        """No pod deleted outside the Eviction API (but the ``serving`` pods named ``deleted``..., which the
        drain policy's namespace mode deletes), no budget below what it asks for, no node cordoned without
        ``dsx.dev/state``, no cordon in ``cordoned_before`` (made outside dsx) lifted."""
        ...


def _command(cluster: list[str], out: Path, params: dict[str, str]) -> list[str]:
    base = ["run", "remediate", "--local", *cluster]
    return [*base, *[a for k, v in params.items() for a in ("-p", f"{k}={v}")], "--out", str(out)]


class SimDouble:
    """The simulated fleet, shared through its state file; it repairs node-01 by itself."""

    def __init__(self, tmp_path: Path, spec: str) -> None:
        self.state_spec, self.fleet = on_sim._fleet(tmp_path, spec)
        self.port: ClusterPort = self.fleet  # the fleet's own calls log and fault levers are read below

    def command(self, out: Path, **extra: str) -> list[str]:
        return _command(["--cluster", self.state_spec], out, on_sim._params(**extra))

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def step_env(self) -> dict[str, str]:
        return {vocab.ENV_CLUSTER: self.state_spec}

    def run(self, out: Path, **extra: str) -> Phase:
        return on_sim._remediate(self.state_spec, out, **extra)

    def repairs(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the fleet answers by itself (its spec's repair and repair-delay)

    def touched_nothing(self) -> bool:
        return not [c for c in self.fleet.calls() if c.method in ("cordon", "evict")]

    def eviction_refused(self) -> bool:
        calls = self.fleet.calls()
        return any(c.method == "evict" and c.result and c.result.get("outcome") == "blocked" for c in calls)

    def uncordon_by_hand(self) -> None:
        store = FileStore(Path(self.state_spec.removeprefix("state:")))
        SimCluster(store, field_manager="kubectl-cordon").uncordon(NODE, force=True)

    def fail_api(self) -> None:
        self.fleet.inject_api(errors=3, conflicts=3)

    def api_failures_met(self) -> bool:
        api = self.fleet.fleet().api
        return (
            api.errors == 0
            and api.conflicts == 0
            and any(c.method.startswith("api:") for c in self.fleet.calls())
        )

    def assert_lost_nothing(self, cordoned_before: frozenset[str] = frozenset(), deleted: str = "") -> None:
        on_sim._lost_nothing(self.fleet, set(cordoned_before), deleted=deleted)


#: How a kube double recertifies a node whose repair leaves it failing: rank Jobs on the kubelet double,
#: small sweeps, quick polls (the rank pods' account is made with the cluster).
JOB_RECERTIFICATION = {
    vocab.ENV_GPU_IMAGE: "registry.example/dsx-gpu:0.1.0",
    vocab.ENV_JOB_POLL_S: "0.1",
    vocab.ENV_SCHEDULE_BUDGET_S: "60",
    vocab.ENV_STALE_WAIT_S: "30",
}
JOB_SIZES = {"launcher": "job", "min-bytes": "16KiB", "max-bytes": "64KiB", "iters": "2"}


class KubeDouble:
    """The emulated API server and kubelet double; a thread of the test plays the repair system. A repair
    that ``fails`` reboots the node, and from then on every pod on it exits 1: certification's rank Jobs
    fail there."""

    def __init__(self, made: EmulatedCluster, repair: str, repair_delay: float) -> None:
        self.made, self.repair, self.repair_delay = made, repair, repair_delay
        self.port = made.port(on_kube.NAMESPACE)

    def command(self, out: Path, **extra: str) -> list[str]:
        cluster = ["--cluster", "kube", "--kubeconfig", str(self.made.kubeconfig)]
        return _command(cluster, out, on_kube._params(**extra))

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, vocab.ENV_NAMESPACE: on_kube.NAMESPACE}

    def step_env(self) -> dict[str, str]:
        env = {vocab.ENV_CLUSTER: "kube", "KUBECONFIG": str(self.made.kubeconfig)}
        return {**env, vocab.ENV_NAMESPACE: on_kube.NAMESPACE}

    def run(self, out: Path, **extra: str) -> Phase:
        if self.repair != "fails":
            return on_kube._remediate(self.made, out, **extra)
        with mock.patch.dict(os.environ, JOB_RECERTIFICATION):
            return on_kube._remediate(self.made, out, **{**JOB_SIZES, **extra})

    def repairs(self) -> contextlib.AbstractContextManager[Any]:
        if self.repair != "fails":
            return on_kube.Repairer(self.made.emulator, mode=self.repair, delay=self.repair_delay)
        kubelet = self.made.kubelet
        assert kubelet is not None

        def broken() -> None:
            kubelet.behave(NODE, fail_exit_code=1, fail_after_s=0.2)

        return on_kube.Repairer(self.made.emulator, delay=self.repair_delay, after=broken)

    def touched_nothing(self) -> bool:
        emulator = self.made.emulator
        return not on_kube._requests(emulator, "POST", "/eviction") and not on_kube._requests(
            emulator, "PATCH", "/nodes/"
        )

    def eviction_refused(self) -> bool:
        return any(r.status == 429 for r in self.made.emulator.requests)

    def uncordon_by_hand(self) -> None:
        on_kube._core(self.made).patch_node(NODE, {"spec": {"unschedulable": False}}, _preload_content=False)

    def fail_api(self) -> None:
        emulator = self.made.emulator
        emulator.fail(2, 500, method="PATCH", path="/nodes/")
        emulator.fail(2, 500, method="POST", path="/eviction")
        emulator.fail(2, 500, method="PUT", path="/configmaps/")
        emulator.conflict(3)

    def api_failures_met(self) -> bool:
        requests = self.made.emulator.requests
        return len([r for r in requests if r.status == 500]) == 6 and any(r.status == 409 for r in requests)

    def assert_lost_nothing(self, cordoned_before: frozenset[str] = frozenset(), deleted: str = "") -> None:
        on_kube._lost_nothing(
            self.made, cordoned_before, deleted=f"/serving/pods/{deleted}" if deleted else ""
        )


#: The fleet's spec for a repair that never comes, or that leaves the fault (``ok``: none).
_SIM_REPAIRS = {"never": ",repair=never", "fails": ",repair=fail"}


def start(
    kind: str,
    tmp_path: Path,
    k8s_cluster: Callable[..., EmulatedCluster],
    spec: str,
    repair_delay: float = 0.5,
    repair: str = "ok",
    cordoned: tuple[str, ...] = (),
) -> Double:
    """A double of ``kind`` (``sim`` or ``kube``) on the simulated fleet ``spec``, node-01 faulty, its
    repair (``ok``; ``never``; ``fails``: the node comes back on a new boot, its condition cleared, and
    still fails its certification) coming ``repair_delay`` seconds after the request, the nodes
    ``cordoned`` cordoned by someone other than dsx. On ``kube`` no node passed a certification (the pair
    test has no partner there; its hold is tested on the fleet and on the real control plane)."""
    faulty = f"{spec},faults={NODE}:xid=79"
    if kind == "sim":
        extra = f",repair-delay={repair_delay:g}" + _SIM_REPAIRS.get(repair, "")
        extra += "".join(f",cordoned={name}" for name in cordoned)
        return SimDouble(tmp_path, faulty + extra)
    accounts = ("dsx-ranks",) if repair == "fails" else ()
    made = k8s_cluster(spec=f"{faulty},certified=none", service_accounts=accounts)
    made.emulator.update("nodes", "", NODE, on_kube._faulty)
    for name in cordoned:
        on_kube._cordon_by_hand(made, name)
    return KubeDouble(made, repair, repair_delay)


def state(double: Double) -> str:
    """node-01's ``dsx.dev/state`` ('' when none, 'gone' when the node is)."""
    try:
        return double.port.get_node(NODE).labels.get(vocab.LABEL_STATE, "")
    except NotFoundError:
        return "gone"


def states(double: Double) -> list[str]:
    """node-01's ledger, state by state."""
    return [e.state for e in ledger.entries(double.port, NODE)]


def assert_in_service(double: Double) -> None:
    """node-01 uncordoned, untainted, certified ``passed``, no state or recertify label, its ledger ended
    in service."""
    node = double.port.get_node(NODE)
    assert not node.unschedulable and node.labels[vocab.LABEL_CERTIFICATION] == "passed"
    assert vocab.LABEL_STATE not in node.labels and vocab.LABEL_RECERTIFY not in node.labels
    assert not node.has_taint(vocab.TAINT_UNHEALTHY)
    assert states(double)[-2:] == [ledger.IN_SERVICE, "ended"]


@contextlib.contextmanager
def running(double: Double, out: Path, **extra: str) -> Iterator[Started]:
    """``dsx run remediate --local`` started in the background; killed if still running at the end."""
    process = dsx_started(*double.command(out, **extra), env=double.env)
    try:
        yield process
    finally:
        process.close()


def in_background(double: Double, out: Path, **extra: str) -> tuple[threading.Thread, list[Phase]]:
    """:meth:`Double.run` in a thread; its phase lands in the list when it ends."""
    phases: list[Phase] = []
    thread = threading.Thread(target=lambda: phases.append(double.run(out, **extra)), daemon=True)
    thread.start()
    return thread, phases


def drain_policy(**policy: Any) -> str:
    """The drain policy parameter: the scenarios' fast polls, ``policy`` over them."""
    return json.dumps({**on_sim.FAST, **policy})

"""The two doubles a remediation scenario runs on, behind one face, so that a scenario is written once and
run on both by parametrisation (the ``double`` fixture of ``tests/workflows/test_remediate_resume.py``).

``sim``: the simulated fleet shared through its state file (``--cluster state:...``); the fleet repairs a
node by itself ``repair-delay`` seconds after the request. ``kube``: the emulated API server with the
kubelet double (``--cluster kube --kubeconfig ...``); the repair system is a thread of the test
(:class:`~tests.workflows.test_remediate_faults_kube.Repairer`), which reboots the node when asked.
Both start with node-01 carrying the sentinel's XID condition.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from steps.cluster import vocabulary as vocab
from steps.sentinel import ledger
from tests.emulator.kubelet import EmulatedCluster
from tests.paths import REPO
from tests.workflows import test_remediate_faults as on_sim
from tests.workflows import test_remediate_faults_kube as on_kube
from workflows.runner import Phase

NODE = on_sim.NODE


class Double(Protocol):
    """What a scenario asks of the cluster it runs on."""

    name: str

    def params(self, **extra: str) -> dict[str, str]:
        """``dsx-remediate``'s parameters for node-01's XID fault, ``extra`` over them."""
        ...

    def command(self, out: Path, **extra: str) -> list[str]:
        """``dsx run remediate --local`` against this cluster, its run folder ``out``."""
        ...

    @property
    def env(self) -> dict[str, str]:
        """The environment the command runs in."""
        ...

    def state(self) -> str:
        """node-01's ``dsx.dev/state`` ('' when none, 'gone' when the node is)."""
        ...

    def cordoned_saying_why(self) -> bool:
        """node-01 is cordoned and its state label says why."""
        ...

    def repairs(self) -> contextlib.AbstractContextManager[Any]:
        """While inside, a repair request for node-01 is answered (after the double's repair delay)."""
        ...

    def assert_in_service(self) -> None:
        """node-01 uncordoned, certified ``passed``, no state label."""
        ...

    def entries(self) -> list[ledger.Entry]:
        """node-01's ledger."""
        ...

    def step_env(self) -> dict[str, str]:
        """The environment a step of a run against this cluster reads it from."""
        ...

    def run(self, out: Path, **extra: str) -> Phase:
        """``dsx-remediate`` run in this process by the local runner, to its end."""
        ...

    def assert_lost_nothing(self, deleted: str = "") -> None:
        """No pod deleted outside the Eviction API (but the ``serving`` pods named ``deleted``..., which the
        drain policy's namespace mode deletes), no budget below what it asks for, no node cordoned without
        ``dsx.dev/state``."""
        ...


def _args(params: dict[str, str]) -> list[str]:
    return [a for k, v in params.items() for a in ("-p", f"{k}={v}")]


def _run_cli(cluster: list[str], out: Path, params: dict[str, str]) -> list[str]:
    base = [sys.executable, "-m", "workflows.cli", "run", "remediate", "--local", *cluster]
    return [*base, *_args(params), "--out", str(out)]


class SimDouble:
    """The simulated fleet, shared through its state file; it repairs node-01 by itself."""

    name = "sim"

    def __init__(self, tmp_path: Path, spec: str) -> None:
        self.state_spec, self.port = on_sim._fleet(tmp_path, spec)

    def params(self, **extra: str) -> dict[str, str]:
        return on_sim._params(**extra)

    def command(self, out: Path, **extra: str) -> list[str]:
        return _run_cli(["--cluster", self.state_spec], out, self.params(**extra))

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def state(self) -> str:
        return on_sim._state_of(self.port)

    def cordoned_saying_why(self) -> bool:
        node = self.port.get_node(NODE)
        return bool(node.unschedulable and node.labels.get(vocab.LABEL_STATE))

    def repairs(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the fleet answers by itself (its spec's repair-delay)

    def assert_in_service(self) -> None:
        node = self.port.get_node(NODE)
        assert not node.unschedulable and node.labels[vocab.LABEL_CERTIFICATION] == "passed"
        assert vocab.LABEL_STATE not in node.labels

    def entries(self) -> list[ledger.Entry]:
        return ledger.entries(self.port, NODE)

    def step_env(self) -> dict[str, str]:
        return {vocab.ENV_CLUSTER: self.state_spec}

    def run(self, out: Path, **extra: str) -> Phase:
        return on_sim._remediate(self.state_spec, out, **extra)

    def assert_lost_nothing(self, deleted: str = "") -> None:
        on_sim._lost_nothing(self.port, deleted=deleted)


class KubeDouble:
    """The emulated API server and kubelet double; a thread of the test plays the repair system."""

    name = "kube"

    def __init__(self, made: EmulatedCluster, repair_delay: float) -> None:
        self.made, self.repair_delay = made, repair_delay

    def params(self, **extra: str) -> dict[str, str]:
        return on_kube._params(**extra)

    def command(self, out: Path, **extra: str) -> list[str]:
        cluster = ["--cluster", "kube", "--kubeconfig", str(self.made.kubeconfig)]
        return _run_cli(cluster, out, self.params(**extra))

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, vocab.ENV_NAMESPACE: on_kube.NAMESPACE}

    def state(self) -> str:
        return on_kube._state_of(self.made)

    def cordoned_saying_why(self) -> bool:
        node = on_kube._node(self.made)
        return on_kube._cordoned(node) and bool(on_kube._labels(node).get(vocab.LABEL_STATE))

    def repairs(self) -> contextlib.AbstractContextManager[Any]:
        return on_kube.Repairer(self.made.emulator, delay=self.repair_delay)

    def assert_in_service(self) -> None:
        on_kube._in_service(self.made)

    def entries(self) -> list[ledger.Entry]:
        return ledger.entries(self.made.port(on_kube.NAMESPACE), NODE)

    def step_env(self) -> dict[str, str]:
        env = {vocab.ENV_CLUSTER: "kube", "KUBECONFIG": str(self.made.kubeconfig)}
        return {**env, vocab.ENV_NAMESPACE: on_kube.NAMESPACE}

    def run(self, out: Path, **extra: str) -> Phase:
        return on_kube._remediate(self.made, out, **extra)

    def assert_lost_nothing(self, deleted: str = "") -> None:
        on_kube._lost_nothing(self.made, deleted=f"/serving/pods/{deleted}" if deleted else "")


def start(
    kind: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster], spec: str, repair_delay: float
) -> Double:
    """A double of ``kind`` (``sim`` or ``kube``) on the simulated fleet ``spec``, node-01 faulty, its
    repair coming ``repair_delay`` seconds after the request. On ``kube`` no node passed a certification
    (the pair test has no partner there; its hold is tested on the fleet and on the real control plane)."""
    faulty = f"{spec},faults={NODE}:xid=79"
    if kind == "sim":
        return SimDouble(tmp_path, f"{faulty},repair-delay={repair_delay:g}")
    made = k8s_cluster(spec=f"{faulty},certified=none")
    made.emulator.update("nodes", "", NODE, on_kube._faulty)
    return KubeDouble(made, repair_delay)


@contextlib.contextmanager
def running(double: Double, out: Path, **extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``dsx run remediate --local`` started in the background; killed if still running at the end."""
    process = subprocess.Popen(
        double.command(out, **extra),
        cwd=REPO,
        env=double.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def run_to_end(double: Double, out: Path, timeout: float, **extra: str) -> subprocess.CompletedProcess[str]:
    """``dsx run remediate --local`` run to its end."""
    return subprocess.run(
        double.command(out, **extra),
        cwd=REPO,
        env=double.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def drain_policy(**policy: Any) -> str:
    """The drain policy parameter: the scenarios' fast polls, ``policy`` over them."""
    return json.dumps({**on_sim.FAST, **policy})

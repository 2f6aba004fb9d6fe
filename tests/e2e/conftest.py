"""The e2e tier's session: one real control plane for every test (``pytest -m e2e tests/e2e
tests/steps/cluster``: the cluster port's contract suite has it as its third target).

By default the session brings up its own (:class:`tests.e2e.cluster.Cluster`: built from the Go module
proxy, cached, torn down at the end so no process outlives the session). With ``DSX_E2E_KUBECONFIG``
it uses an existing cluster instead (kind, k3d...): Argo Workflows installed, ``charts/dsx`` installed in
``gpu-ops``, ``argo`` on ``PATH``; tests that need the process kubelet's hardware levers (reboots, busy
nodes) then skip, saying so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import NAMESPACE, ROOT, Cluster


@dataclass
class RealCluster:
    """A cluster the tests drive through the real ``argo`` and ``kubectl``."""

    kubeconfig: Path
    env: dict[str, str]
    own: Cluster | None

    def run(
        self, *argv: str, check: bool = True, timeout: float = 900, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            list(argv),
            input=input,
            capture_output=True,
            text=True,
            env={**os.environ, **self.env},
            cwd=ROOT,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def argo(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return self.run("argo", *args, check=check, timeout=timeout)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("kubectl", *args, check=check)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def workflow(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get("workflow", name, "-n", NAMESPACE)
        return result

    def node_labels(self) -> dict[str, dict[str, str]]:
        return {n["metadata"]["name"]: n["metadata"].get("labels", {}) for n in self.get("nodes")["items"]}

    def debug(self) -> str:
        """For a failing assertion: first the logs of pods whose process crashed (a fatal error with every
        thread's stack, a C++ terminate, a rank torchrun saw die of a signal), the newest three, then the
        control plane's logs."""
        if self.own is None:
            return ""
        out = []
        crashed = [
            log
            for log in (self.own.dir / "kubelet").rglob("*.log")
            if any(mark in log.read_text(errors="replace") for mark in CRASH_MARKS)
        ]
        for log in sorted(crashed, key=lambda f: f.stat().st_mtime)[-3:]:
            lines = log.read_text(errors="replace").splitlines()
            out.append(f"--- crashed: {log.parent.name}/{log.name}\n" + "\n".join(lines[-60:]))
        for log in sorted((self.own.dir / "logs").glob("*.log")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(out)


def wait_until(
    condition: Callable[[], Any], seconds: float, what: str, debug: Callable[[], str] | None = None
) -> Any:
    """``condition()``'s first true value, asked every half second; fails naming ``what`` (and, with
    ``debug``, what it says) when none comes within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} not within {seconds:.0f} s" + (f"\n{debug()}" if debug else ""))


def pinned_workload(real_cluster: RealCluster, node: str, namespace: str, app: str) -> dict[str, Any]:
    """A Deployment's one pod pinned on ``node`` in a namespace of its own, made and running; the pod."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }
    real_cluster.kubectl("create", "namespace", namespace)
    real_cluster.run("kubectl", "apply", "-f", "-", input=json.dumps(deployment))
    real_cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Available", f"deployment/{app}", "--timeout=120s"
    )
    (pod,) = real_cluster.get("pods", "-n", namespace, "-l", f"app={app}")["items"]
    return dict(pod)


#: What a pod's log holds when its process crashed rather than failed a check.
CRASH_MARKS = ("Fatal Python error", "terminate called", "Segmentation fault", "(SIGABRT)", "(SIGSEGV)")

#: Who the audit log records: every service account of dsx's namespace.
ACCOUNTS = f"system:serviceaccount:{NAMESPACE}:"


def audit_events(own: Cluster) -> list[dict[str, Any]]:
    """Every request of an account in dsx's namespace the API server answered, from its audit log."""
    events = []
    for line in own.audit_log.read_text().splitlines():
        event = json.loads(line)
        # A watch is logged complete only when it ends (minutes later, maybe after the session): its
        # ResponseStarted entry, with the same decision, counts too.
        answered = event.get("stage") == "ResponseComplete" or (
            event.get("stage") == "ResponseStarted" and event.get("verb") == "watch"
        )
        if answered and event["user"]["username"].startswith(ACCOUNTS):
            events.append(event)
    return events


#: pytest-timeout's bound for one e2e test, which the suite's default (300 s) is too short for: a
#: certification's pods, torch imports and gloo runs take minutes on 2 cores, and the first test also pays
#: for the control plane coming up.
E2E_TIMEOUT_S = 1800


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each failed e2e test's first lines last, where a CI log's tail shows them: an assertion's first
    line names what failed (a workflow's failed steps and their messages), and the control plane's logs
    after it would push it out of view."""
    failed = [r for r in terminalreporter.stats.get("failed", []) if "e2e" in r.keywords]
    if not failed:
        return
    terminalreporter.section("e2e failures, first lines")
    for report in failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        lines = (crash.message if crash is not None else str(report.longrepr)).splitlines()[:3]
        terminalreporter.write_line(f"{report.nodeid}:")
        for line in lines:
            terminalreporter.write_line(f"    {line[:1500]}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The certifications run after the other tests, and tests that read what the others did (the audit
    log) after them all; e2e tests get their bound."""
    items.sort(
        key=lambda item: (
            item.get_closest_marker("e2e_last") is not None,
            item.get_closest_marker("e2e_heavy") is not None,
        )
    )
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))


#: A file the first ``e2e_heavy`` test waits for, when set: ``.ci/run`` starts the tier beside the unit
#: tier, whose CPUs its other tests (mostly waiting on the control plane's clocks) barely touch, and
#: creates the file once the unit tier is done, so that the certifications' rank pods (minutes of both
#: CPUs) do not run beside it.
ENV_HEAVY_AFTER = "DSX_E2E_HEAVY_AFTER"

#: How long the first certification waits for that file at most before it goes on, saying so.
HEAVY_WAIT_S = 2400.0

#: Set in the session's stash once the first ``e2e_heavy`` test has passed the wait.
_WAITED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Before the first ``e2e_heavy`` test, wait for the file ``DSX_E2E_HEAVY_AFTER`` names (outside
    the test's timeout, which starts inside this wrapper)."""
    if item.get_closest_marker("e2e_heavy") is not None and not item.config.stash.get(_WAITED, False):
        item.config.stash[_WAITED] = True
        gate = os.environ.get(ENV_HEAVY_AFTER)
        if gate:
            _wait_for(Path(gate), item.config)
    yield


def _wait_for(gate: Path, config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    say(f"waiting for {gate} ({ENV_HEAVY_AFTER}) before the certifications")
    start = time.monotonic()
    while not gate.exists():
        if time.monotonic() - start > HEAVY_WAIT_S:
            say(f"{gate} is not there after {HEAVY_WAIT_S:.0f} s: the certifications start without it")
            return
        time.sleep(1.0)
    say(f"{gate} is there after {time.monotonic() - start:.0f} s: the certifications start")


def open_real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """The session's cluster (the ``real_cluster`` fixture, in ``tests/conftest.py`` so that the contract
    suite of ``tests/steps/cluster`` shares it): its own, or the one ``DSX_E2E_KUBECONFIG`` names."""
    existing = os.environ.get("DSX_E2E_KUBECONFIG")
    if existing:
        yield RealCluster(Path(existing), {"KUBECONFIG": existing}, None)
        return
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))

    def stopped(signum: int, frame: object) -> None:
        # A session ended by SIGTERM (a CI job's timeout, `timeout`) takes its cluster down like Ctrl-C:
        # pytest unwinds the session's fixtures, so no process of it outlives it.
        raise KeyboardInterrupt(f"signal {signum}")

    before = signal.signal(signal.SIGTERM, stopped)
    try:
        cluster.up()
        yield RealCluster(cluster.kubeconfig, cluster.env(), cluster)
    finally:
        # The cluster is coming down: a signal now must not cut that short and leave its processes.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            cluster.down()
        finally:
            signal.signal(signal.SIGTERM, before)


@pytest.fixture
def own_cluster(real_cluster: RealCluster) -> Cluster:
    """The session's own control plane, for tests that pull the process kubelet's levers."""
    if real_cluster.own is None:
        pytest.skip("DSX_E2E_KUBECONFIG names an existing cluster: no process kubelet to reboot or load")
    return real_cluster.own

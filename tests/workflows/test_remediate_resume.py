"""A remediation stopped part-way is picked up where it stopped when the workflow is submitted again: each
scenario written once and run on both doubles (:mod:`tests.workflows.remediation_doubles`), the simulated
fleet and the emulated API server with its kubelet double."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from steps.cluster import vocabulary as vocab
from tests.emulator.kubelet import EmulatedCluster
from tests.workflows.remediation_doubles import Double, drain_policy, run_to_end, running, start
from workflows.runner import Phase

NODE = "node-01"


def _wait_for(check: Callable[[], bool], timeout: float) -> None:
    ends = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < ends, "timed out"
        time.sleep(0.05)


def _resumed_once(double: Double, stopped_at: str) -> None:
    """The second run said it resumed from ``stopped_at``, and the node was quarantined once only."""
    entries = double.entries()
    resumed = [e for e in entries if e.state == "requested" and "resumed" in e.detail]
    assert resumed and stopped_at in resumed[0].detail
    assert len([e for e in entries if e.state == "quarantined"]) == 1  # not quarantined twice


@pytest.mark.story
@pytest.mark.parametrize("kind", ["sim", "kube"])
@pytest.mark.parametrize("stop_at", ["draining", "awaiting-repair", "recertifying"])
def test_stopped_and_resubmitted_picks_up_where_it_stopped(
    kind: str, stop_at: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster]
) -> None:
    double = start(kind, tmp_path, k8s_cluster, "sim:nodes=4,gpu=h100,blocking-pdb=true", repair_delay=2)
    # The gateway's budget blocks its pod for 1.5 s, then its namespace mode deletes it: the drain lasts.
    policy = drain_policy(namespaces={"serving": {"mode": "delete-after-timeout", "timeout_s": 1.5}})
    with double.repairs():
        with running(double, tmp_path / "first", **{"drain-policy": policy}) as first:
            _wait_for(lambda: double.state() == stop_at, 120)
            first.send_signal(signal.SIGTERM)  # argo terminate: running steps killed, no exit handler
            assert first.wait(60) != 0
        assert double.cordoned_saying_why()
        again = run_to_end(double, tmp_path / "again", 300, **{"drain-policy": policy})
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    double.assert_in_service()
    _resumed_once(double, stop_at)
    double.assert_lost_nothing(deleted="gateway")  # the one deletion the namespace's mode asks for


@pytest.mark.story
@pytest.mark.parametrize("kind", ["sim", "kube"])
def test_stopped_right_after_the_quarantine_step_is_picked_up_from_there(
    kind: str, tmp_path: Path, k8s_cluster: Callable[..., EmulatedCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quarantine state lasts too short a time to stop a run in it by polling: the first run's guard and
    quarantine steps run as that run would run them (the same step functions, its workflow name), and the
    run stops there; the resubmitted workflow picks the node up quarantined, never quarantining it twice."""
    from steps.sentinel import remediate

    double = start(kind, tmp_path, k8s_cluster, "sim:nodes=4,gpu=h100", repair_delay=0.5)
    for name, value in double.step_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(vocab.ENV_OUTPUT_DIR, str(tmp_path / "first"))
    remediate.guard(NODE, "xid", workflow_name="dsx-remediate-first")
    remediate.quarantine(NODE, "xid", workflow_name="dsx-remediate-first")
    assert double.cordoned_saying_why() and double.state() == vocab.NodeState.quarantined.value
    with double.repairs():
        assert double.run(tmp_path / "again") == Phase.Succeeded
    double.assert_in_service()
    _resumed_once(double, "quarantined")
    double.assert_lost_nothing()

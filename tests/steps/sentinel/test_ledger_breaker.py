"""A ledger write that fails never takes a slot in the circuit breaker's window.

The guard of ``dsx-remediate`` asks the breaker to admit the node and then writes the remediation's
``requested`` entry. When that write fails (the ledger's ConfigMap refused, the API gone), no remediation
holds the slot: the admission is withdrawn, so guards failing over and over on many nodes never fill the
window and open the breaker with no node quarantined (the review found a full ledger did just that).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from steps.cluster import connect
from steps.cluster.errors import ClusterError, ForbiddenError
from steps.cluster.sim import SimCluster
from steps.sentinel import ledger, remediate
from steps.sentinel.policy import Breaker, BreakerSettings

NODES = 20  # the breaker's default share (10%) lets 2 in at a time


@pytest.fixture
def refusing(sim_fleet: Callable[[str], str]) -> SimCluster:
    """A fleet whose API refuses to create ConfigMaps (RBAC), once the breaker's own exists: every
    ledger write of a node's first entry fails, every write of the breaker goes through."""
    port = connect(sim_fleet(f"sim:nodes={NODES},gpu=h100,workloads=false"))
    assert isinstance(port, SimCluster)
    Breaker(port).reset("test")  # the breaker's ConfigMap exists: its writes are updates
    port.inject_api(forbid=["create configmaps"])
    return port


def _guard(node: str) -> None:
    remediate.guard(node, "xid", workflow_name=f"dsx-remediate-{node}")


def test_a_failed_requested_entry_leaves_the_node_out_of_the_window(refusing: SimCluster) -> None:
    with pytest.raises(ForbiddenError, match="configmaps"):
        _guard("node-00")
    status = Breaker(refusing).status()
    assert status.state == "closed" and status.admitted == {}
    assert ledger.entries(refusing, "node-00") == []  # nothing was written: nothing to count as an attempt


@pytest.mark.story
def test_guards_failing_on_every_node_never_open_the_breaker(refusing: SimCluster) -> None:
    for index in range(NODES):
        with pytest.raises(ClusterError):
            _guard(f"node-{index:02d}")
        for _ in range(2):  # the workflow's retries of the step (retryPolicy OnError)
            with pytest.raises(ClusterError):
                _guard(f"node-{index:02d}")
    status = Breaker(refusing).status()
    assert status.state == "closed", status.tripped_reason
    assert status.admitted == {}
    # Once the ledger takes writes again, remediation goes on: the breaker admits as before.
    refusing.inject_api(forbid=[])
    _guard("node-05")
    assert list(Breaker(refusing).status().admitted) == ["node-05"]
    assert [e.state for e in ledger.entries(refusing, "node-05")] == ["requested"]


def test_an_earlier_admission_of_the_node_stays_when_its_retry_fails(refusing: SimCluster) -> None:
    """A resubmitted remediation whose node is still in the window from its first run: the retry's
    failed write withdraws only what the retry added, which is nothing."""
    before = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    first = Breaker(refusing, BreakerSettings(), clock=lambda: before)
    assert first.admit("node-03", NODES)[0]
    with pytest.raises(ForbiddenError):
        _guard("node-03")
    admitted = Breaker(refusing).status().admitted
    assert list(admitted) == ["node-03"] and admitted["node-03"].startswith(before.strftime("%Y-%m-%dT%H:%M"))


def test_withdraw_takes_back_only_an_admission_made_since() -> None:
    port = connect("sim:nodes=4,gpu=h100,workloads=false")
    now = [dt.datetime(2025, 1, 1, 12, 0, 0, 500_000, tzinfo=dt.UTC)]
    breaker = Breaker(port, BreakerSettings(max_share=0.5), clock=lambda: now[0])
    assert breaker.admit("node-00", 4)[0]
    asked = now[0] + dt.timedelta(seconds=30)
    now[0] = asked
    assert breaker.admit("node-01", 4)[0]
    assert not breaker.withdraw("node-00", asked)  # admitted before: another remediation's slot
    assert breaker.withdraw("node-01", asked)  # admitted to the second, after the microseconds asked
    assert not breaker.withdraw("node-01", asked)  # already gone
    assert list(breaker.status().admitted) == ["node-00"]

"""Contract: dsx's state ConfigMaps (optimistic concurrency) and per-node Lease locks."""

from __future__ import annotations

import threading

from tests.steps.cluster.conftest import Backend


def _bump(data: dict[str, str]) -> dict[str, str]:
    return {**data, "count": str(int(data.get("count", "0")) + 1)}


def test_contract_state_starts_empty_and_keeps_what_is_written(backend: Backend) -> None:
    port = backend.port
    assert port.get_state("dsx-remediation") == {}
    assert port.update_state("dsx-remediation", dict) == {}
    assert port.get_object("v1", "ConfigMap", "dsx-remediation", port.namespace) is None  # nothing to keep
    assert port.update_state("dsx-remediation", lambda d: {**d, "node-03": "draining"}) == {
        "node-03": "draining"
    }
    assert port.update_state("dsx-remediation", lambda d: {**d, "node-04": "quarantined"}) == {
        "node-03": "draining",
        "node-04": "quarantined",
    }
    removed = port.update_state("dsx-remediation", lambda d: {k: v for k, v in d.items() if k != "node-03"})
    assert removed == {"node-04": "quarantined"}
    assert port.get_state("dsx-remediation") == {"node-04": "quarantined"}
    stored = port.get_object("v1", "ConfigMap", "dsx-remediation", port.namespace)
    assert stored is not None and stored["data"] == {"node-04": "quarantined"}


def test_contract_labelled_state_is_found_by_its_labels(backend: Backend) -> None:
    """A state ConfigMap written with labels carries them from its create on, keeps labels it had, and
    a label selector finds it among the others."""
    port = backend.port
    mine = {"dsx.dev/ledger": "true", "dsx.dev/node": "node-03"}
    port.update_state("a", lambda d: {**d, "k": "1"}, labels=mine)
    port.update_state("b", lambda d: {**d, "k": "2"}, labels={**mine, "dsx.dev/node": "node-04"})
    port.update_state("plain", lambda d: {**d, "k": "3"})
    port.patch_object("v1", "ConfigMap", "a", {"metadata": {"labels": {"team": "ops"}}}, port.namespace)
    assert port.update_state("a", lambda d: {**d, "k": "5"}, labels=mine) == {"k": "5"}

    def listed(selector: str) -> list[str]:
        return [o["metadata"]["name"] for o in port.list_objects("v1", "ConfigMap", port.namespace, selector)]

    assert listed("dsx.dev/ledger=true") == ["a", "b"]
    assert listed("dsx.dev/ledger=true,dsx.dev/node=node-03") == ["a"]
    stored = port.get_object("v1", "ConfigMap", "a", port.namespace)
    assert stored is not None and stored["metadata"]["labels"] == {**mine, "team": "ops"}
    # Labels asked of a ConfigMap made without them are added even when the data stays as it is.
    assert port.update_state("plain", dict, labels={"dsx.dev/ledger": "true"}) == {"k": "3"}
    assert listed("dsx.dev/ledger=true") == ["a", "b", "plain"]
    # Nothing to keep is still no object, labels or not.
    assert port.update_state("none", dict, labels=mine) == {}
    assert port.get_object("v1", "ConfigMap", "none", port.namespace) is None


def test_contract_concurrent_updates_lose_nothing(backend: Backend) -> None:
    ports = [backend.new_port() for _ in range(4)]
    ports[0].update_state("counter", lambda d: {"count": "0"})

    def work(index: int) -> None:
        for _ in range(10):
            ports[index].update_state("counter", _bump)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert backend.port.get_state("counter") == {"count": "40"}


def test_contract_update_retries_after_a_conflict_and_applies_once(backend: Backend) -> None:
    port = backend.port
    port.update_state("counter", lambda d: {"count": "0"})
    backend.inject_conflicts(3)
    assert port.update_state("counter", _bump) == {"count": "1"}
    assert port.get_state("counter") == {"count": "1"}
    assert backend.injected() >= 3


def test_contract_lease_lock_excludes_others_until_released_or_expired(backend: Backend) -> None:
    port, clock = backend.port, backend.clock
    assert port.acquire_lock("node-02", "remediate-abc", ttl_seconds=60)
    assert port.acquire_lock("node-02", "remediate-abc", ttl_seconds=60)  # the holder may take it again
    assert not port.acquire_lock("node-02", "remediate-xyz", ttl_seconds=60)
    assert not port.renew_lock("node-02", "remediate-xyz", ttl_seconds=60)
    assert not port.release_lock("node-02", "remediate-xyz")

    clock.advance(50)
    assert port.renew_lock("node-02", "remediate-abc", ttl_seconds=60)
    clock.advance(50)
    assert not port.acquire_lock("node-02", "remediate-xyz", ttl_seconds=60)  # renewed 50 s ago

    assert port.release_lock("node-02", "remediate-abc")
    assert port.acquire_lock("node-02", "remediate-xyz", ttl_seconds=30)
    clock.advance(31)
    assert port.acquire_lock("node-02", "remediate-abc", ttl_seconds=30)  # xyz let it lapse
    assert not port.renew_lock("node-02", "remediate-xyz", ttl_seconds=30)
    lease = port.get_object("coordination.k8s.io/v1", "Lease", "dsx-node-node-02", port.namespace)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "remediate-abc"
    assert lease["spec"]["leaseTransitions"] == 2
    assert lease["spec"]["renewTime"] == "2025-03-01T12:02:11.000000Z"


def test_contract_only_one_of_many_racing_holders_gets_the_lock(backend: Backend) -> None:
    ports = [backend.new_port() for _ in range(6)]
    won: list[str] = []

    def race(index: int) -> None:
        if ports[index].acquire_lock("node-05", f"holder-{index}", ttl_seconds=60):
            won.append(f"holder-{index}")

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    lease = backend.port.get_object(
        "coordination.k8s.io/v1", "Lease", "dsx-node-node-05", backend.port.namespace
    )
    assert lease is not None and lease["spec"]["holderIdentity"] == won[0]

"""Contract: API errors, conflicts and RBAC refusals, and the acceptance sequence under faults."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from steps.cluster import ApiUnavailableError, ForbiddenError, Pod
from tests.steps.cluster.conftest import FAST, Backend


def test_contract_idempotent_calls_ride_out_a_burst_of_server_errors(backend: Backend) -> None:
    backend.inject_errors(FAST.attempts - 1)
    assert len(backend.port.list_nodes()) == 6
    backend.inject_errors(FAST.attempts - 1)
    assert backend.port.cordon("node-01", "burst").node.unschedulable
    assert backend.injected() >= 2 * (FAST.attempts - 1)


def test_contract_a_longer_burst_fails_naming_the_call(backend: Backend) -> None:
    backend.inject_errors(FAST.attempts)
    with pytest.raises(ApiUnavailableError) as caught:
        backend.port.get_node("node-02")
    assert str(caught.value).startswith("get_node node/node-02: the API answered 500")
    assert f"gave up after {FAST.attempts} tries" in str(caught.value)


def test_contract_creating_an_object_is_not_retried_blindly(backend: Backend) -> None:
    backend.inject_errors(1)
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "once", "namespace": "dsx"}}
    with pytest.raises(ApiUnavailableError, match=r"create_object configmap/dsx/once: .*not retried"):
        backend.port.create_object(manifest)
    assert backend.port.get_object("v1", "ConfigMap", "once", "dsx") is None
    assert backend.port.create_object(manifest)["metadata"]["name"] == "once"


def test_contract_rbac_refusal_names_the_node_and_the_call(backend: Backend) -> None:
    backend.forbid("patch", "nodes")
    with pytest.raises(ForbiddenError) as caught:
        backend.port.cordon("node-03", "xid 79")
    message = str(caught.value)
    assert message.startswith("cordon node/node-03: forbidden (403): ")
    assert 'cannot patch resource "nodes"' in message
    assert not backend.port.get_node("node-03").unschedulable
    backend.forbid("create", "pods/eviction")
    with pytest.raises(ForbiddenError, match=r"^evict pod/serving/inference-5d8f7c-0: forbidden"):
        backend.port.evict("serving/inference-5d8f7c-0")


def _end_state(backend: Backend) -> dict[str, Any]:
    nodes = [n.model_dump(exclude={"resource_version"}) for n in backend.port.list_nodes()]
    objects = backend.port.list_objects("v1", "Pod")
    # uids are the server's own, and a replacement's name its controller's, random on a real one; so is a
    # replacement's node, the real scheduler's pick among equally good nodes (a calm and a stormy cycle
    # once put the evicted inference pod's replacement on node-05 and node-01): of a ReplicaSet's pods,
    # only whether each runs on the drained node is compared
    pods = sorted(_seen(Pod.from_manifest(o)) for o in objects)
    return {"nodes": nodes, "pods": pods}


def _seen(pod: Pod) -> str:
    if pod.owner_kind != "ReplicaSet":
        return pod.model_dump_json(exclude={"uid", "name"})
    fields = pod.model_dump(mode="json", exclude={"uid", "name", "node"})
    return json.dumps({**fields, "on_drained_node": pod.node == "node-04"}, sort_keys=True)


def _drain_cycle(backend: Backend, before_each: Callable[[], None]) -> list[str]:
    """Cordon node-04, evict every pod that is not a DaemonSet's, uncordon: the acceptance sequence."""
    port = backend.port
    before_each()
    port.cordon("node-04", "acceptance")
    outcomes = []
    before_each()
    for pod in port.pods_on("node-04"):
        if pod.daemonset:
            continue
        before_each()
        outcomes.append(f"{pod.ref} {port.evict(pod).outcome}")
    before_each()
    port.uncordon("node-04")
    return outcomes


def test_contract_cordon_evict_uncordon_under_errors_and_conflicts_ends_as_without(
    make_backend: Callable[..., Backend],
) -> None:
    calm = make_backend()
    calm_outcomes = _drain_cycle(calm, lambda: None)
    calm.settle()
    calm_end, calm_injected = _end_state(calm), calm.injected()
    stormy = make_backend()  # the real API server holds one fleet at a time: the calm one is done

    def storm() -> None:
        stormy.inject_errors(3)
        stormy.inject_conflicts(2)

    stormy_outcomes = _drain_cycle(stormy, storm)
    stormy.settle()
    assert calm_outcomes == [
        "serving/gateway-7f6d5b-1 blocked",
        "serving/inference-5d8f7c-2 evicted",
    ]
    assert stormy_outcomes == calm_outcomes
    assert _end_state(stormy) == calm_end
    assert calm_injected == 0
    assert stormy.injected() >= 12  # the storm really hit: 500s and 409s were answered
    assert stormy.conflicts() >= 4
    node = stormy.port.get_node("node-04")
    assert not node.unschedulable and "dsx.dev/cordoned-by" not in node.annotations

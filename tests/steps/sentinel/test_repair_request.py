"""dsx-remediate's repair request: the action, the GPUs and the evidence, read from the condition the real
agent wrote, as a label on the node and a ConfigMap an operator's tooling reads; gone once the node is
back in service or a person takes the node back, kept when it is escalated."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import pytest

from steps.cluster import vocabulary as vocab
from steps.cluster.sim import FileStore, SimCluster
from steps.errors import DsxError
from steps.sentinel import ledger, remediate, repair
from steps.sentinel.agent import Agent
from steps.sentinel.catalogue import load_catalogue
from steps.sentinel.probes import NodeProbes
from tests import yamltext

NODE = "node-01"


def _sentinel_pass(port: SimCluster) -> None:
    """One pass of the real agent of :data:`NODE` over the fleet's hardware: it writes the conditions."""
    catalogue = load_catalogue()
    probes = NodeProbes(NODE, catalogue, port, lambda: dt.datetime.now(dt.UTC), 8)
    Agent(NODE, port, probes.probes(), catalogue).run_once()


@pytest.fixture
def faulty(tmp_path: Path, sim_fleet: Callable[[str], str]) -> SimCluster:
    """node-01 with XID 79 on GPU 3 and uncorrectable ECC errors on GPU 5, seen by its agent, and
    quarantined by remediation (cordoned as the sentinel's, drained): the step environment set."""
    sim_fleet(f"sim:nodes=2,gpu=h100,workloads=false,faults={NODE}:xid=79@3;{NODE}:ecc=2@5")
    port = SimCluster(FileStore(tmp_path / "fleet.json"))
    _sentinel_pass(port)
    port.cordon(NODE, "remediation", by=remediate.OWNER)
    port.set_labels(NODE, {vocab.LABEL_STATE: vocab.NodeState.draining.value})
    return port


def test_the_request_names_the_action_the_gpus_and_the_evidence(faulty: SimCluster) -> None:
    told = remediate.request_repair(NODE, "xid", workflow_name="dsx-remediate-abcde")
    node = faulty.get_node(NODE)
    request = faulty.get_object("v1", "ConfigMap", f"dsx-repair-{NODE}", faulty.namespace)
    assert request is not None and request["metadata"]["labels"][vocab.LABEL_REPAIR] == "reboot"
    body = yamltext.load(request["data"]["request.yaml"])
    gpu = faulty.node_report(NODE).gpus[3]
    assert (body["kind"], body["node"], body["check"], body["workflow"]) == (
        "RepairRequest", NODE, "xid", "dsx-remediate-abcde",
    )  # fmt: skip
    assert (body["action"], body["severity"], body["bootId"]) == ("reboot", "fatal", node.node_info.boot_id)
    assert body["gpus"] == [{"index": 3, "uuid": gpu.uuid, "pci": "0000:48:00"}]
    (finding,) = body["findings"]
    assert finding["action"] == "reboot" and "XID 79" in finding["message"]
    assert body["condition"]["type"] == vocab.CONDITION_SENTINEL["xid"]
    (seen,) = [e for e in body["events"] if e["reason"] == "DsxGpuXid"]  # the agent's Event, as evidence
    assert seen["type"] == "Warning" and "XID 79" in seen["message"] and body.get("eventsNote", "") == ""
    assert node.labels[vocab.LABEL_REPAIR] == "reboot"
    assert node.labels[vocab.LABEL_STATE] == vocab.NodeState.awaiting_repair.value
    assert f"reboot of GPU 3 ({gpu.uuid})" in told
    (entry,) = [e for e in ledger.entries(faulty, NODE) if e.state == vocab.NodeState.awaiting_repair.value]
    assert entry.detail.startswith(f"repair requested: reboot of GPU 3 ({gpu.uuid})")


def test_the_ecc_check_asks_to_reset_its_own_gpu(faulty: SimCluster) -> None:
    remediate.request_repair(NODE, "ecc", workflow_name="w")
    body = yamltext.load(
        faulty.get_object("v1", "ConfigMap", f"dsx-repair-{NODE}", faulty.namespace)["data"]["request.yaml"]  # type: ignore[index]
    )
    assert body["action"] == "reset-gpu" and [g["index"] for g in body["gpus"]] == [5]


def test_a_person_taking_the_node_back_withdraws_the_request(faulty: SimCluster) -> None:
    remediate.request_repair(NODE, "xid", workflow_name="w")
    faulty.uncordon(NODE, by=remediate.OWNER)
    with pytest.raises(DsxError, match="remediation cancelled"):
        remediate.request_repair(NODE, "xid", workflow_name="w")
    assert vocab.LABEL_REPAIR not in faulty.get_node(NODE).labels
    assert faulty.get_object("v1", "ConfigMap", f"dsx-repair-{NODE}", faulty.namespace) is None


def test_findings_and_gpus_are_read_as_the_agent_writes_them() -> None:
    message = (
        "fatal (reboot): GPU 3 (GPU-aa, PCI 0000:48:00): XID 79 fell off; pid=7; "
        "degraded (reset-gpu): GPU 5 (GPU-bb): 2 uncorrectable ECC errors"
    )
    found = repair.findings(message)
    assert [(f.severity, f.action) for f in found] == [("fatal", "reboot"), ("degraded", "reset-gpu")]
    assert found[0].message == "GPU 3 (GPU-aa, PCI 0000:48:00): XID 79 fell off; pid=7"  # its own "; " kept
    assert repair.gpus_named(message) == [
        repair.RepairGpu(index=3, uuid="GPU-aa", pci="0000:48:00"),
        repair.RepairGpu(index=5, uuid="GPU-bb"),
    ]
    assert (
        repair.request_name("n" * 250).startswith("dsx-repair-")
        and len(repair.request_name("n" * 250)) <= 253
    )


def test_events_the_account_may_not_read_are_said_missing_and_the_request_made(faulty: SimCluster) -> None:
    faulty.inject_api(forbid=["list events"])
    remediate.request_repair(NODE, "xid", workflow_name="w")
    body = yamltext.load(
        faulty.get_object("v1", "ConfigMap", f"dsx-repair-{NODE}", faulty.namespace)["data"]["request.yaml"]  # type: ignore[index]
    )
    assert body["events"] == [] and body["eventsNote"].startswith(
        f"the Events about {NODE} could not be read"
    )
    assert body["action"] == "reboot"

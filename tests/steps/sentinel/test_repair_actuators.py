"""The repairs that act: a GPU reset by the node's own agent, a reboot asked of kured through its sentinel
file, a repair handed to the operator's WorkflowTemplate; each one's outcome read by dsx-remediate's repair
wait and kept in the ledger. The real agent runs over the simulated fleet's hardware; remediation's steps
write through the simulated fleet's port or, for ``kube``, through the real client to the emulated API
server."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from steps.cluster import ClusterPort, load_fleet, shareable
from steps.cluster import vocabulary as vocab
from steps.cluster.health import GpuResetError
from steps.cluster.pod import Pod
from steps.cluster.sim import FileStore, MemoryStore, SimCluster
from steps.cluster.sim import repair as sim_repair
from steps.errors import DsxError, InputError
from steps.sentinel import ledger, remediate, webhook
from steps.sentinel.actuator import KURED, REBOOT, RESET, RepairActuator
from steps.sentinel.agent import Agent
from steps.sentinel.catalogue import FaultCatalogue, load_catalogue
from steps.sentinel.kernel_log import Boot
from steps.sentinel.node import Sentinel, build_sentinel
from steps.sentinel.outcome import outcome_of
from steps.sentinel.probes import NodeProbes
from tests.cli import dsx_here
from tests.emulator.apiserver import Emulator
from tests.steps.sentinel.conftest import FAST
from tests.steps.sentinel.fake_nvml import FakeNvml, gpus

NODE = "node-01"
XID_79 = f"sim:nodes=2,gpu=h100,workloads=false,repair=never,faults={NODE}:xid=79@3"


def _catalogue(tmp_path: Path, xid_79: str = "") -> FaultCatalogue:
    """The shipped catalogue; with ``xid_79``, XID 79's action overridden to it."""
    if not xid_79:
        return load_catalogue()
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(
        "apiVersion: dsx.dev/v1alpha1\nkind: FaultOverrides\n"
        f"entries:\n  - {{check: xid, code: '79', action: {xid_79}}}\n"
    )
    return load_catalogue(overrides=overrides)


def _sentinel(
    port: ClusterPort, hardware: SimCluster, catalogue: FaultCatalogue, **actions: object
) -> Sentinel:
    """The real agent of :data:`NODE` over the fleet's hardware, writing through ``port``, reading its
    node at every pass, with the actuator ``actions`` turn on."""
    probes = NodeProbes(NODE, catalogue, hardware, lambda: dt.datetime.now(dt.UTC), 8)
    agent = Agent(NODE, port, probes.probes(), catalogue, probe_timeout=None, node_read_s=0)
    return Sentinel(agent, probes, None, None, RepairActuator(NODE, port, probes, **actions))  # type: ignore[arg-type]


def _quarantined(port: ClusterPort) -> None:
    """What quarantine and drain leave: cordoned as remediation's, ``dsx.dev/state=draining``."""
    port.cordon(NODE, "remediation", by=remediate.OWNER)
    port.set_labels(NODE, {vocab.LABEL_STATE: vocab.NodeState.draining.value})


def _details(port: ClusterPort) -> list[str]:
    return [f"{e.state}: {e.detail}" for e in ledger.entries(port, NODE)]


Doubles = tuple[ClusterPort, SimCluster, Emulator | None]


@pytest.fixture
def file_fleet(sim_fleet: Callable[[str], str], tmp_path: Path) -> SimCluster:
    """A simulated fleet shared through a file (XID 79 on GPU 3 of node-01; no provider repairs), the
    remediation steps pointed at it: both the cluster and the hardware."""
    sim_fleet(XID_79)
    return SimCluster(FileStore(tmp_path / "fleet.json"))


@pytest.fixture(params=["sim", "kube"])
def doubles(request: pytest.FixtureRequest, tmp_path: Path) -> Doubles:
    """(the cluster, the hardware, the emulator): the simulated fleet as both, or, for ``kube``, the
    emulated API server (seeded with the fleet's objects, reached through the real client by the agent and
    by remediation's steps) with the fleet as the hardware only."""
    if request.param == "sim":
        request.getfixturevalue("sim_fleet")(XID_79)
        fleet = SimCluster(FileStore(tmp_path / "fleet.json"))
        return fleet, fleet, None
    port = request.getfixturevalue("kube_fleet")(XID_79, retry=FAST)
    return port, SimCluster(MemoryStore(load_fleet(XID_79))), request.getfixturevalue("k8s_emulator")


# ----------------------------------------------------------------------------- reset-gpu


def test_an_xid_79_whose_action_is_reset_gpu_is_reset_by_the_agent_not_rebooted(
    doubles: Doubles, tmp_path: Path
) -> None:
    port, hardware, _ = doubles
    catalogue = _catalogue(tmp_path, xid_79="reset-gpu")
    sentinel = _sentinel(port, hardware, catalogue, reset_gpus=True)
    sentinel.run_once()  # the agent finds XID 79 on GPU 3: its condition asks for reset-gpu
    boot = port.get_node(NODE).node_info.boot_id
    gpu = hardware.node_report(NODE).gpus[3]
    _quarantined(port)

    told = remediate.request_repair(NODE, "xid", workflow_name="dsx-remediate-abcde")
    assert f"reset-gpu of GPU 3 ({gpu.uuid})" in told
    asked = port.get_node(NODE)
    assert asked.annotations[vocab.ANNOTATION_REPAIR_GPUS] == gpu.uuid
    assert remediate.repair_problems(asked, "xid") == [
        f"still on boot {boot} (no reboot)",
        f"condition {vocab.CONDITION_SENTINEL['xid']} still True",
    ]

    sentinel.run_once()  # reads its node: resets GPU 3, probes again at once
    node = port.get_node(NODE)
    outcome = outcome_of(node)
    assert outcome is not None and (outcome.actuator, outcome.phase) == (RESET, "Succeeded")
    assert f"GPU 3 ({gpu.uuid}) was reset" in outcome.message
    assert node.condition(vocab.CONDITION_SENTINEL["xid"]).status == "False"  # type: ignore[union-attr]
    assert hardware.node_report(NODE).gpus[3].xids == ()

    assert remediate.repair_wait(NODE, "xid", "30s", workflow_name="w").endswith(f"(boot {boot})")
    told = remediate.repaired(NODE, "xid", workflow_name="w")
    assert f"GPUs reset, boot {boot} kept" in told
    node = port.get_node(NODE)
    assert node.node_info.boot_id == boot  # reset, not rebooted
    assert node.labels[vocab.LABEL_STATE] == vocab.NodeState.recertifying.value
    details = _details(port)
    assert any(
        d.startswith(f"awaiting-repair: repair requested: reset-gpu of GPU 3 ({gpu.uuid})") for d in details
    )
    assert any(d.startswith(f"awaiting-repair: repair by {RESET}: Succeeded") for d in details)
    assert details[-1] == f"recertifying: repaired: GPUs reset, boot {boot} kept"
    sentinel.run_once()
    assert [c.method for c in hardware.calls() if c.method == "reset_gpu"] == ["reset_gpu"]  # once only


def test_a_gpu_a_process_still_holds_is_not_reset_and_the_node_is_escalated_saying_by_what(
    file_fleet: SimCluster, tmp_path: Path
) -> None:
    port = file_fleet
    catalogue = _catalogue(tmp_path, xid_79="reset-gpu")
    sentinel = _sentinel(port, port, catalogue, reset_gpus=True)
    sentinel.run_once()
    _quarantined(port)
    with port.store.transaction() as fleet:  # a job the drain did not reach (a bare pod, say) holds GPUs
        fleet.pods["team/stray"] = Pod(name="stray", namespace="team", uid="u-stray", node=NODE, gpus=8)
    remediate.request_repair(NODE, "xid", workflow_name="w")
    sentinel.run_once()
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and outcome.phase == "Failed"
    assert "is held by pod team/stray: not reset" in outcome.message
    assert port.node_report(NODE).gpus[3].xids == (79,)  # untouched
    assert remediate.repair_wait(NODE, "xid", "30s", workflow_name="w").startswith(
        f"{NODE}: the repair failed"
    )
    with pytest.raises(DsxError, match="escalated: the repair failed: agent/reset-gpu failed: GPU 3"):
        remediate.repaired(NODE, "xid", workflow_name="w")
    assert port.get_node(NODE).labels[vocab.LABEL_STATE] == vocab.NodeState.escalated.value
    assert any("repair by agent/reset-gpu: Failed" in d for d in _details(port))


def test_an_agent_not_given_reset_gpu_leaves_the_request_to_others(
    file_fleet: SimCluster, tmp_path: Path
) -> None:
    port = file_fleet
    catalogue = _catalogue(tmp_path, xid_79="reset-gpu")
    sentinel = _sentinel(port, port, catalogue)  # no actuator turned on
    sentinel.run_once()
    _quarantined(port)
    remediate.request_repair(NODE, "xid", workflow_name="w")
    sentinel.run_once()
    assert outcome_of(port.get_node(NODE)) is None
    assert port.node_report(NODE).gpus[3].xids == (79,)


# ----------------------------------------------------------------------------- reboot through kured


def _reboot(port: ClusterPort, hardware: SimCluster, emulator: Emulator | None) -> None:
    """The node reboots: its hardware as a repair leaves it, a new boot id; on the emulated API server the
    new boot id is what the kubelet of the new boot reports."""
    with hardware.store.transaction() as fleet:
        fleet.repair = "ok"
        fleet.repairs_due[NODE] = 0.0
        sim_repair.settle(fleet, time.time())
    if emulator is not None:
        node = port.get_object("v1", "Node", NODE)
        assert node is not None
        node["status"]["nodeInfo"]["bootID"] = hardware.get_node(NODE).node_info.boot_id
        emulator.seed([node])


def test_a_reboot_goes_through_kureds_sentinel_file_when_the_chart_selects_kured(
    doubles: Doubles, tmp_path: Path
) -> None:
    port, hardware, emulator = doubles
    catalogue = _catalogue(tmp_path)
    kured = tmp_path / "host-run" / "reboot-required"
    sentinel = _sentinel(port, hardware, catalogue, kured_sentinel=kured)
    sentinel.run_once()
    _quarantined(port)
    boot = port.get_node(NODE).node_info.boot_id
    assert "reboot of GPU 3" in remediate.request_repair(NODE, "xid", workflow_name="w")
    assert not kured.exists()

    sentinel.run_once()
    assert kured.read_text().startswith(f"dsx-remediate asks for a reboot of {NODE}")
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and (outcome.actuator, outcome.phase) == (KURED, "Running")
    assert f"{KURED} not done" in remediate.repair_problems(port.get_node(NODE), "xid")[0]
    sentinel.run_once()  # asked once: the file is not written again, nor the outcome
    assert outcome_of(port.get_node(NODE)) == outcome

    kured.unlink()  # kured: the file there, it reboots the node; the file, in tmpfs, goes with the boot
    _reboot(port, hardware, emulator)
    rebooted = port.get_node(NODE).node_info.boot_id
    assert rebooted != boot
    after = _sentinel(port, hardware, catalogue, kured_sentinel=kured)  # the agent of the new boot
    after.run_once()
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and (outcome.phase, outcome.message) == (
        "Succeeded",
        f"rebooted: boot {rebooted} (was {boot})",
    )
    assert not kured.exists()  # the new boot's agent asks nothing more
    waited = remediate.repair_wait(NODE, "xid", "30s", workflow_name="w")
    assert waited == f"{NODE}: repaired (boot {rebooted})"
    remediate.repaired(NODE, "xid", workflow_name="w")
    details = _details(port)
    assert f"awaiting-repair: repair by {KURED}: Succeeded at {outcome.at}: {outcome.message}" in details
    assert details[-1] == f"recertifying: repaired: boot {rebooted}"


# ----------------------------------------------------------------------------- the agent's own reboot


def _reboot_command(folder: Path, code: int = 0, said: str = "") -> list[str]:
    """A stand-in for the chart's reboot command: records each run, says ``said``, exits ``code``."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "reboot"
    program.write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"open({str(folder / 'runs')!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"sys.stderr.write({said!r})\nsys.exit({code})\n"
    )
    program.chmod(0o755)
    return [str(program), "-m/proc/1/ns/mnt", "--", "/bin/systemctl", "reboot"]


def test_the_agent_reboots_its_node_itself_when_the_chart_selects_its_own_reboot(
    doubles: Doubles, tmp_path: Path
) -> None:
    port, hardware, emulator = doubles
    catalogue = _catalogue(tmp_path)
    command = _reboot_command(tmp_path / "bin")
    sentinel = _sentinel(port, hardware, catalogue, reboot_command=command)
    sentinel.run_once()
    _quarantined(port)
    boot = port.get_node(NODE).node_info.boot_id
    assert "reboot of GPU 3" in remediate.request_repair(NODE, "xid", workflow_name="w")
    assert not (tmp_path / "bin" / "runs").exists()

    sentinel.run_once()
    assert (tmp_path / "bin" / "runs").read_text() == "-m/proc/1/ns/mnt -- /bin/systemctl reboot\n"
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and (outcome.actuator, outcome.phase) == (REBOOT, "Running")
    assert outcome.message == f"rebooting: {' '.join(command)}"
    assert f"{REBOOT} not done" in remediate.repair_problems(port.get_node(NODE), "xid")[0]
    sentinel.run_once()  # a reboot under way is not asked for again
    assert (tmp_path / "bin" / "runs").read_text().count("reboot") == 1

    _reboot(port, hardware, emulator)
    rebooted = port.get_node(NODE).node_info.boot_id
    _sentinel(port, hardware, catalogue, reboot_command=command).run_once()  # the agent of the new boot
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and (outcome.phase, outcome.message) == (
        "Succeeded",
        f"rebooted: boot {rebooted} (was {boot})",
    )
    assert (tmp_path / "bin" / "runs").read_text().count("reboot") == 1
    waited = remediate.repair_wait(NODE, "xid", "30s", workflow_name="w")
    assert waited == f"{NODE}: repaired (boot {rebooted})"
    remediate.repaired(NODE, "xid", workflow_name="w")
    said = f"repair by {REBOOT}: Succeeded at {outcome.at}: {outcome.message}"
    assert f"awaiting-repair: {said}" in _details(port)


def test_a_reboot_command_that_fails_ends_the_wait_and_escalates_with_what_it_said(
    doubles: Doubles, tmp_path: Path
) -> None:
    port, hardware, _ = doubles
    catalogue = _catalogue(tmp_path)
    command = _reboot_command(tmp_path / "bin", 1, "Failed to connect to bus: No such file or directory\n")
    sentinel = _sentinel(port, hardware, catalogue, reboot_command=command)
    sentinel.run_once()
    _quarantined(port)
    remediate.request_repair(NODE, "xid", workflow_name="w")
    sentinel.run_once()
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and (outcome.actuator, outcome.phase) == (REBOOT, "Failed")
    assert (
        outcome.message
        == f"{' '.join(command)} exited 1: Failed to connect to bus: No such file or directory"
    )
    sentinel.run_once()  # a failed request is not tried again
    assert (tmp_path / "bin" / "runs").read_text().count("reboot") == 1
    waited = remediate.repair_wait(NODE, "xid", "30s", workflow_name="w")  # ends at once
    assert waited == f"{NODE}: the repair failed: {REBOOT}: {outcome.message}"
    with pytest.raises(DsxError, match=f"escalated: the repair failed: {REBOOT} failed: .* exited 1"):
        remediate.repaired(NODE, "xid", workflow_name="w")


def test_no_reboot_is_run_before_its_running_outcome_is_written(
    file_fleet: SimCluster, tmp_path: Path
) -> None:
    """A reboot may end the agent before it writes anything after: with the outcome not written (the API
    server refusing the node's patch), nothing runs; the next read of the node, answered, runs it once."""
    port = file_fleet
    catalogue = _catalogue(tmp_path)
    command = _reboot_command(tmp_path / "bin")
    actuator = RepairActuator(
        NODE,
        port,
        NodeProbes(NODE, catalogue, port, lambda: dt.datetime.now(dt.UTC), 8),
        reboot_command=command,
    )
    _sentinel(port, port, catalogue).run_once()
    _quarantined(port)
    remediate.request_repair(NODE, "xid", workflow_name="w")
    port.inject_api(forbid=["patch nodes"])
    actuator.act(port.get_node(NODE))
    assert not (tmp_path / "bin" / "runs").exists() and outcome_of(port.get_node(NODE)) is None
    port.inject_api(forbid=[])
    actuator.act(port.get_node(NODE))
    assert (tmp_path / "bin" / "runs").read_text().count("reboot") == 1
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and (outcome.actuator, outcome.phase) == (REBOOT, "Running")


def test_kured_and_the_agents_own_reboot_are_not_both_chosen(tmp_path: Path) -> None:
    hardware = SimCluster(MemoryStore(load_fleet("sim:nodes=1,gpu=h100")))
    probes = NodeProbes(NODE, _catalogue(tmp_path), hardware, lambda: dt.datetime.now(dt.UTC), 8)
    with pytest.raises(ValueError, match="through kured or the agent's own command, not both"):
        RepairActuator(NODE, hardware, probes, kured_sentinel=tmp_path / "x", reboot_command=["reboot"])


# ----------------------------------------------------------------------------- the operator's template


def _workflows(port: ClusterPort) -> list[dict[str, object]]:
    return port.list_objects("argoproj.io/v1alpha1", "Workflow", namespace=port.namespace)


def _parameters(workflow: dict[str, object]) -> dict[str, str]:
    spec = workflow["spec"]
    assert isinstance(spec, dict)
    return {p["name"]: p["value"] for p in spec["arguments"]["parameters"]}


@pytest.mark.parametrize("ending", ["Failed", "deleted"])
def test_a_repair_handed_to_the_operators_template_ends_as_its_workflow_ends(
    doubles: Doubles, tmp_path: Path, ending: str
) -> None:
    port, hardware, _ = doubles
    catalogue = _catalogue(tmp_path, xid_79="replace")
    _sentinel(port, hardware, catalogue).run_once()
    _quarantined(port)
    gpu = hardware.node_report(NODE).gpus[3]

    told = remediate.request_repair(
        NODE, "xid", workflow_name="dsx-remediate-abcde", repair_template="site-replace"
    )
    (workflow,) = _workflows(port)
    name = workflow["metadata"]["name"]  # type: ignore[index]
    assert told.endswith(f"repair handed to WorkflowTemplate site-replace: Workflow {name}")
    assert workflow["spec"]["workflowTemplateRef"] == {"name": "site-replace"}  # type: ignore[index]
    node = port.get_node(NODE)
    assert _parameters(workflow) == {
        "node": NODE,
        "action": "replace",
        "gpus": gpu.uuid,
        "request": f"dsx-repair-{NODE}",
        "requested-at": node.annotations[vocab.ANNOTATION_REPAIR_REQUESTED_AT],
        "boot-id": node.node_info.boot_id,
        "workflow": "dsx-remediate-abcde",
    }
    assert workflow["metadata"]["labels"][vocab.LABEL_REPAIR] == "replace"  # type: ignore[index]
    outcome = outcome_of(node)
    assert outcome is not None and (outcome.actuator, outcome.phase) == (f"workflow/{name}", "Running")
    # The step retried: the request stands, the template is not called twice.
    assert "already requested" in remediate.request_repair(NODE, "xid", repair_template="site-replace")
    assert len(_workflows(port)) == 1

    if ending == "deleted":
        port.delete_object("argoproj.io/v1alpha1", "Workflow", str(name), port.namespace)
        said = f"Workflow {name} is gone"
    else:
        port.patch_object(
            "argoproj.io/v1alpha1",
            "Workflow",
            str(name),
            {"status": {"phase": "Failed", "message": "the provider refused: no spare"}},
            port.namespace,
        )
        said = f"Workflow {name} Failed: the provider refused: no spare"
    waited = remediate.repair_wait(NODE, "xid", "30s", workflow_name="w")
    assert waited == f"{NODE}: the repair failed: workflow/{name}: {said}"
    with pytest.raises(DsxError, match="the repair failed"):
        remediate.repaired(NODE, "xid", workflow_name="w")
    details = _details(port)
    assert f"awaiting-repair: repair handed to WorkflowTemplate site-replace: Workflow {name}" in details
    assert any(d.startswith(f"awaiting-repair: repair by workflow/{name}: Failed") for d in details)
    assert details[-1].startswith(f"escalated: the repair failed: workflow/{name} failed: {said}")


def test_a_node_deleted_while_awaiting_its_replacement_ends_replaced_and_its_name_starts_afresh(
    doubles: Doubles, tmp_path: Path
) -> None:
    port, hardware, _ = doubles
    _sentinel(port, hardware, _catalogue(tmp_path, xid_79="replace")).run_once()
    _quarantined(port)
    ledger.record(port, NODE, "quarantined", workflow="w", attempt=1, check="xid")
    remediate.request_repair(NODE, "xid", workflow_name="w", repair_template="site-replace")
    (workflow,) = _workflows(port)
    name = str(workflow["metadata"]["name"])  # type: ignore[index]
    port.patch_object(
        "argoproj.io/v1alpha1", "Workflow", name, {"status": {"phase": "Succeeded"}}, port.namespace
    )
    port.delete_object(
        "v1", "Node", NODE
    )  # the provider terminated the machine; its successor has a new name

    waited = remediate.repair_wait(NODE, "xid", "30s", workflow_name="w")  # no wait for a node that is gone
    assert (
        waited == f"{NODE}: gone from the cluster (its Node object was deleted): the repair check records it"
    )
    told = remediate.repaired(NODE, "xid", workflow_name="w")
    assert told.startswith(
        f"{NODE}: replaced: the Node object was deleted while awaiting its repair (the repair asked: replace)"
    )
    assert (tmp_path / "out" / "params" / "gone").read_text() == "true"  # recertification is skipped
    history = ledger.entries(port, NODE)
    assert history[-1].state == ledger.REPLACED and history[-1].workflow == "w"
    assert remediate.repaired(NODE, "xid", workflow_name="w") == f"{NODE}: replaced (recorded already)"
    assert (
        port.get_object("v1", "ConfigMap", f"dsx-repair-{NODE}", port.namespace) is not None
    )  # the case kept
    # A node given the same name later is another machine: no attempts, no returns counted against it.
    assert ledger.attempts(history) == 0 and ledger.changed_attempts(history) == 0
    ledger.record(port, NODE, ledger.IN_SERVICE, workflow="old", attempt=1, check="xid", now=_days_ago(5))
    history = sorted(ledger.entries(port, NODE), key=lambda e: e.at)
    assert remediate.returns_within(history, 30, dt.datetime.now(dt.UTC)) == []


def _days_ago(days: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(days=days)


def _handed_and_succeeded(port: SimCluster, tmp_path: Path, actions: str) -> str:
    """XID 79 seen, the node quarantined, its reboot handed to the template ``site-repair`` (taking
    ``actions``), and the Workflow of it Succeeded as Argo's controller would mark it; its name."""
    _sentinel(port, port, _catalogue(tmp_path)).run_once()
    _quarantined(port)
    remediate.request_repair(NODE, "xid", repair_template="site-repair", repair_template_actions=actions)
    (workflow,) = _workflows(port)
    name = str(workflow["metadata"]["name"])  # type: ignore[index]
    done = {"status": {"phase": "Succeeded"}}
    port.patch_object("argoproj.io/v1alpha1", "Workflow", name, done, port.namespace)
    return name


def test_a_template_that_succeeded_still_needs_the_node_back_on_a_new_boot(
    file_fleet: SimCluster, tmp_path: Path
) -> None:
    port = file_fleet
    name = _handed_and_succeeded(port, tmp_path, "reboot,replace")
    assert "not repaired within 1s" in remediate.repair_wait(NODE, "xid", "1s")
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and (outcome.phase, outcome.message) == (
        "Succeeded",
        f"Workflow {name} Succeeded",
    )
    _reboot(port, port, None)  # the node the template repaired comes back
    assert remediate.repair_wait(NODE, "xid", "30s").startswith(f"{NODE}: repaired (boot ")


def test_no_template_for_an_action_it_was_not_given(file_fleet: SimCluster, tmp_path: Path) -> None:
    port = file_fleet
    _sentinel(port, port, _catalogue(tmp_path)).run_once()
    _quarantined(port)
    told = remediate.request_repair(NODE, "xid", repair_template="site-replace")  # XID 79 asks for reboot
    assert "WorkflowTemplate" not in told and _workflows(port) == []
    assert outcome_of(port.get_node(NODE)) is None


@pytest.mark.parametrize(
    ("template", "actions", "named"),
    [
        ("Site_Replace", "replace", "repair-template: 'Site_Replace' is not a WorkflowTemplate name"),
        ("site-replace", "replace,rma", "repair-template-actions: rma: expected a comma-separated list of"),
        ("site-replace", " , ", "repair-template-actions: none given"),
    ],
)
def test_template_parameters_are_read_before_anything_changes(
    file_fleet: SimCluster, template: str, actions: str, named: str
) -> None:
    with pytest.raises(InputError, match=named):
        remediate.check_parameters(node=NODE, repair_template=template, repair_template_actions=actions)
    with pytest.raises(InputError, match=named):
        remediate.request_repair(NODE, "xid", repair_template=template, repair_template_actions=actions)
    assert vocab.LABEL_REPAIR not in file_fleet.get_node(NODE).labels


def test_the_outcome_of_an_earlier_request_answers_no_later_one(file_fleet: SimCluster) -> None:
    port = file_fleet
    port.set_node_metadata(
        NODE,
        annotations={
            vocab.ANNOTATION_REPAIR_REQUESTED_AT: "2026-12-06T10:00:00Z",
            vocab.ANNOTATION_REPAIR_OUTCOME: json.dumps(
                {"requestedAt": "2026-12-01T08:00:00Z", "actuator": RESET, "phase": "Succeeded", "at": "x"}
            ),
        },
    )
    assert outcome_of(port.get_node(NODE)) is None
    port.set_node_metadata(NODE, annotations={vocab.ANNOTATION_REPAIR_OUTCOME: "{not json"})
    assert outcome_of(port.get_node(NODE)) is None


# ----------------------------------------------------------------------------- on a node: NVML, nvidia-smi


GPU3_PCI = "0000:48:00"  # GPU 3 of the fake NVML (tests.steps.sentinel.fake_nvml.gpus)


@pytest.fixture
def nvml_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_fleet: Callable[[str], str]
) -> tuple[Sentinel, FakeNvml, SimCluster, Path]:
    """The agent of node-01 as on a real node: a fake NVML, the kernel log a file with XID 79 on GPU 3,
    ``nvidia-smi`` a script on PATH that says what it was asked (``calls``) and exits as ``exit`` says;
    its condition written, the node quarantined and its reset-gpu repair requested."""
    sim_fleet("sim:nodes=2,gpu=h100,workloads=false,repair=never")
    port = SimCluster(FileStore(tmp_path / "fleet.json"))
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(
        '#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n'
        'code=$(cat "$(dirname "$0")/exit" 2>/dev/null || echo 0)\n'
        'if [ "$code" = 0 ]; then echo "GPU 00000000:48:00.0 was successfully reset."; '
        'else echo "GPU Reset couldn\'t run because GPU 00000000:48:00.0 is the primary GPU." >&2; fi\n'
        'exit "$code"\n'
    )
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    this_boot = Boot.read()
    assert this_boot is not None
    log = tmp_path / "kern.log"
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
    log.write_text(
        f"{stamp} node-01 kernel: [ 3500.000000] NVRM: Xid (PCI:{GPU3_PCI}): 79, pid=1901, name=python, "
        "GPU has fallen off the bus.\n"
    )
    fake = FakeNvml(gpus(8))
    sentinel = build_sentinel(
        port,
        NODE,
        _catalogue(tmp_path, xid_79="reset-gpu"),
        source="nvml",
        nvml_module=fake,
        sysfs="/nonexistent",
        kernel_log=str(log),
        boot=Boot(this_boot.id, time.time() - 3600),
        probe_timeout=None,
        node_read_s=0,
        reset_gpus=True,
    )
    sentinel.run_once()
    assert port.get_node(NODE).condition(vocab.CONDITION_SENTINEL["xid"]).status == "True"  # type: ignore[union-attr]
    _quarantined(port)
    assert "reset-gpu of GPU 3 (GPU-fake-3)" in remediate.request_repair(NODE, "xid", workflow_name="w")
    return sentinel, fake, port, tools


def test_on_a_node_the_agent_resets_the_gpu_with_nvidia_smi_and_forgets_its_xids(
    nvml_node: tuple[Sentinel, FakeNvml, SimCluster, Path],
) -> None:
    sentinel, fake, port, tools = nvml_node
    sentinel.run_once()
    assert (tools / "calls").read_text() == "--gpu-reset -i GPU-fake-3\n"
    assert fake.shutdowns == 1 and fake.initialised  # NVML let go of the GPU for the reset, then back
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and outcome.phase == "Succeeded"
    assert outcome.message == "GPU 00000000:48:00.0 was successfully reset."
    assert port.get_node(NODE).condition(vocab.CONDITION_SENTINEL["xid"]).status == "False"  # type: ignore[union-attr]
    log = sentinel.probes.kernel_log
    assert log is not None and log.xids == []
    assert log.seen[("xid", GPU3_PCI, 79)][0] == 1  # the fault history still counts it
    assert remediate.repair_wait(NODE, "xid", "30s", workflow_name="w").startswith(f"{NODE}: repaired")


def test_on_a_node_a_gpu_a_process_holds_is_not_reset(
    nvml_node: tuple[Sentinel, FakeNvml, SimCluster, Path],
) -> None:
    sentinel, fake, port, tools = nvml_node
    fake.devices[3].processes = {4242: "python"}
    sentinel.run_once()
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and outcome.phase == "Failed"
    assert outcome.message == "GPU 3 (GPU-fake-3) is held by pid 4242 python: not reset"
    assert not (tools / "calls").exists()
    assert port.get_node(NODE).condition(vocab.CONDITION_SENTINEL["xid"]).status == "True"  # type: ignore[union-attr]


def test_on_a_node_a_reset_the_driver_refuses_fails_with_what_it_said(
    nvml_node: tuple[Sentinel, FakeNvml, SimCluster, Path],
) -> None:
    sentinel, _, port, tools = nvml_node
    (tools / "exit").write_text("3")
    sentinel.run_once()
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and outcome.phase == "Failed"
    assert outcome.message == (
        "GPU 3 (GPU-fake-3): reset failed: nvidia-smi --gpu-reset -i GPU-fake-3 exited 3: "
        "GPU Reset couldn't run because GPU 00000000:48:00.0 is the primary GPU."
    )
    log = sentinel.probes.kernel_log
    assert log is not None and [x.code for x in log.xids] == [79]  # not reset: nothing forgotten


# ----------------------------------------------------------------------------- dsx-repair-webhook


class _Receiver(http.server.BaseHTTPRequestHandler):
    """A repair service: keeps each POST; answers the status its server's ``status`` says."""

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        server = self.server
        server.got.append((dict(self.headers), json.loads(self.rfile.read(length))))  # type: ignore[attr-defined]
        status = server.status  # type: ignore[attr-defined]
        self.send_response(status)
        self.end_headers()
        self.wfile.write(b"ticket RMA-4711" if status < 300 else b"no such queue")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Receiver)
    server.got, server.status = [], 201  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_webhook_template_posts_the_whole_request_and_fails_on_a_refusal(
    file_fleet: SimCluster, tmp_path: Path, receiver: http.server.HTTPServer
) -> None:
    port = file_fleet
    _sentinel(port, port, _catalogue(tmp_path)).run_once()
    _quarantined(port)
    remediate.request_repair(NODE, "xid", workflow_name="dsx-remediate-abcde")
    url = f"http://127.0.0.1:{receiver.server_address[1]}/repairs"
    request = f"dsx-repair-{NODE}"

    said = webhook.notify(url, request, node=NODE, workflow="dsx-repair-webhook-xyz12")
    assert said == f"{NODE}: reboot request taken by {url} (201): ticket RMA-4711"
    ((headers, body),) = receiver.got  # type: ignore[attr-defined]
    assert (
        headers["Content-Type"] == "application/json"
        and headers["X-Dsx-Workflow"] == "dsx-repair-webhook-xyz12"
    )
    assert (body["kind"], body["node"], body["action"]) == ("RepairRequest", NODE, "reboot")
    assert [g["index"] for g in body["gpus"]] == [3] and "XID 79" in body["findings"][0]["message"]

    receiver.status = 404  # type: ignore[attr-defined]
    with pytest.raises(webhook.RepairHookError, match=f"{url} answered 404 Not Found: no such queue"):
        webhook.notify(url, request)
    with pytest.raises(InputError, match="parameter url: 'ftp://x' is not an http"):
        webhook.notify("ftp://x", request)
    with pytest.raises(InputError, match=f"the request is for '{NODE}', not 'node-02'"):
        webhook.notify(url, request, node="node-02")
    with pytest.raises(InputError, match="parameter request: no ConfigMap dsx-repair-node-02"):
        webhook.notify(url, "dsx-repair-node-02")
    receiver.server_close()
    with pytest.raises(webhook.RepairHookError, match="could not be reached"):
        webhook.notify("http://127.0.0.1:9/repairs", request, timeout="2s")


# ----------------------------------------------------------------------------- the whole workflow


@pytest.mark.story
def test_a_whole_remediation_resets_the_gpu_and_returns_the_node_to_service_on_its_boot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``dsx run remediate --local`` as a person runs it (in this process: its steps and ranks forked from
    this worker's fork server), the node's agent carrying out reset-gpu requests
    meanwhile (a thread here, the DaemonSet on a cluster), over one shared fleet whose provider repairs
    nothing: the GPU is reset, the node recertified and back in service on the boot it had."""
    spec = shareable(f"sim:nodes=4,gpu=h100,repair=never,faults={NODE}:xid=79@3", tmp_path)
    port = SimCluster(FileStore(tmp_path / "fleet.json"))
    sentinel = _sentinel(port, port, _catalogue(tmp_path, xid_79="reset-gpu"), reset_gpus=True)
    sentinel.run_once()
    boot = port.get_node(NODE).node_info.boot_id
    stop = threading.Event()

    def agent() -> None:
        while not stop.wait(0.5):
            sentinel.run_once()

    thread = threading.Thread(target=agent, daemon=True)
    thread.start()
    try:
        code, out, err = dsx_here(
            capsys, "run", "remediate", "--local", "--cluster", spec, "--out", str(tmp_path / "run"),
            "-p", f"node={NODE}", "-p", "check=xid", "-p", "repair-timeout=2m", "-p", "iters=2",
            "-p", "p-min=0.9", "-p", 'drain-policy={"deadline_s": 2, "force": true, "poll_s": 0.1}',
        )  # fmt: skip
    finally:
        stop.set()
        thread.join(10)
    assert code == 0, out[-3000:] + err[-3000:]
    node = port.get_node(NODE)
    assert node.node_info.boot_id == boot and not node.unschedulable
    assert node.labels[vocab.LABEL_CERTIFICATION] == "passed" and vocab.LABEL_STATE not in node.labels
    assert vocab.ANNOTATION_REPAIR_OUTCOME not in node.annotations  # the request went with the repair
    details = _details(port)
    assert any(d.startswith(f"awaiting-repair: repair by {RESET}: Succeeded") for d in details)
    assert f"recertifying: repaired: GPUs reset, boot {boot} kept" in details
    assert [d.split(":")[0] for d in details][-2:] == ["in-service", "ended"]
    assert [c.method for c in port.calls()].count("reset_gpu") == 1


def test_after_a_suspend_the_repair_check_reads_the_templates_workflow_itself(
    file_fleet: SimCluster, tmp_path: Path
) -> None:
    """With repair-wait=suspend no wait followed the Workflow: the repair check reads its end."""
    port = file_fleet
    name = _handed_and_succeeded(port, tmp_path, "reboot")
    _reboot(port, port, None)  # the person resumes once the node is back
    assert remediate.repaired(NODE, "xid", workflow_name="w").startswith(f"{NODE}: repaired (boot ")
    assert any(d.startswith(f"awaiting-repair: repair by workflow/{name}: Succeeded") for d in _details(port))


def test_an_action_the_template_takes_is_left_to_it_by_the_agent(
    file_fleet: SimCluster, tmp_path: Path
) -> None:
    port = file_fleet
    kured = tmp_path / "host-run" / "reboot-required"
    sentinel = _sentinel(port, port, _catalogue(tmp_path), kured_sentinel=kured)
    sentinel.run_once()
    _quarantined(port)
    remediate.request_repair(NODE, "xid", repair_template="site-repair", repair_template_actions="reboot")
    sentinel.run_once()
    assert not kured.exists()
    outcome = outcome_of(port.get_node(NODE))
    assert outcome is not None and outcome.actuator.startswith("workflow/site-repair-")


def test_the_simulated_reset_is_refused_where_the_driver_refuses_it(file_fleet: SimCluster) -> None:
    """A GPU fallen off the bus (lost to NVML) cannot be reset, nor any GPU while a pod holds GPUs on the
    node, whatever the agent checked before: the simulated fleet refuses as ``nvidia-smi --gpu-reset``
    does, and changes nothing."""
    port = file_fleet
    port.inject(NODE, "failing-gpu@5")
    lost, healthy = port.node_report(NODE).gpus[5], port.node_report(NODE).gpus[3]
    with pytest.raises(GpuResetError, match=rf"GPU 5 \({lost.uuid}\) is lost: a reset cannot reach it"):
        port.reset_gpu(NODE, lost.uuid)
    with port.store.transaction() as fleet:
        fleet.pods["team/stray"] = Pod(name="stray", namespace="team", uid="u-stray", node=NODE, gpus=8)
    with pytest.raises(GpuResetError, match=r"GPU 3 .* is in use by pod team/stray"):
        port.reset_gpu(NODE, healthy.uuid)
    assert port.node_report(NODE).gpus[3].xids == (79,) and not port.node_report(NODE).gpus[5].healthy

"""The faults ``dsx-remediate`` must survive losing nothing, each a run of the compiled WorkflowTemplate by
the local runner on a simulated fleet shared through its state file.

After every run the same promises are checked against the fleet and its call log (:func:`_lost_nothing`):
no pod left outside the Eviction API, no budget below what it asks for, no node cordoned by dsx without a
``dsx.dev/state`` label saying why, and no cordon made outside dsx lifted. The scenarios that run alike on
the emulated API server are written once, for both, in ``tests/workflows/test_remediate_doubles.py``;
those here are the fleet's own.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import ClusterPort, shareable
from steps.cluster import vocabulary as vocab
from steps.cluster.sim import FileStore, SimCluster
from steps.cluster.sim.controllers import budget_status
from steps.sentinel import ledger
from steps.sentinel.remediate import OWNER
from steps.yamlio import load_yaml, plain
from tests.cli import Started, dsx, dsx_started
from tests.paths import REPO
from workflows.compiler import trusted_steps
from workflows.runner import Phase, RunOptions, run

FAST = {"deadline_s": 20, "poll_s": 0.1, "backoff_s": 0.1, "backoff_cap_s": 0.2}
# The pair test screens the node for a fault failing 90% of tests (2 passes, not the 21 of the default
# 0.2) and its sweeps time 2 iterations: these runs are about remediation's steps, not the screening's
# depth, which tests/workflows/test_certify_workflow.py holds.
QUICK = {"p-min": "0.9", "iters": "2"}
FILES = REPO / "charts" / "dsx" / "files"
NODE = "node-01"


def _templates() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The compiled templates, each retry's backoff 1 s (doubling, at most 2 s) for the shipped 15 s: a
    step that fails for good (a guard refusing, say) waits out one backoff before its Retry node ends,
    as in Argo, and these runs are about what the steps do, not how long Argo waits between tries."""
    docs = [plain(d) for f in sorted(FILES.glob("workflow-template-*.yaml")) for d in [load_yaml(f, str(f))]]
    for doc in docs:
        for template in doc["spec"]["templates"]:
            if (template.get("retryStrategy") or {}).get("backoff"):
                template["retryStrategy"]["backoff"] = {"duration": "1s", "factor": 2, "cap": "2s"}
    entry = next(d for d in docs if d["metadata"]["name"] == "dsx-remediate")
    return entry, [d for d in docs if d is not entry]


def _fleet(tmp_path: Path, spec: str) -> tuple[str, SimCluster]:
    folder = tmp_path / "fleet"
    folder.mkdir(exist_ok=True)
    state = shareable(spec, folder)
    return state, SimCluster(FileStore(folder / "fleet.json"))


def _params(**extra: str) -> dict[str, str]:
    return {
        "node": NODE,
        "check": "xid",
        "drain-policy": json.dumps(FAST),
        "repair-timeout": "6s",
        **QUICK,
        **extra,
    }


def _remediate(state: str, out: Path, **extra: str) -> Phase:
    entry, library = _templates()
    result = run(
        entry, library, _params(**extra), RunOptions(out_dir=out, cluster=state, trusted=trusted_steps())
    )
    return result.phase


def _states(port: SimCluster) -> list[str]:
    return [e.state for e in ledger.entries(port, NODE)]


def _lost_nothing(
    port: SimCluster,
    cordoned_before: set[str] = frozenset(),  # type: ignore[assignment]
    deleted: str = "",
) -> None:
    """No pod deleted outside the Eviction API (but pods whose name holds ``deleted``, where the drain
    policy says so), no budget below what it asks for, no node cordoned by dsx without ``dsx.dev/state``,
    no cordon made outside dsx lifted."""
    calls = port.calls()
    removed = [
        str(c.args.get("pod"))
        for c in calls
        if c.method == "delete_pod" and not (deleted and deleted in str(c.args.get("pod")))
    ]
    assert not removed, f"pods deleted outside the Eviction API: {removed}"
    fleet = port.fleet()
    for budget in fleet.pdbs.values():
        healthy = sum(1 for p in fleet.pods.values() if budget.selects(p) and p.phase == "Running")
        _, desired, _ = budget_status(fleet, budget)
        assert healthy >= desired, f"budget {budget.name}: {healthy} healthy, {desired} desired"
    for node in port.list_nodes():
        if node.name in cordoned_before:
            assert node.unschedulable, f"{node.name}: a cordon made outside dsx was lifted"
            continue
        if node.unschedulable and node.cordon is not None and node.cordon.holder == OWNER:
            assert node.labels.get(vocab.LABEL_STATE), f"{node.name} cordoned by dsx with no state label"


def assert_one_after_the_other(port: ClusterPort) -> None:
    """Two remediation runs of node-01, the second begun after the first ended."""
    entries = ledger.entries(port, NODE)
    runs = [e.workflow for e in entries if e.state == "requested"]
    assert len(runs) == 2 and runs[0] != runs[1]
    first_done = max(i for i, e in enumerate(entries) if e.workflow == runs[0])
    second_start = min(i for i, e in enumerate(entries) if e.workflow == runs[1])
    assert first_done < second_start, "two remediations of one node overlapped"


def _wait_for(check: Callable[[], bool], timeout: float = 60.0) -> None:
    ends = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < ends, "timed out"
        time.sleep(0.05)


def _in_background(state: str, out: Path, **extra: str) -> tuple[threading.Thread, list[Phase]]:
    phases: list[Phase] = []
    thread = threading.Thread(target=lambda: phases.append(_remediate(state, out, **extra)), daemon=True)
    thread.start()
    return thread, phases


def _state_of(port: SimCluster) -> str:
    try:
        return port.get_node(NODE).labels.get(vocab.LABEL_STATE, "")
    except Exception:
        return "gone"


@pytest.mark.story
def test_a_repair_wait_that_errors_never_escalates_the_node(tmp_path: Path) -> None:
    """The repair check runs after a wait that ended, never after one that failed: a wait that could not
    run (here its timeout unreadable, as a wait the API server refused to the end would be) leaves the node
    awaiting its repair, cordoned with its state, for a resubmission; no escalation, no replacement."""
    state, port = _fleet(tmp_path, "sim:nodes=4,gpu=h100,faults=node-01:xid=79,repair=never")
    entry, library = _templates()
    tasks = next(t for t in entry["spec"]["templates"] if t["name"] == "remediate")["dag"]["tasks"]
    wait = next(t for t in tasks if t["name"] == "repair-wait")
    for argument in wait["arguments"]["parameters"]:
        if argument["name"] == "timeout":
            argument["value"] = "soon"
    result = run(
        entry,
        library,
        _params(),
        RunOptions(out_dir=tmp_path / "run", cluster=state, trusted=trusted_steps()),
    )
    assert result.phase == Phase.Failed
    node = port.get_node(NODE)
    assert node.unschedulable and node.labels[vocab.LABEL_STATE] == vocab.NodeState.awaiting_repair.value
    assert vocab.LABEL_REPLACE not in node.labels
    assert "escalated" not in _states(port)
    _lost_nothing(port)


def _marked(tmp_path: Path, reboot: str) -> tuple[str, SimCluster]:
    """A fleet whose node-01 the sentinel marked (its XID condition True), rebooting as ``reboot`` says."""
    state, port = _fleet(tmp_path, f"sim:nodes=4,gpu=h100,faults=node-01:xid=79,repair-delay=0.5,{reboot}")
    port.set_condition(NODE, vocab.CONDITION_GPU_XID, True, "FatalResetGpu", "xid 79 on GPU 0")
    return state, port


@pytest.mark.story
def test_a_reboot_in_stages_ends_in_service_not_escalated(tmp_path: Path) -> None:
    # As a real node comes back: the new boot id at once, Ready 2 s later, the sentinel's condition
    # cleared 3 s after that. A wait that ended on the boot id alone escalated this node as not Ready.
    state, port = _marked(tmp_path, "reboot-ready=2s,reboot-clear=3s")
    assert _remediate(state, tmp_path / "run", **{"repair-timeout": "30s"}) == Phase.Succeeded
    node = port.get_node(NODE)
    assert not node.unschedulable and node.labels[vocab.LABEL_CERTIFICATION] == "passed"
    assert "escalated" not in _states(port)
    repaired = next(e for e in ledger.entries(port, NODE) if e.state == "recertifying")
    assert repaired.detail.startswith("repaired: boot ")
    _lost_nothing(port)


@pytest.mark.story
def test_a_reboot_whose_condition_never_clears_is_escalated_at_the_timeout(tmp_path: Path) -> None:
    state, port = _marked(tmp_path, "reboot-ready=1s,reboot-clear=600s")
    assert _remediate(state, tmp_path / "run", **{"repair-timeout": "4s"}) == Phase.Failed
    node = port.get_node(NODE)
    assert node.labels[vocab.LABEL_STATE] == "escalated"
    escalated = next(e for e in ledger.entries(port, NODE) if e.state == "escalated")
    assert "condition DsxGpuXid still True" in escalated.detail and "not Ready" not in escalated.detail
    _lost_nothing(port)


def _busy(tmp_path: Path, *busy: str) -> tuple[str, SimCluster]:
    """node-01 faulty; node-00, node-02 and node-03 known good (an earlier certification passed them, as
    the simulated fleet has it by default); the ``busy`` ones with every GPU held by a workload."""
    faults = ";".join(["node-01:xid=79", *(f"{n}:busy" for n in busy)])
    return _fleet(tmp_path, f"sim:nodes=4,gpu=h100,faults={faults},repair-delay=0.5")


@pytest.mark.story
def test_a_busy_partner_is_passed_over_for_one_whose_gpus_are_free(tmp_path: Path) -> None:
    state, port = _busy(tmp_path, "node-00", "node-02")
    assert _remediate(state, tmp_path / "run") == Phase.Succeeded
    node = port.get_node(NODE)
    assert not node.unschedulable and node.labels[vocab.LABEL_CERTIFICATION] == "passed"
    back = next(e for e in ledger.entries(port, NODE) if e.state == ledger.IN_SERVICE)
    assert "pair test passed beside node-03" in back.detail
    _lost_nothing(port)


@pytest.mark.story
def test_with_every_partner_busy_the_node_stays_recertifying_and_is_not_escalated(tmp_path: Path) -> None:
    state, port = _busy(tmp_path, "node-00", "node-02", "node-03")
    assert _remediate(state, tmp_path / "run") == Phase.Failed
    node = port.get_node(NODE)
    assert node.unschedulable and node.labels[vocab.LABEL_STATE] == vocab.NodeState.recertifying.value
    assert node.labels[vocab.LABEL_CERTIFICATION] == vocab.Certification.pending.value
    assert node.annotations[vocab.ANNOTATION_PAIR_TEST].startswith("no verdict: every known-good partner")
    assert vocab.LABEL_REPLACE not in node.labels
    states = _states(port)
    assert "escalated" not in states
    kept = [e for e in ledger.entries(port, NODE) if e.detail.startswith("kept recertifying")]
    assert kept, states
    _lost_nothing(port)


@pytest.mark.story
def test_a_node_that_passes_alone_but_fails_beside_a_known_good_node_escalates(tmp_path: Path) -> None:
    # The repair fixes the GPU (repair=ok), but the node's NIC is slow: certification of the node alone
    # cannot see it (no second node), the pair test beside a known-good node does.
    state, port = _fleet(tmp_path, "sim:nodes=4,gpu=h100,faults=node-01:xid=79,repair-delay=0.5")
    for name in ("node-00", "node-02"):
        port.set_labels(name, {vocab.LABEL_CERTIFICATION: "passed"})
    port.cordon("node-00", "maintenance", by="someone")  # cordoned: no partner, even certified
    thread, phases = _in_background(state, tmp_path / "run")
    _wait_for(lambda: _state_of(port) == "recertifying")
    port.inject(NODE, "slow-nic")
    thread.join(300)
    assert phases == [Phase.Failed]
    node = port.get_node(NODE)
    assert node.unschedulable and node.labels[vocab.LABEL_STATE] == "escalated"
    assert node.labels[vocab.LABEL_CERTIFICATION] == "failed"
    assert "node-02" in node.annotations[vocab.ANNOTATION_CERTIFICATION_REASON]
    escalated = next(e for e in ledger.entries(port, NODE) if e.state == "escalated")
    assert "pair test failed beside node-02" in escalated.detail
    assert not port.list_nodes(f"{vocab.LABEL_RECERTIFY}")  # no mark left behind
    partner = port.get_node("node-02")
    assert partner.labels[vocab.LABEL_CERTIFICATION] == "passed" and not partner.unschedulable
    _lost_nothing(port, {"node-00"})


@pytest.mark.story
def test_with_no_known_good_node_the_node_is_judged_on_its_own_certification(tmp_path: Path) -> None:
    # A fleet dsx never certified: no node is known good.
    state, port = _fleet(
        tmp_path, "sim:nodes=4,gpu=h100,faults=node-01:xid=79,repair-delay=0.5,certified=none"
    )
    assert _remediate(state, tmp_path / "run") == Phase.Succeeded
    node = port.get_node(NODE)
    assert not node.unschedulable and node.labels[vocab.LABEL_CERTIFICATION] == "passed"
    assert vocab.ANNOTATION_PAIR_TEST not in node.annotations
    back = [e for e in ledger.entries(port, NODE) if e.state == ledger.IN_SERVICE]
    assert "pair test skipped: no known-good partner" in back[-1].detail
    _lost_nothing(port)


@pytest.mark.story
def test_a_pair_test_beside_a_known_good_node_puts_the_node_back(tmp_path: Path) -> None:
    spec = "sim:nodes=4,gpu=h100,faults=node-01:xid=79,repair-delay=0.5,certified=node-01;node-03"
    state, port = _fleet(tmp_path, spec)
    assert _remediate(state, tmp_path / "run") == Phase.Succeeded
    node = port.get_node(NODE)
    assert not node.unschedulable and node.labels[vocab.LABEL_CERTIFICATION] == "passed"
    back = [e for e in ledger.entries(port, NODE) if e.state == ledger.IN_SERVICE]
    assert "pair test passed beside node-03" in back[-1].detail
    assert not port.list_nodes(vocab.LABEL_RECERTIFY)
    _lost_nothing(port)


@pytest.mark.story
def test_an_operator_resumes_the_repair_suspend_and_the_node_comes_back(tmp_path: Path) -> None:
    state, port = _fleet(tmp_path, "sim:nodes=4,gpu=h100,faults=node-01:xid=79,repair-delay=0.5")
    booted = port.get_node(NODE).node_info.boot_id
    out = tmp_path / "run"
    entry, library = _templates()
    params = _params(**{"repair-wait": "suspend", "repair-timeout": "10m"})
    results: list[Any] = []
    thread = threading.Thread(
        target=lambda: results.append(
            run(entry, library, params, RunOptions(out_dir=out, cluster=state, trusted=trusted_steps()))
        ),
        daemon=True,
    )
    thread.start()
    _wait_for(
        lambda: _state_of(port) == "awaiting-repair" and port.get_node(NODE).node_info.boot_id != booted
    )
    assert _state_of(port) == "awaiting-repair"  # repaired, yet it waits for the operator
    resumed = dsx("resume", str(out), "--node", "repair-suspend", timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    thread.join(120)
    assert not thread.is_alive(), "the resumed suspend kept waiting for its 10m deadline"
    (result,) = results
    assert result.phase is Phase.Succeeded
    assert "resumed by dsx resume" in result.node("repair-suspend").message
    assert result.node("repair-wait").phase is Phase.Skipped
    node = port.get_node(NODE)
    assert not node.unschedulable and node.labels[vocab.LABEL_CERTIFICATION] == "passed"
    _lost_nothing(port)


@pytest.mark.story
def test_a_repair_suspend_nobody_resumes_escalates_at_its_deadline(tmp_path: Path) -> None:
    state, port = _fleet(tmp_path, "sim:nodes=4,gpu=h100,faults=node-01:xid=79,repair=never")
    extra = {"repair-wait": "suspend", "repair-timeout": "2s"}
    assert _remediate(state, tmp_path / "run", **extra) == Phase.Failed
    node = port.get_node(NODE)
    assert node.unschedulable and node.labels[vocab.LABEL_STATE] == "escalated"
    escalated = next(e for e in ledger.entries(port, NODE) if e.state == "escalated")
    assert "the repair did not come" in escalated.detail
    _lost_nothing(port)


@pytest.mark.story
def test_two_local_runs_of_one_node_in_two_processes_wait_for_each_other(tmp_path: Path) -> None:
    """dsx-remediate's mutex (dsx-remediate-<node>) holds between processes that share a fleet's state
    file, as between two Workflows: the second run waits for the first to end (exit handler included),
    then finds the node where the first left it. Both once remediated the node at once."""
    state, port = _fleet(tmp_path, "sim:nodes=4,gpu=h100,faults=node-01:xid=79,repair-delay=0.5")

    def start(name: str, *extra: str) -> Started:
        params = [a for k, v in _params(**{"repair-timeout": "30s"}).items() for a in ("-p", f"{k}={v}")]
        return dsx_started(
            "run", "remediate", "--local", "--cluster", state, "--out", str(tmp_path / name), *params, *extra
        )

    first = start("first")
    _wait_for(lambda: "quarantined" in _states(port), timeout=120)
    second = start("second", "-p", "dry-run=true")
    try:
        time.sleep(2)
        assert second.poll() is None
        assert {e.workflow for e in ledger.entries(port, NODE)} == {_workflow(tmp_path / "first")}  # it waits
        _, first_err = first.communicate(timeout=300)
        _, second_err = second.communicate(timeout=300)
    finally:
        first.close()
        second.close()
    assert (first.returncode, second.returncode) == (0, 0), first_err + second_err
    assert "Waiting for default/Mutex/dsx-remediate-node-01 lock" in second_err
    entries = ledger.entries(port, NODE)
    names = [e.workflow for e in entries]
    firsts = [i for i, n in enumerate(names) if n == _workflow(tmp_path / "first")]
    seconds = [i for i, n in enumerate(names) if n == _workflow(tmp_path / "second")]
    assert firsts and seconds and max(firsts) < min(seconds)  # the second began after the first ended
    assert entries[seconds[0]].state == "refused" and "dry run" in entries[seconds[0]].detail
    node = port.get_node(NODE)
    assert not node.unschedulable and vocab.LABEL_STATE not in node.labels  # where the first left it
    leases = port.list_objects("coordination.k8s.io/v1", "Lease", "default")  # the mutex key's namespace
    mutexes = [x for x in leases if x["metadata"]["name"].startswith("dsx-mutex-dsx-remediate-node-01")]
    assert len(mutexes) == 1 and not mutexes[0]["spec"].get("holderIdentity")  # given back
    _lost_nothing(port)


def _workflow(run_dir: Path) -> str:
    return str(json.loads((run_dir / "run.json").read_text())["workflow"])

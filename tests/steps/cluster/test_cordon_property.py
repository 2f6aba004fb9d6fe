"""Property: random interleavings of cordon and uncordon, by several dsx owners and by kubectl, on one
``state:`` fleet shared by several processes (or threads), never release a cordon someone else made and
never lose an owner's record.

Every actor follows its own seeded random sequence; the interleaving is whatever the scheduler makes of
them. Every write gets the fleet's next ``resourceVersion``, so the writes the actors saw, sorted by it,
are the order the API applied them in. An oracle that knows who did what replays that order, checks the
node after every write, and checks every refusal and every call that wrote nothing against the state the
call read (its ``resourceVersion``), so refusing everything would not pass either.

kubectl is played as a careful client: it cordons or uncordons only with the ``resourceVersion`` it read,
so the oracle knows exactly which of its writes changed the node (kubectl's own unconditional patch can
be a no-op that nobody, not even the API server, could tell from a cordon).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from steps.cluster import ConflictError, CordonRefusedError, Node, RetryPolicy, connect, shareable
from steps.cluster import vocabulary as vocab
from steps.cluster.sim import SimCluster
from steps.cluster.sim.store import FileStore
from tests.paths import REPO
from tests.steps.cluster.conftest import KUBECTL

OWNERS = ("alice", "bob", "sentinel")
ADMINS = ("kubectl-a", "kubectl-b")  # two people with kubectl: both are "someone else" to dsx
NODES = ("node-00", "node-01")
SPEC = "sim:nodes=2,workloads=false,api-conflicts=8"
OPS = 60
REASONS = ("xid 79", "slow NIC", "RMA", "drain for upgrade")
RETRY = RetryPolicy(base_delay=0.0, conflict_attempts=40, conflict_delay=0.002)


def act(spec: str, actor: str, seed: int, ops: int, out: str) -> None:
    """Play one actor: ``ops`` random cordons and uncordons; write what happened to ``out`` (JSON lines)."""
    rng = random.Random(seed)
    if actor in ADMINS:
        port: Any = SimCluster(
            FileStore(Path(spec.removeprefix("state:"))), retry=RETRY, field_manager=KUBECTL
        )
    else:
        port = connect(spec, retry=RETRY)
    events = []
    for _ in range(ops):
        node = rng.choice(NODES)
        op = rng.choice(("cordon", "uncordon"))
        event: dict[str, Any] = {"actor": actor, "node": node, "op": op}
        if actor in ADMINS:
            seen = port.get_node(node)
            if seen.unschedulable != (op == "uncordon"):
                continue  # kubectl says "already cordoned" (or uncordoned) and writes nothing
            patch = {
                "metadata": {"resourceVersion": seen.resource_version},
                "spec": {"unschedulable": True if op == "cordon" else None},
            }
            try:
                after = Node.from_manifest(port.patch_object("v1", "Node", node, patch))
            except ConflictError:
                continue  # someone wrote in between: this cordon never happened
            events.append({**event, "kind": "write", "forced": False, **_seen(after)})
            continue
        force = rng.random() < 0.08
        event["force"] = force
        try:
            if op == "cordon":
                result = port.cordon(node, rng.choice(REASONS), by=actor, force=force)
            else:
                result = port.uncordon(node, by=actor, force=force)
        except CordonRefusedError as refused:
            events.append(
                {
                    **event,
                    "kind": "refused",
                    "rv": refused.resource_version,
                    "recorded": refused.cordon.holder,
                }
            )
            continue
        kind = "write" if result.changed else "noop"
        events.append({**event, "kind": kind, "forced": result.forced, **_seen(result.node)})
    Path(out).write_text("".join(json.dumps(e) + "\n" for e in events))


def _seen(node: Node) -> dict[str, Any]:
    return {
        "rv": node.resource_version,
        "unschedulable": node.unschedulable,
        "by": node.annotations.get(vocab.ANNOTATION_CORDONED_BY, ""),
        "before": node.annotations.get(vocab.ANNOTATION_CORDONED_BEFORE, ""),
    }


@dataclass
class _State:
    """Who really holds a node's cordon: someone outside dsx, a dsx owner, or nobody."""

    outside: bool = False
    owner: str = ""


def _replay(events: list[dict[str, Any]]) -> tuple[list[str], Counter[str]]:
    """Check every write in the order the API applied it, and every other call against what it read."""
    problems: list[str] = []
    seen: Counter[str] = Counter()
    for name in NODES:
        mine = [e for e in events if e["node"] == name]
        writes = sorted((e for e in mine if e["kind"] == "write"), key=lambda e: int(e["rv"]))
        assert len({e["rv"] for e in writes}) == len(writes), "two writes share a resourceVersion"
        state, history = _State(), [(0, _State())]
        for e in writes:
            where = f"{name} rv {e['rv']}: {e['actor']} {e['op']}{' --force' if e['forced'] else ''}"
            seen[f"{'kubectl' if e['actor'] in ADMINS else 'dsx'} {e['op']}"] += 1
            state = _State(state.outside, state.owner)
            if e["actor"] in ADMINS:
                state = _State(outside=True) if e["op"] == "cordon" else _State()
            elif e["op"] == "cordon":
                if state.owner and state.owner != e["actor"] and not e["forced"]:
                    problems.append(f"{where}: wrote over {state.owner}'s cordon")
                if state.outside and e["before"] != "true":
                    problems.append(f"{where}: recorded on a cordon made outside dsx without saying so")
                if not state.outside:
                    state.owner = e["actor"]
            else:
                if e["unschedulable"]:
                    problems.append(f"{where}: an uncordon that wrote left the node cordoned")
                if state.outside and not e["forced"]:
                    problems.append(f"{where}: released a cordon made outside dsx")
                if state.owner and state.owner != e["actor"] and not e["forced"]:
                    problems.append(f"{where}: released {state.owner}'s cordon")
                state = _State()
            if state.outside and not e["unschedulable"]:
                problems.append(f"{where}: the node someone else cordoned is uncordoned")
            if state.owner and (not e["unschedulable"] or e["by"] != state.owner):
                problems.append(f"{where}: {state.owner}'s cordon record is lost (by={e['by']!r})")
            if not state.outside and not state.owner and e["unschedulable"]:
                problems.append(f"{where}: cordoned with nobody holding the cordon")
            history.append((int(e["rv"]), state))
        for e in (e for e in mine if e["kind"] != "write"):
            at = max((h for h in history if h[0] <= int(e["rv"])), key=lambda h: h[0])[1]
            where = f"{name} rv {e['rv']}: {e['actor']} {e['op']} {e['kind']}"
            seen[f"dsx {e['op']} {e['kind']}"] += 1
            me = e["actor"]
            if e["kind"] == "refused":
                others = bool(at.owner) and at.owner != me
                if e["op"] == "uncordon":
                    justified = others or at.outside
                else:  # on a cordon made outside dsx, only another owner's record on it refuses
                    justified = others or (at.outside and e["recorded"] not in ("", me))
                if e["force"] or not justified:
                    problems.append(f"{where}: refused, but the cordon was {at}")
                continue
            nothing_to_do = (
                not (at.outside or at.owner) if e["op"] == "uncordon" else at.owner == me or at.outside
            )
            if not nothing_to_do:
                problems.append(f"{where}: wrote nothing, but the cordon was {at}")
    return problems, seen


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_no_interleaving_releases_someone_elses_cordon_or_loses_an_owner(mode: str, tmp_path: Path) -> None:
    spec = shareable(SPEC, tmp_path)
    actors = [*OWNERS, *ADMINS]
    outs = [tmp_path / f"{actor}.jsonl" for actor in actors]
    if mode == "processes":
        code = (
            "import sys; from tests.steps.cluster.test_cordon_property import act; act(*sys.argv[1:3], "
            "int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])"
        )
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, spec, actor, str(seed), str(OPS), str(out)],
                cwd=REPO,
                stderr=subprocess.PIPE,
                text=True,
            )
            for seed, (actor, out) in enumerate(zip(actors, outs, strict=True))
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
    else:
        errors: list[BaseException] = []

        def run(*args: Any) -> None:
            try:
                act(*args)
            except BaseException as exc:  # reported below, with the actor's traceback
                errors.append(exc)
                raise

        threads = [
            threading.Thread(target=run, args=(spec, actor, 100 + seed, OPS, str(out)))
            for seed, (actor, out) in enumerate(zip(actors, outs, strict=True))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
    events = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    problems, seen = _replay(events)
    assert problems == [], "\n".join(problems[:20])
    # The run really went through the cases: cordons by everyone, refusals, releases.
    for case in ("kubectl cordon", "kubectl uncordon", "dsx cordon", "dsx uncordon", "dsx uncordon refused"):
        assert seen[case] > 0, (case, seen)

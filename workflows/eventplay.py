"""The whole sentinel story on one machine: agents, injected faults, the event player and the runs it starts.

:func:`play` shares one cluster between everything it starts (a simulated fleet is written once to
``out/fleet.json`` and every party opens it as ``state:``): the sentinel agent of every node (with
``agent``), faults injected into the fleet at set times, the compiled EventSources and Sensors
(:mod:`workflows.runner.events`), and each Workflow a trigger submits, run by the local runner from its
compiled WorkflowTemplate in a run folder of its own under ``out``. Runs share the process, so a
workflow's ``synchronization`` mutex (``dsx-remediate-<node>``) holds between them as in Argo.
Changes a person watches for (the taint, the cordon, ``dsx.dev/state``, the certification label, the
boot id) are reported as they happen.

However the play ends (its ``--for``, ``--until-done``, Ctrl-C or SIGTERM), the workflows still running
are stopped as ``argo stop`` stops a Workflow: their running steps are killed, their exit handlers run,
each ends Failed ("Stopped with strategy 'Stop'") with its ``workflow.json`` in its run folder, and the
play reports them. A second Ctrl-C or SIGTERM while they wind down terminates them (``argo terminate``:
no more exit handler).
"""

from __future__ import annotations

import secrets
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steps.cluster import connect, shareable
from steps.cluster import vocabulary as vocab
from steps.cluster.port import ClusterPort, Node
from steps.errors import InputError
from steps.files import make_folder
from steps.sentinel.catalogue import load_catalogue
from steps.sentinel.node import Sentinel, build_sentinel
from workflows.runner.api import RunControl, run
from workflows.runner.events import Player, Submission, load
from workflows.runner.host import trusted_steps
from workflows.runner.model import Phase, RunOptions, RunResult
from workflows.runner.state import Shutdown, stronger

__all__ = ["Injection", "PlayResult", "Runs", "local_submitter", "parse_injection", "play"]

_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"


@dataclass(frozen=True)
class Injection:
    """A fault put into a simulated node ``after`` seconds into the play."""

    node: str
    fault: str
    after: float

    def __str__(self) -> str:
        return f"{self.node}:{self.fault}@{self.after:g}s"


def parse_injection(text: str) -> Injection:
    """``NODE:FAULT[@SECONDS]`` (``node-02:xid=79@5``).

    Raises:
        InputError: naming the malformed part.
    """
    spec, _, at = text.partition("@")
    node, sep, fault = spec.partition(":")
    if not sep or not node or not fault:
        raise InputError(f"--inject {text!r}: expected NODE:FAULT[@SECONDS], e.g. node-02:xid=79@5")
    try:
        after = float(at.rstrip("s")) if at else 0.0
    except ValueError:
        raise InputError(f"--inject {text!r}: {at!r} is not a number of seconds") from None
    if not 0 <= after < 86400:
        raise InputError(f"--inject {text!r}: seconds must be between 0 and 86400")
    return Injection(node, fault, after)


@dataclass
class PlayResult:
    """What happened: the runs the Sensors started, with how they ended, and where everything is."""

    out: Path
    cluster: str
    runs: list[RunResult] = field(default_factory=list)
    injected: list[Injection] = field(default_factory=list)
    timed_out: bool = False
    stopped: list[str] = field(default_factory=list)
    """The workflows that were still running when the play ended, and were stopped."""
    signal: int | None = None
    """The signal (SIGINT 2, SIGTERM 15) that ended the play; None when it ended by itself."""

    @property
    def exit_code(self) -> int:
        """130 or 143 when Ctrl-C or SIGTERM ended the play (as a shell reports a process it killed), else
        0 when every run Succeeded (and there was one), else 1."""
        if self.signal is not None:
            return 128 + self.signal
        return 0 if self.runs and all(r.phase is Phase.Succeeded for r in self.runs) else 1


class Runs:
    """The runs a play started that are still going, each with its :class:`RunControl`; once the play
    stops them, a run that starts late is stopped as it starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, RunControl] = {}
        self._stopping: Shutdown | None = None

    def begin(self, name: str) -> RunControl:
        """The control of a run about to start (stopped already when the play is winding down)."""

        control = RunControl()
        with self._lock:
            self._running[name] = control
            if self._stopping is not None:
                control.stop(self._stopping)
        return control

    def end(self, name: str) -> None:
        """The run has ended."""
        with self._lock:
            self._running.pop(name, None)

    def stop_all(self, strategy: Shutdown) -> list[str]:
        """Stop every run still going; their names."""
        with self._lock:
            self._stopping = stronger(self._stopping, strategy)
            running = dict(self._running)
        for control in running.values():
            control.stop(strategy)
        return sorted(running)


def _watched(node: Node) -> dict[str, str]:
    """What a person watches on a node during remediation."""
    return {
        "taint": "on" if node.has_taint(vocab.TAINT_UNHEALTHY) else "off",
        "cordoned": "yes" if node.unschedulable else "no",
        "state": node.labels.get(vocab.LABEL_STATE, "-"),
        "certification": node.labels.get(vocab.LABEL_CERTIFICATION, "-"),
        "boot": node.node_info.boot_id[:8] or "-",
    }


class _Observer:
    def __init__(self, port: ClusterPort, report: Callable[[str], None]) -> None:
        self.port, self.report = port, report
        self.last = {n.name: _watched(n) for n in port.list_nodes()}

    def look(self) -> None:
        for node in self.port.list_nodes():
            now, before = _watched(node), self.last.get(node.name, {})
            changed = [f"{k} {before.get(k, '-')} -> {v}" for k, v in now.items() if before.get(k) != v]
            if changed:
                self.report(f"node {node.name}: {', '.join(changed)}")
            self.last[node.name] = now


def _agents(spec: str, nodes: Sequence[str]) -> list[Sentinel]:
    catalogue = load_catalogue()
    return [build_sentinel(connect(spec), node, catalogue) for node in nodes]


def local_submitter(
    documents: Sequence[Mapping[str, Any]],
    spec: str,
    out: Path,
    overrides: Mapping[str, str],
    runs: list[RunResult],
    report: Callable[[str], None],
    running: Runs | None = None,
) -> Callable[[Submission], None]:
    """Run each submission's WorkflowTemplate among ``documents`` with the local runner against ``spec``,
    in a run folder of its own under ``out``; each result is appended to ``runs``, each run going is in
    ``running`` (which can stop it). ``documents`` are dsx's compiled ones: their steps are the ones a run
    forks (:func:`~workflows.runner.host.trusted_steps`). Raises InputError (a failed submission) when the
    template is not there."""

    templates = {str(d["metadata"]["name"]): d for d in documents if d.get("kind") == "WorkflowTemplate"}
    trusted = trusted_steps(documents)
    lock = threading.Lock()

    def submit(submission: Submission) -> None:
        template = templates.get(submission.template)
        if template is None:  # argo submit refuses it: a failed submission, retried as the trigger says
            raise InputError(f"no WorkflowTemplate {submission.template}")
        arguments = (template.get("spec") or {}).get("arguments") or {}
        declared = {str(p["name"]) for p in arguments.get("parameters") or []}
        params = {**submission.parameters, **{k: v for k, v in overrides.items() if k in declared}}
        name = f"{submission.template}-{''.join(secrets.choice(_SUFFIX) for _ in range(5))}"
        library = [d for d in templates.values() if d is not template]
        options = RunOptions(out_dir=out / name, workflow_name=name, cluster=spec, trusted=trusted)
        going = running or Runs()
        try:
            result = run(template, library, params, options, control=going.begin(name))
        finally:
            going.end(name)
        with lock:
            runs.append(result)
        ended = f"workflow {name}: {result.phase}" + (f" ({result.message})" if result.message else "")
        report(ended)

    return submit


def _check_injections(port: ClusterPort, injections: Sequence[Injection], agent: bool) -> list[str]:
    """The fleet's node names, once every injection is known to apply (on a copy of the fleet: a fault
    that would fail half-way through the play fails before it starts).

    Raises:
        InputError: an injection or an agent on a fleet that is not simulated, an unknown node, a fault
            the simulated fleet does not know.
    """
    if (injections or agent) and not hasattr(port, "inject"):
        raise InputError("--inject and --agent need a simulated fleet (sim:... or state:...)")
    nodes = sorted(n.name for n in port.list_nodes())
    for injection in injections:
        if injection.node not in nodes:
            raise InputError(f"--inject {injection}: no node {injection.node} (nodes: {', '.join(nodes)})")
    if injections:
        try:
            port.check_faults([(i.node, i.fault) for i in sorted(injections, key=lambda i: i.after)])  # type: ignore[attr-defined]
        except InputError as exc:
            raise InputError(f"--inject: {exc}") from None
    return nodes


def play(
    documents: Sequence[Mapping[str, Any]],
    cluster: str,
    out: Path,
    *,
    agent: bool = False,
    injections: Sequence[Injection] = (),
    duration: float = 600.0,
    interval: float = 1.0,
    until_done: bool = False,
    overrides: Mapping[str, str] | None = None,
    report: Callable[[str], None] = print,
) -> PlayResult:
    """Play the EventSources and Sensors among ``documents`` against ``cluster`` for ``duration`` seconds.

    With ``until_done`` it ends as soon as every injection happened, a Sensor started a workflow and no
    workflow is waiting or running. ``overrides`` set parameters of every submitted workflow that
    declares them (a local rehearsal's smaller sizes); the Sensor's own parameters are set first.

    Raises:
        InputError: a fault injected into a cluster that is not simulated, an agent on one that reads no
            hardware, what the player does not carry out (named).
    """
    sources, sensors = load(documents)
    if not sources or not sensors:
        raise InputError("nothing to play: the documents hold no EventSource or no Sensor")
    created = not out.exists()
    make_folder(out, "--out")
    try:
        spec = shareable(cluster, out)
        port = connect(spec)
        nodes = _check_injections(port, injections, agent)
    except BaseException:
        if created:  # nothing played: no folder left behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    result = PlayResult(out=out, cluster=spec)
    sentinels = _agents(spec, nodes) if agent else []
    running = Runs()
    submit = local_submitter(documents, spec, out, overrides or {}, result.runs, report, running)
    player = Player(port, sources, sensors, submit, report)
    observer = _Observer(port, report)
    pending = sorted(injections, key=lambda i: i.after)
    start = time.monotonic()
    report(f"playing {', '.join(s.name for s in sensors)} on {spec} (agents: {len(sentinels)})")
    try:
        while True:
            elapsed = time.monotonic() - start
            while pending and pending[0].after <= elapsed:
                injection = pending.pop(0)
                port.inject(injection.node, injection.fault)  # type: ignore[attr-defined]
                result.injected.append(injection)
                report(f"inject {injection.node}: {injection.fault}")
            for sentinel in sentinels:
                sentinel.run_once()
            observer.look()
            player.poll_once()
            if until_done and not pending and result.runs and not player.busy():
                break
            if elapsed >= duration:
                result.timed_out = True
                report(f"stopped after {duration:g}s")
                break
            time.sleep(interval)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where the caller turns it into one (signum)
        result.signal = int(getattr(exc, "signum", signal.SIGINT))
        report(f"stopped by {signal.Signals(result.signal).name}")
    finally:
        player.stop.set()  # no new submission; one waiting for its slot gives up
    _wind_down(player, running, result, report)
    return result


def _wind_down(player: Player, running: Runs, result: PlayResult, report: Callable[[str], None]) -> None:
    """Stop the runs still going as ``argo stop`` does and wait for them (their exit handlers); a second
    Ctrl-C or SIGTERM meanwhile terminates them."""
    result.stopped = running.stop_all("Stop")
    if result.stopped:
        report(
            f"stopping {', '.join(result.stopped)} as argo stop does: running steps killed, exit handlers run"
        )
    try:
        for thread in player.threads:
            thread.join()
    except KeyboardInterrupt:
        report(
            f"terminating {', '.join(running.stop_all('Terminate')) or 'nothing'}: exit handlers cut short"
        )
        for thread in player.threads:
            thread.join()

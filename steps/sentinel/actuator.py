"""The repairs the sentinel's agent carries out on its own node, each one the chart turns on.

``dsx-remediate`` asks for a repair once the node is drained (the label ``dsx.dev/repair=ACTION``, the
request's time in ``dsx.dev/repair-requested-at``, the GPUs in ``dsx.dev/repair-gpus``); the agent reads
its node as it does for its metrics, and acts on a request of an action it was given:

- ``reset-gpu`` (``--reset-gpus``): each named GPU, once nothing holds it, is reset through the health
  source (``nvidia-smi --gpu-reset`` on a node, the simulated fleet's reset in a test); a GPU a process
  still holds is not reset, and the request fails naming the process. After a reset the XIDs of the GPU's
  earlier life are forgotten and the agent probes again at once, so its reading of the reset GPU clears
  the fault (or keeps it) within the pass.
- ``reboot`` (``--kured-sentinel PATH``): the file kured watches is written (``/var/run/reboot-required``
  on the host by kured's default), so kured's lock, drain rules and reboot window apply; kured reboots,
  and the agent of the new boot says the reboot came.
- ``reboot`` (``--reboot-command CMD``), the agent's own: the command is run once the outcome
  ``Running`` is written (the chart's, as kured's: ``nsenter -m/proc/1/ns/mnt -- /bin/systemctl reboot``
  from a privileged container in the host's PID namespace); a command that fails fails the request with
  what it said, and the agent of the new boot says the reboot came. No lock is taken: remediation's own
  limits (the breaker, the taint budget, one remediation a node) bound how many nodes reboot at once.

What it did is written on the node as the outcome (:mod:`steps.sentinel.outcome`): ``Running`` before it
acts, then ``Succeeded`` or ``Failed`` with what it found; the remediation's repair wait reads it and puts
it in the ledger. A request it acted on is never acted on twice (the outcome says it is answered), and a
request of an action it was not given is left to whatever the operator runs.
"""

from __future__ import annotations

import datetime as dt
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from steps.cluster import vocabulary as vocab
from steps.cluster.changes import format_time
from steps.cluster.health import GpuResetError, NodeReport, gpu_resetter
from steps.cluster.node import Node
from steps.cluster.port import ClusterPort
from steps.errors import DsxError
from steps.sentinel.outcome import Phase, RepairOutcome, annotation, outcome_of, requested_gpus
from steps.sentinel.probes import NodeProbes

__all__ = ["KURED", "REBOOT", "RESET", "RepairActuator"]

RESET = "agent/reset-gpu"
"""The outcome's actuator for a GPU reset by the agent."""
KURED = "agent/kured"
"""The outcome's actuator for a reboot asked of kured by the agent."""
REBOOT = "agent/reboot"
"""The outcome's actuator for a reboot the agent makes itself."""
#: How long the reboot command may take to return (systemctl reboot returns once the job is queued).
REBOOT_COMMAND_TIMEOUT_S = 60.0


class RepairActuator:
    """The repairs one node's agent carries out.

    Args:
        node: the node's name.
        port: where the outcome and Events are written.
        probes: the node's probes: their health source resets GPUs, and they forget a reset GPU's XIDs.
        reset_gpus: whether to carry out ``reset-gpu`` requests.
        kured_sentinel: the file kured watches, as this process sees it (``None``: not through kured).
        reboot_command: the command that reboots the node (``None``: the agent does not reboot it).
        clock: the current time (UTC).

    Raises:
        ValueError: both ``kured_sentinel`` and ``reboot_command`` are given (one reboots the node).
    """

    def __init__(
        self,
        node: str,
        port: ClusterPort,
        probes: NodeProbes,
        *,
        reset_gpus: bool = False,
        kured_sentinel: str | Path | None = None,
        reboot_command: Sequence[str] | None = None,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        if kured_sentinel and reboot_command:
            raise ValueError("a reboot goes through kured or the agent's own command, not both")
        self.node = node
        self.port = port
        self.probes = probes
        self.reset_gpus = reset_gpus
        self.kured_sentinel = Path(kured_sentinel) if kured_sentinel else None
        self.reboot_command = list(reboot_command) if reboot_command else None
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))

    @property
    def enabled(self) -> bool:
        """Whether it carries out any action at all."""
        return self.reset_gpus or self.kured_sentinel is not None or self.reboot_command is not None

    def act(self, node: Node) -> bool:
        """Act on ``node``'s repair request when it is one of this actuator's and not answered yet;
        whether GPUs were reset (the probes must run again)."""
        asked = node.annotations.get(vocab.ANNOTATION_REPAIR_REQUESTED_AT, "")
        action = node.labels.get(vocab.LABEL_REPAIR, "")
        if not asked or node.labels.get(vocab.LABEL_STATE) != vocab.NodeState.awaiting_repair.value:
            return False
        answered = outcome_of(node)
        if action == "reboot" and self.kured_sentinel is not None:
            doing = f"asked kured for a reboot: wrote {self.kured_sentinel}"
            self._reboot(node, asked, answered, KURED, doing, self._ask_kured)
        elif action == "reboot" and self.reboot_command is not None:
            doing = f"rebooting: {shlex.join(self.reboot_command)}"
            self._reboot(node, asked, answered, REBOOT, doing, self._run_reboot)
        elif action == "reset-gpu" and self.reset_gpus and answered is None:
            return self._reset(node, asked)
        return False

    # ----------------------------------------------------------------- reboot: kured's, or the agent's own

    def _reboot(
        self,
        node: Node,
        asked: str,
        answered: RepairOutcome | None,
        actuator: str,
        doing: str,
        ask: Callable[[str], str | None],
    ) -> None:
        """Ask for the reboot once, ``Running`` written first (a reboot the agent makes may end it before it
        writes anything after), and say ``Succeeded`` once the node runs a new boot. ``ask`` does the asking
        and returns why it could not (``None``: asked)."""
        old_boot = node.annotations.get(vocab.ANNOTATION_REPAIR_BOOT_ID, "")
        new_boot = node.node_info.boot_id
        rebooted = bool(old_boot) and new_boot not in ("", old_boot)
        mine = answered is not None and answered.actuator == actuator and answered.phase == "Running"
        if answered is None and not rebooted:
            if not self._say(asked, actuator, "Running", doing):
                return  # not recorded: nothing is asked until it is (the next read of the node)
            failed = ask(asked)
            if failed is not None:
                self._say(asked, actuator, "Failed", failed)
        elif mine and rebooted:
            self._say(asked, actuator, "Succeeded", f"rebooted: boot {new_boot} (was {old_boot})")

    def _ask_kured(self, asked: str) -> str | None:
        assert self.kured_sentinel is not None
        try:
            self.kured_sentinel.parent.mkdir(parents=True, exist_ok=True)
            self.kured_sentinel.write_text(f"dsx-remediate asks for a reboot of {self.node} ({asked})\n")
        except OSError as exc:
            return f"could not write kured's sentinel {self.kured_sentinel}: {exc}"
        return None

    def _run_reboot(self, asked: str) -> str | None:
        assert self.reboot_command is not None
        shown = shlex.join(self.reboot_command)
        try:
            done = subprocess.run(
                self.reboot_command,
                capture_output=True,
                text=True,
                timeout=REBOOT_COMMAND_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{shown} could not run: {exc}"
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).split())[:300] or "nothing"
            return f"{shown} exited {done.returncode}: {said}"
        return None

    # ----------------------------------------------------------------- GPU reset

    def _reset(self, node: Node, asked: str) -> bool:
        resetter = gpu_resetter(self.probes.source)
        uuids = requested_gpus(node)
        if resetter is None:
            self._say(asked, RESET, "Failed", "this node's health source cannot reset a GPU")
            return False
        if not uuids:
            self._say(asked, RESET, "Failed", f"the request names no GPU ({vocab.ANNOTATION_REPAIR_GPUS})")
            return False
        names = _names(self.probes.report)
        named = ", ".join(names.get(u, u) for u in uuids)
        self._say(asked, RESET, "Running", f"resetting {named}")
        try:
            for uuid in uuids:
                holders = resetter.gpu_holders(self.node, uuid)
                if holders:
                    raise GpuResetError(f"{names.get(uuid, uuid)} is held by {', '.join(holders)}: not reset")
        except GpuResetError as exc:
            self._say(asked, RESET, "Failed", str(exc))
            return False
        done: list[str] = []
        said: list[str] = []
        failed = ""
        for uuid in uuids:
            try:
                said.append(resetter.reset_gpu(self.node, uuid))
            except GpuResetError as exc:
                failed = f"{names.get(uuid, uuid)}: reset failed: {exc}"
                break
            done.append(uuid)
        self.probes.forget_gpus(done)
        if failed:
            self._say(asked, RESET, "Failed", "; ".join([*said, failed]))
        else:
            self._say(asked, RESET, "Succeeded", "; ".join(said) or f"reset {named}")
        return bool(done)

    # ----------------------------------------------------------------- saying

    def _say(self, asked: str, actuator: str, phase: Phase, message: str) -> bool:
        """Write the outcome on the node, and an Event; whether the outcome was written. A failed write is
        said on the next act (the request reads unanswered, so a Running outcome never written is tried
        again)."""
        outcome = RepairOutcome(
            requested_at=asked, actuator=actuator, phase=phase, at=format_time(self.clock()), message=message
        )
        try:
            self.port.set_node_metadata(
                self.node, annotations={vocab.ANNOTATION_REPAIR_OUTCOME: annotation(outcome)}
            )
        except DsxError as exc:
            print(f"warning: sentinel: repair outcome {phase} not written: {exc}", file=sys.stderr)
            return False
        kind = "Warning" if phase == "Failed" else "Normal"
        try:
            self.port.record_event(self.node, f"DsxRepair{phase}", f"{actuator}: {message}", kind)
        except DsxError as exc:
            print(f"warning: sentinel: repair Event {phase} not written: {exc}", file=sys.stderr)
        return True


def _names(report: NodeReport | None) -> dict[str, str]:
    """Each GPU's UUID -> how the sentinel names it (``GPU 3 (GPU-...)``)."""
    if report is None:
        return {}
    return {g.uuid: f"GPU {g.index} ({g.uuid})" for g in report.gpus}

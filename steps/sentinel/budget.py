"""The taint budget: how many GPU nodes the sentinel agents may taint within a window, fleet-wide.

A fault that is not the node's own (a bad driver roll-out, a kernel-log format the parser misreads, a typo
in the catalogue's overrides) reads fatal on every node at once. Without a bound every agent would taint its
node within one pass, and no pod could be scheduled anywhere, not even the restart of the jobs that just
failed. So an agent asks the budget before it taints (:meth:`TaintBudget.admit`): agents may taint at most
``max_share`` of the GPU nodes (at least one node) within a sliding window of ``window_s`` seconds.

- A node already in the window is admitted again and takes no second slot (a second fatal fault, a taint
  that remediation lifted and a new fault put back); a node that already carries the taint is not asked
  about at all (the agent has nothing to write).
- The first taint past the limit *holds* the budget: that taint and every later one is withheld. The agent
  still sets its condition, writes the Warning Event ``DsxTaintBudgetHeld`` (naming this ConfigMap, when
  and why it held, and how many nodes are in the window), counts the taint in
  ``dsx_sentinel_taint_withheld_total{reason="budget"}``, and asks again now and then.
- A held budget stays held until a person resets it (``dsx sentinel budget reset --by NAME``): one that let
  go by itself as the window moved on would taint the rest of the fleet at the window's pace. A reset
  records who and when and empties the window, so the next taints withheld land (at most the limit of
  them before it holds again).

Its state is the ConfigMap ``dsx-taint-budget`` in dsx's namespace (beside the quarantine breaker's
``dsx-quarantine-breaker``), written with optimistic concurrency, with the keys:

- ``state``: ``ok`` or ``held``;
- ``tainted``: JSON ``{node: RFC 3339 time}``, the nodes agents tainted within the window (never more than
  the limit, so it does not grow with the fleet);
- ``held-at``, ``held-reason``: when and why it held;
- ``reset-at``, ``reset-by``: the last reset.

A refusal writes nothing: a held budget read by every agent of a large fleet costs reads, not a storm of
conflicting writes.

The share is of the GPU nodes the sentinel DaemonSet runs on (:class:`GpuNodes`): its
``status.desiredNumberScheduled``, one small read, where every agent listing 2,000 nodes at the moment a
fleet-wide fault strikes would load the API server when it matters most. Without a DaemonSet named (a
simulated fleet, an agent run by hand) the nodes with ``nvidia.com/gpu`` capacity are counted instead.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable
from typing import Literal

from pydantic import Field

from steps.cluster import changes
from steps.cluster.errors import ClusterError
from steps.cluster.port import ClusterPort
from steps.durations import format_duration
from steps.errors import InputError
from steps.models import Frozen

__all__ = [
    "BUDGET_CONFIGMAP",
    "GpuNodes",
    "TaintBudget",
    "TaintBudgetSettings",
    "TaintBudgetStatus",
    "parse_daemonset",
]

BUDGET_CONFIGMAP = "dsx-taint-budget"


class TaintBudgetSettings(Frozen):
    """How much of the fleet the agents may taint.

    Attributes:
        max_share: the largest share of GPU nodes tainted by agents within the window (at least one node
            is always allowed, so a small fleet still taints its one faulty node).
        window_s: the sliding window, in seconds.
    """

    max_share: float = Field(0.1, gt=0, le=1)
    window_s: float = Field(3600, gt=0)

    def limit(self, gpu_nodes: int) -> int:
        """Nodes the window may hold for a fleet of ``gpu_nodes``."""
        return max(1, math.floor(self.max_share * gpu_nodes))

    def describe(self, gpu_nodes: int) -> str:
        """The budget in words: ``2 of 20 GPU nodes (10%) within 1h00m``."""
        within = format_duration(self.window_s)
        return f"{self.limit(gpu_nodes)} of {gpu_nodes} GPU nodes ({self.max_share:.0%}) within {within}"


class TaintBudgetStatus(Frozen):
    """The budget as stored: ok or held, the nodes in the window, the last hold and reset."""

    state: Literal["ok", "held"] = "ok"
    tainted: dict[str, str] = Field(default_factory=dict)
    held_at: str = ""
    held_reason: str = ""
    reset_at: str = ""
    reset_by: str = ""

    @classmethod
    def from_data(cls, data: dict[str, str]) -> TaintBudgetStatus:
        """Read the ConfigMap's data; ``InputError`` naming the ConfigMap when it was edited into nonsense."""
        try:
            tainted = json.loads(data.get("tainted") or "{}")
            return cls(
                state="held" if data.get("state") == "held" else "ok",
                tainted={str(k): str(v) for k, v in dict(tainted).items()},
                held_at=data.get("held-at", ""),
                held_reason=data.get("held-reason", ""),
                reset_at=data.get("reset-at", ""),
                reset_by=data.get("reset-by", ""),
            )
        except (ValueError, TypeError) as exc:
            raise InputError(
                f"ConfigMap {BUDGET_CONFIGMAP}: key 'tainted' is not a JSON object of node to time ({exc})"
            ) from None

    def to_data(self) -> dict[str, str]:
        """The ConfigMap's data (sorted keys, so a write that changes nothing is not a write)."""
        data = {"state": self.state, "tainted": json.dumps(dict(sorted(self.tainted.items())))}
        for key, value in (
            ("held-at", self.held_at),
            ("held-reason", self.held_reason),
            ("reset-at", self.reset_at),
            ("reset-by", self.reset_by),
        ):
            if value:
                data[key] = value
        return data


def parse_daemonset(text: str, where: str = "--fleet-daemonset") -> tuple[str, str]:
    """``(namespace, name)`` from ``NAMESPACE/NAME``.

    Raises:
        InputError: naming ``where`` when the text is not two non-empty parts.
    """
    namespace, sep, name = text.strip().partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise InputError(f"{where} {text!r}: expected NAMESPACE/NAME of the sentinel's DaemonSet")
    return namespace, name


class GpuNodes:
    """How many GPU nodes the budget's share is of (see the module docstring).

    Args:
        port: the cluster.
        daemonset: ``(namespace, name)`` of the sentinel's DaemonSet, whose ``desiredNumberScheduled`` is
            the count; ``None``: count the nodes with GPUs.
    """

    def __init__(self, port: ClusterPort, daemonset: tuple[str, str] | None = None) -> None:
        self.port, self.daemonset = port, daemonset

    def __call__(self) -> int:
        """The count now.

        Raises:
            ClusterError: the API server is away (:class:`~steps.cluster.errors.ApiUnavailableError`),
                refuses the read, or the DaemonSet named does not exist or reports no count.
        """
        if self.daemonset is None:
            return sum(1 for n in self.port.list_nodes() if n.gpu_count > 0)
        namespace, name = self.daemonset
        found = self.port.get_object("apps/v1", "DaemonSet", name, namespace)
        target = f"daemonset/{namespace}/{name}"
        if found is None:
            raise ClusterError("taint budget", target, "the sentinel's DaemonSet does not exist", 404)
        desired = (found.get("status") or {}).get("desiredNumberScheduled")
        if not isinstance(desired, int) or desired < 1:
            raise ClusterError(
                "taint budget", target, f"its status has no desiredNumberScheduled ({desired!r})"
            )
        return desired


class TaintBudget:
    """The taint budget over the port's state ConfigMap (see the module docstring).

    Args:
        port: the cluster.
        settings: share and window.
        gpu_nodes: the count the share is of (default: :class:`GpuNodes` without a DaemonSet).
        clock: the current time (tests pass their own).
    """

    def __init__(
        self,
        port: ClusterPort,
        settings: TaintBudgetSettings | None = None,
        gpu_nodes: Callable[[], int] | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.port = port
        self.settings = settings or TaintBudgetSettings()
        self.gpu_nodes = gpu_nodes or GpuNodes(port)
        self.clock = clock

    def status(self) -> TaintBudgetStatus:
        """The budget as stored now."""
        return TaintBudgetStatus.from_data(self.port.get_state(BUDGET_CONFIGMAP))

    def _windowed(self, status: TaintBudgetStatus, now: dt.datetime) -> dict[str, str]:
        horizon = now - dt.timedelta(seconds=self.settings.window_s)
        return {n: at for n, at in status.tainted.items() if changes.parse_time(at) > horizon}

    def admit(self, node: str) -> tuple[bool, str]:
        """Ask to taint ``node``: ``(True, why)`` when it may, ``(False, why)`` when the budget holds.

        A node already in the window is admitted without a second slot. A node that would take the
        window past the limit holds the budget: it is recorded with the time and the reason and stays
        held until :meth:`reset`. The GPU nodes are counted only when a slot is to be taken.

        Raises:
            ClusterError: the budget or the GPU node count could not be read or written (the API server
                away: :class:`~steps.cluster.errors.ApiUnavailableError`); nothing was decided.
            InputError: the ConfigMap was edited into something that does not parse.
        """
        now = self.clock()
        verdict: list[tuple[bool, str]] = []
        counted: list[int] = []

        def change(data: dict[str, str]) -> dict[str, str]:
            verdict.clear()
            status = TaintBudgetStatus.from_data(data)
            window = self._windowed(status, now)
            if status.state == "held":
                verdict.append((False, _held(status, len(window))))
                return data  # a refusal writes nothing
            if node in window:
                verdict.append((True, f"{node} is already in the taint budget's window"))
                return data
            if not counted:
                counted.append(self.gpu_nodes())
            gpu_nodes = counted[0]
            limit = self.settings.limit(gpu_nodes)
            if len(window) + 1 > limit:
                reason = (
                    f"{node} would have been node {len(window) + 1} tainted, over the budget of "
                    f"{self.settings.describe(gpu_nodes)}"
                )
                held = status.model_copy(
                    update={
                        "state": "held",
                        "tainted": window,
                        "held_at": changes.format_time(now),
                        "held_reason": reason,
                    }
                )
                verdict.append((False, _held(held, len(window))))
                return held.to_data()
            window[node] = changes.format_time(now)
            verdict.append((True, f"{node} admitted ({len(window)} of {limit} in the taint budget's window)"))
            return status.model_copy(update={"tainted": window}).to_data()

        self.port.update_state(BUDGET_CONFIGMAP, change)
        return verdict[0]

    def reset(self, by: str) -> TaintBudgetStatus:
        """Let the budget take taints again and empty its window, recording who reset it and when."""
        now = changes.format_time(self.clock())

        def change(data: dict[str, str]) -> dict[str, str]:
            return TaintBudgetStatus(reset_at=now, reset_by=by).to_data()

        return TaintBudgetStatus.from_data(self.port.update_state(BUDGET_CONFIGMAP, change))


def _held(status: TaintBudgetStatus, in_window: int) -> str:
    nodes = "node" if in_window == 1 else "nodes"
    return (
        f"the taint budget (ConfigMap {BUDGET_CONFIGMAP}) holds since {status.held_at}: "
        f"{status.held_reason}; {in_window} {nodes} in its window; "
        "reset it with `dsx sentinel budget reset --by NAME`"
    )

"""Counters read as rates: how much a monotonic counter grew over the last window, per hour.

NVML and sysfs count errors since the driver loaded or the port came up (PCIe replays, NVLink CRC
errors, corrected ECC errors, InfiniBand symbol errors). A lifetime total says little: a GPU with
two hundred replays over a year of service is healthy, one with two hundred in the last ten minutes is
not. The probes judge the growth: each change of a counter is kept with its time, and its rate is
what it grew since the window's start (an hour back by default; its value then is that of its last
change before it), scaled to an hour.

A counter that goes down was reset (a driver reload, a port reset): its history starts again at that
reading. Until a counter has been watched for ``min_span_s`` there is no rate at all, so that two
readings a second apart never extrapolate a burst to an hourly figure; within the first hour the rate
is what it grew since the agent started, scaled to an hour.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["CounterRates", "Rate"]

HOUR_S = 3600.0


@dataclass(frozen=True)
class Rate:
    """A counter's growth over the span it was watched within the window."""

    increase: int
    span_s: float

    @property
    def per_hour(self) -> float:
        """The growth scaled to an hour."""
        return self.increase * HOUR_S / self.span_s

    def words(self) -> str:
        """``12 in the last 42 min``."""
        return f"{self.increase} in the last {self.span_s / 60.0:.0f} min"


def _value_at(changes: deque[tuple[float, int]], start: float) -> int:
    """The counter's value at ``start``: that of its newest change at or before it, else its first."""
    value = changes[0][1]
    for at, changed in changes:
        if at > start:
            break
        value = changed
    return value


class CounterRates:
    """The readings of every counter a node's probes watch, by key, within a sliding window.

    Only a reading that changed a counter is kept (with when it was first watched), so the history, which
    the agent keeps in its state file across restarts (:meth:`snapshot`), changes only when a counter does.

    Args:
        window_s: how far back a rate looks, in seconds.
        min_span_s: how long a counter must have been watched before it has a rate, in seconds.
        keep_s: how far back the changes are kept (at least ``window_s``), for :meth:`growth` over
            longer spans (the fault history's port rules).
    """

    def __init__(self, window_s: float = HOUR_S, min_span_s: float = 60.0, keep_s: float = 0.0) -> None:
        if window_s <= 0 or min_span_s <= 0 or min_span_s > window_s:
            raise ValueError(f"window {window_s:g} s, minimum span {min_span_s:g} s: need 0 < span <= window")
        self.window_s = window_s
        self.min_span_s = min_span_s
        self.keep_s = max(window_s, keep_s)
        self._changes: dict[tuple[str, ...], deque[tuple[float, int]]] = {}
        self._since: dict[tuple[str, ...], float] = {}

    def observe(self, key: tuple[str, ...], value: int, at: float) -> Rate | None:
        """Record ``value`` of counter ``key`` read at ``at`` (seconds); its rate, or None while it has
        been watched for less than ``min_span_s`` (since the agent started or the counter was reset)."""
        changes = self._changes.setdefault(key, deque())
        if not changes or value < changes[-1][1]:  # first watched, or reset: counting starts here
            changes.clear()
            changes.append((at, value))
            self._since[key] = at
        elif value != changes[-1][1] and at > changes[-1][0]:
            changes.append((at, value))
        while len(changes) > 1 and changes[1][0] <= at - self.keep_s:
            changes.popleft()  # the newest change at or before the oldest start asked about stays
        span = min(at - self._since[key], self.window_s)
        if span < self.min_span_s:
            return None
        return Rate(increase=max(0, value - _value_at(changes, at - self.window_s)), span_s=span)

    def growth(self, key: tuple[str, ...], seconds: float, at: float) -> int | None:
        """How much counter ``key`` grew within the ``seconds`` before ``at`` (since it was first watched
        or reset, when that is later); None for a counter never observed."""
        changes = self._changes.get(key)
        if not changes:
            return None
        return max(0, changes[-1][1] - _value_at(changes, at - min(seconds, self.keep_s)))

    def counters(self) -> list[tuple[str, ...]]:
        """Every counter observed."""
        return list(self._changes)

    def snapshot(self) -> list[list[object]]:
        """What a restarted agent of the same boot needs to go on: per counter, its key, since when it is
        watched, and its changes."""
        return [
            [list(key), self._since[key], [list(change) for change in changes]]
            for key, changes in sorted(self._changes.items())
        ]

    def restore(self, data: Any) -> None:
        """Take over a :meth:`snapshot`.

        Raises:
            ValueError: ``data`` is not such a snapshot.
        """
        changes: dict[tuple[str, ...], deque[tuple[float, int]]] = {}
        since: dict[tuple[str, ...], float] = {}
        try:
            for key, started, readings in data:
                name = tuple(str(part) for part in key)
                since[name] = float(started)
                changes[name] = deque((float(at), int(value)) for at, value in readings)
                if not changes[name]:
                    raise ValueError(f"counter {'/'.join(name)} has no reading")
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a counter history snapshot: {exc}") from None
        self._changes, self._since = changes, since

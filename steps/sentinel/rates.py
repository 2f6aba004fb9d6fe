"""Counters read as rates: how much a monotonic counter grew over the last window, per hour.

NVML and sysfs count errors since the driver loaded or the port came up (PCIe replays, NVLink CRC
errors, corrected ECC errors, InfiniBand symbol errors). A lifetime total says little: a GPU with
two hundred replays over a year of service is healthy, one with two hundred in the last ten minutes is
not. The probes judge the growth: each reading of a counter is kept with its time, and its rate is
what it grew since the oldest reading still inside the window (an hour by default), scaled to an hour.

A counter that goes down was reset (a driver reload, a port reset): its history starts again at that
reading. Until a counter has been watched for ``min_span_s`` there is no rate at all, so that two
readings a second apart never extrapolate a burst to an hourly figure; within the first hour the rate
is what it grew since the agent started, scaled to an hour.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

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


class CounterRates:
    """The readings of every counter a node's probes watch, by key, within a sliding window.

    Args:
        window_s: how far back a rate looks, in seconds.
        min_span_s: how long a counter must have been watched before it has a rate, in seconds.
    """

    def __init__(self, window_s: float = HOUR_S, min_span_s: float = 60.0) -> None:
        if window_s <= 0 or min_span_s <= 0 or min_span_s > window_s:
            raise ValueError(f"window {window_s:g} s, minimum span {min_span_s:g} s: need 0 < span <= window")
        self.window_s = window_s
        self.min_span_s = min_span_s
        self._readings: dict[Hashable, deque[tuple[float, int]]] = {}

    def observe(self, key: Hashable, value: int, at: float) -> Rate | None:
        """Record ``value`` of counter ``key`` read at ``at`` (seconds); its rate, or None while it has
        been watched for less than ``min_span_s`` (since the agent started or the counter was reset).
        A reading at or before the last one of that counter is ignored for the history (a clock that
        stepped back) but still judged against it."""
        readings = self._readings.setdefault(key, deque())
        if readings and value < readings[-1][1]:
            readings.clear()  # reset: counting starts again from here
        if not readings or at > readings[-1][0]:
            readings.append((at, value))
        # keep the newest reading at or before the window's start: the growth is measured from there
        while len(readings) > 1 and readings[1][0] <= at - self.window_s:
            readings.popleft()
        first_at, first_value = readings[0]
        span = at - first_at
        if span < self.min_span_s:
            return None
        return Rate(increase=max(0, value - first_value), span_s=span)

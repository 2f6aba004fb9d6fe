"""Bisection: from a group that fails while its members pass alone, to the nodes at fault.

- :mod:`~steps.readiness.bisect.models`: a group test's result, every test run, suspects, the result;
- :mod:`~steps.readiness.bisect.session`: rounds, repeats within the noise band, the clock, node time;
- :mod:`~steps.readiness.bisect.strategies`: ``halving``, ``pairs`` and ``auto`` over any group test;
- :mod:`~steps.readiness.bisect.probes`: the group tests: the fabric model of a simulated fleet, and real
  local gloo measurements for small ones.
"""

from steps.readiness.bisect.models import (
    STRATEGIES,
    BisectResult,
    GroupResult,
    GroupTest,
    Strategy,
    Suspect,
    TestRun,
)
from steps.readiness.bisect.strategies import bisect, choose

__all__ = [
    "STRATEGIES",
    "BisectResult",
    "GroupResult",
    "GroupTest",
    "Strategy",
    "Suspect",
    "TestRun",
    "bisect",
    "choose",
]

"""Bisection: from a group that fails while its members pass alone, to the nodes at fault.

- :mod:`~steps.readiness.bisect.models`: a group test's result, every test run, suspects, the result;
- :mod:`~steps.readiness.bisect.evidence`: the posterior every test updates, and the screening rule;
- :mod:`~steps.readiness.bisect.session`: rounds, repeats within the noise band, how a result reads, the
  clock, node time;
- :mod:`~steps.readiness.bisect.strategies`: the search over any group test (``halving``, ``pairs``,
  ``auto``), with its stopping rule;
- :mod:`~steps.readiness.bisect.probes`: the group tests: the fabric model of a simulated fleet, and real
  local gloo measurements for small ones.
"""

from steps.readiness.bisect.models import (
    STRATEGIES,
    BisectResult,
    GroupResult,
    GroupTest,
    SharedLeaf,
    Strategy,
    Suspect,
    TestRun,
    Unresolved,
)
from steps.readiness.bisect.strategies import Search, bisect

__all__ = [
    "STRATEGIES",
    "BisectResult",
    "GroupResult",
    "GroupTest",
    "Search",
    "SharedLeaf",
    "Strategy",
    "Suspect",
    "TestRun",
    "Unresolved",
    "bisect",
]

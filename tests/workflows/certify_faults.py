"""Step functions that break the certification workflow on purpose, for the workflow-level tests.

Each stands in for a real step in a copy of the compiled ``dsx-certify`` template (``dsx run --file``).
Steps run through Hera's runner: real annotations, no ``from __future__ import annotations``.
"""

from steps.readiness.certify import node_check
from steps.readiness.outcomes import CheckResult, RunRef


def crash_on_node_01(node: str, run: RunRef) -> CheckResult:
    """``node_check``, except that the check of node-01 crashes (as a pod killed mid-test would)."""
    if node == "node-01":
        raise RuntimeError("node-check of node-01 crashed on purpose")
    return node_check(node, run)

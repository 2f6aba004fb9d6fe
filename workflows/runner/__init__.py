"""The local runner: dsx's compiled Argo workflows executed on one machine with Argo's semantics.

``validate`` rejects, before anything runs, every construct the runner does not carry out (naming it
and where); ``plan`` says what a run would do; ``run`` carries the workflow out, keeping each step's
logs, outputs and artifacts in a run folder, and returns Argo's final phase with every node.
"""

from workflows.runner.api import ARTIFACT_REPOSITORIES, plan, resolve_parameters, run, suspend_names, warnings
from workflows.runner.errors import NodeError, UnsupportedConstruct
from workflows.runner.host import trusted_steps
from workflows.runner.model import NodeStatus, Phase, Plan, RunOptions, RunResult, TrustedSteps
from workflows.runner.validate import check, validate

__all__ = [
    "ARTIFACT_REPOSITORIES",
    "NodeError",
    "NodeStatus",
    "Phase",
    "Plan",
    "RunOptions",
    "RunResult",
    "TrustedSteps",
    "UnsupportedConstruct",
    "check",
    "plan",
    "resolve_parameters",
    "run",
    "suspend_names",
    "trusted_steps",
    "validate",
    "warnings",
]

"""Which DCGM diagnostics a certification runs on each node: the ``diag`` option and the fault policy.

``diag`` is ``auto`` (the default), ``off``, or a run for every node (what ``dcgmi diag -r`` takes: a
level 1-4 or DCGM test names, comma-separated). ``auto`` runs diagnostics only on a node under
remediation or escalated by it (a ``dsx.dev/state`` label, and ``dsx.dev/remediation-check``, set at
quarantine), chosen by the fault's check from ``recipes/faults/diagnostics.yaml``: memory faults run the
memory tests, a fault of the whole GPU the long level, a NIC none (the sweep tests it). Any other node
runs none: a fleet's certification is its sweeps and smoke run, and its cost stays what it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from steps.cluster import Node
from steps.cluster import vocabulary as vocab
from steps.errors import InputError
from steps.models import Camel, read_model
from steps.readiness.ranks.diag import DCGM_TESTS
from steps.yamlio import shipped

__all__ = ["AUTO", "OFF", "DiagnosticsPolicy", "check_run", "load_policy", "node_runs"]

AUTO = "auto"
OFF = "off"


def _normal(text: str) -> str:
    """``text`` as ``dcgmi diag -r`` takes it (spaces dropped), when it is ``off``, a level 1-4 or known
    test names, comma-separated.

    Raises:
        ValueError: it is none of these.
    """
    run = text.strip()
    if run == OFF or run in ("1", "2", "3", "4"):
        return run
    names = [name.strip() for name in run.split(",")]
    if not run or any(name not in DCGM_TESTS for name in names):
        raise ValueError(
            f"{text!r} is not a DCGM diagnostic run: give off, a level 1-4, or test names from "
            f"{', '.join(DCGM_TESTS)}, comma-separated"
        )
    return ",".join(names)


def check_run(text: str, where: str) -> str:
    """``text`` if it is ``off`` or a run ``dcgmi diag -r`` takes, as it takes it.

    Raises:
        InputError: it is neither (``where`` names the option).
    """
    try:
        return _normal(text)
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from None


class DiagnosticsPolicy(Camel):
    """The runs by sentinel check (kind ``RecertificationDiagnostics``)."""

    api_version: Literal["dsx.dev/v1alpha1"] = "dsx.dev/v1alpha1"
    kind: Literal["RecertificationDiagnostics"] = "RecertificationDiagnostics"
    default: str = Field(description="the run for a check not listed")
    checks: dict[str, str] = Field(default_factory=dict)

    @field_validator("default")
    @classmethod
    def _default(cls, value: str) -> str:
        return _normal(value)

    @field_validator("checks")
    @classmethod
    def _checks(cls, value: dict[str, str]) -> dict[str, str]:
        for check in value:
            if check not in vocab.SENTINEL_CHECKS:
                raise ValueError(f"{check!r} is not a sentinel check ({', '.join(vocab.SENTINEL_CHECKS)})")
        runs = {}
        for check, run in value.items():
            try:
                runs[check] = _normal(run)
            except ValueError as exc:
                raise ValueError(f"{check}: {exc}") from None
        return runs

    def run_for(self, check: str) -> str:
        """The run after a fault of ``check``."""
        return self.checks.get(check, self.default)


def load_policy(path: Path | None = None) -> DiagnosticsPolicy:
    """The policy in ``path`` (default: the shipped ``recipes/faults/diagnostics.yaml``).

    Raises:
        InputError: the file is missing, not YAML, or names an unknown check or run (file and line).
    """
    return read_model(
        path or shipped("faults", "diagnostics.yaml"), DiagnosticsPolicy, what="RecertificationDiagnostics"
    )


def node_runs(option: str, nodes: list[Node], policy: DiagnosticsPolicy | None = None) -> dict[str, str]:
    """The diagnostics each node runs under ``option``, by node name; a node that runs none is absent.

    Raises:
        InputError: ``option`` is not ``auto``, ``off`` or a run.
    """
    if option.strip() == AUTO:
        chosen = policy or load_policy()
        runs = {}
        for node in nodes:
            check = node.annotations.get(vocab.ANNOTATION_REMEDIATION_CHECK)
            if check and node.labels.get(vocab.LABEL_STATE):  # in remediation, or escalated by it
                runs[node.name] = chosen.run_for(check)
        return {name: run for name, run in runs.items() if run != OFF}
    run = check_run(option, "certify option: diag")
    return {} if run == OFF else {node.name: run for node in nodes}

"""Thresholds from the resolved recipe, in this part's own model.

The recipe carries a ``thresholds`` mapping with camelCase keys (as in the recipe YAML)::

    thresholds:
      nccl:
        allReduce:
          - {size: 1GiB, busBwGBps: 360, scope: node}
          - {size: 1GiB, busBwGBps: 340, scope: multi-node}
        relative: {madFactor: 3.0, minGroups: 3}
        timeoutFactor: 2.5
        noiseBand: 0.03
      training: {steps: 30, stragglerSkew: 0.15, minMfu: 0.30, peakTflops: 989}

Expected bus bandwidth is named at large sizes, never the sweep's average. Sizes accept B, KiB, MiB,
GiB and plain integers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from steps.errors import InputError
from steps.models import Camel, input_error
from steps.readiness.sizes import parse_size

__all__ = [
    "AllReduceThreshold",
    "NcclThresholds",
    "RelativeThresholds",
    "Scope",
    "Thresholds",
    "TrainingThresholds",
    "group_timeout",
    "load_thresholds",
]

Scope = Literal["node", "multi-node"]


class AllReduceThreshold(Camel):
    """Expected all-reduce bus bandwidth at one named message size, for one scope."""

    size: int = Field(description="message size in bytes (1GiB, 8GiB... in the recipe)")
    bus_bw_gbps: float = Field(alias="busBwGBps", gt=0)
    scope: Scope = "node"

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int:
        try:
            return parse_size(value)
        except InputError as exc:
            raise ValueError(str(exc)) from None


class RelativeThresholds(Camel):
    """Relative mode: groups of equal size in the same run, judged against their median and MAD."""

    mad_factor: float = Field(default=3.0, gt=0)
    min_groups: int = Field(default=3, ge=2)


class NcclThresholds(Camel):
    """All-reduce expectations."""

    all_reduce: list[AllReduceThreshold] = Field(default_factory=list)
    relative: RelativeThresholds = Field(default_factory=RelativeThresholds)
    timeout_factor: float = Field(default=2.5, ge=1.0)
    noise_band: float = Field(
        default=0.03,
        ge=0.0,
        lt=0.5,
        description="a bisection test whose figure lies within this fraction of its threshold is run again "
        "(twice at most) and the median counts",
    )
    straggler_skew: float = Field(
        default=0.15, gt=0, description="a rank spending this fraction of the run more outside the collective"
    )


class TrainingThresholds(Camel):
    """Training smoke run expectations."""

    steps: int = Field(default=30, ge=2)
    straggler_skew: float = Field(default=0.15, gt=0)
    min_mfu: float | None = Field(default=None, gt=0, le=1)
    peak_tflops: float | None = Field(default=None, gt=0)


class Thresholds(Camel):
    """Everything readiness judges against."""

    nccl: NcclThresholds = Field(default_factory=NcclThresholds)
    training: TrainingThresholds = Field(default_factory=TrainingThresholds)

    def all_reduce(self, scope: Scope) -> list[AllReduceThreshold]:
        """The all-reduce thresholds of one scope, smallest size first."""
        return sorted((t for t in self.nccl.all_reduce if t.scope == scope), key=lambda t: t.size)


def load_thresholds(data: Mapping[str, Any] | str | Path | None) -> Thresholds:
    """Read thresholds from a mapping, a JSON text, or a YAML/JSON file; a whole recipe works too.

    A mapping with a top-level ``thresholds`` key (a resolved recipe) is read from that key.

    Raises:
        InputError: the file cannot be read, or a value is missing or wrong (the message names it,
            e.g. ``thresholds.nccl.allReduce[0].size``).
    """
    if data is None:
        return Thresholds()
    source = "thresholds"
    if isinstance(data, Path) or (isinstance(data, str) and not data.lstrip().startswith("{")):
        from steps.yamlio import load_yaml, plain

        path = Path(data)
        source = str(path)
        loaded = plain(load_yaml(path, source))  # unreadable, not UTF-8 or not YAML: naming the line
    elif isinstance(data, str):
        try:
            loaded = json.loads(data)
        except json.JSONDecodeError as exc:
            raise InputError(f"thresholds JSON, line {exc.lineno}: {exc.msg}") from None
    else:
        loaded = data
    if loaded is None:
        return Thresholds()
    if not isinstance(loaded, Mapping):
        raise InputError(f"{source}: thresholds must be a mapping, not {type(loaded).__name__}")
    if "thresholds" in loaded and isinstance(loaded["thresholds"], Mapping | None):
        loaded = loaded["thresholds"] or {}
    try:
        return Thresholds.model_validate(loaded)
    except ValidationError as exc:
        raise input_error(exc, source, prefix=("thresholds",)) from None


def group_timeout(healthy_s: float, thresholds: Thresholds) -> float:
    """The timeout of a group test: ``timeoutFactor`` times the duration of a healthy run."""
    return healthy_s * thresholds.nccl.timeout_factor

"""The data every readiness step exchanges: collective runs, subjects and verdicts.

One model, :class:`CollectiveRun`, holds both a dsx all-reduce sweep and a parsed nccl-tests log, so the
same judging code applies to a local gloo sweep and to ``all_reduce_perf`` output from a cluster.
Every model is plain pydantic and serialises to JSON with sorted keys.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "STATUS_ORDER",
    "CollectiveRun",
    "Failure",
    "Footer",
    "Measurement",
    "Model",
    "Preamble",
    "RankInfo",
    "RankStats",
    "Row",
    "RunStatus",
    "Subject",
    "Verdict",
    "VerdictStatus",
    "dump_json",
    "trusted",
    "worst",
]

RunStatus = Literal["complete", "failed", "corrupted", "incomplete"]
VerdictStatus = Literal["pass", "fail", "hang", "error"]

#: Severity of verdict statuses, mildest first: the status of a set of verdicts is the worst one.
STATUS_ORDER: dict[str, int] = {"pass": 0, "fail": 1, "hang": 2, "error": 3}


class Model(BaseModel):
    """Base of every readiness model: unknown fields are refused, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


_M = TypeVar("_M", bound=Model)

# The four slots every pydantic model instance has, set the way ``model_construct`` sets them; the slot
# descriptors' own setters cost less than ``object.__setattr__``, and ``object.__new__`` than ``cls.__new__``.
_NEW = object.__new__
_SET_DICT = BaseModel.__dict__["__dict__"].__set__
_SET_FIELDS_SET = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_SET_EXTRA = BaseModel.__dict__["__pydantic_extra__"].__set__
_SET_PRIVATE = BaseModel.__dict__["__pydantic_private__"].__set__


def trusted(cls: type[_M], values: dict[str, Any], fields_set: set[str]) -> _M:
    """An instance of ``cls`` made from values already checked, without validating them again.

    What :meth:`~pydantic.BaseModel.model_construct` does, without its loop over the fields: the
    nccl-tests parser makes thousands of rows, and validating them would cost more than reading them.
    The caller promises what validation would give: ``values`` holds every field of ``cls`` in
    declaration order, each of its declared type (defaults included), in a dict of this instance's own.
    ``fields_set`` names the fields given explicitly (``model_fields_set``); like ``model_construct``'s
    ``_fields_set`` it may be one set shared by many instances, so it is never changed. Only for
    :class:`Model` subclasses: frozen, no extra fields, no private attributes, no ``model_post_init`` and
    no ``__new__``.
    """
    model = _NEW(cls)
    _SET_DICT(model, values)
    _SET_FIELDS_SET(model, fields_set)
    _SET_EXTRA(model, None)
    _SET_PRIVATE(model, None)
    return model


class Preamble(Model):
    """The ``# nThread ... nGpus ... minBytes ...`` line of nccl-tests, or the same facts of a dsx sweep."""

    n_threads: int | None = None
    n_gpus: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    step_factor: int | None = None
    step_bytes: int | None = None
    warmup_iters: int | None = None
    iters: int | None = None
    agg_iters: int | None = None
    validation: int | None = None
    graph: int | None = None


class RankInfo(Model):
    """One rank: where it ran (host, device) as the ``#  Rank  N Group ... on HOST device ...`` lines say."""

    rank: int
    host: str
    group: int | None = None
    pid: int | None = None
    device: int | None = None
    bus_id: str | None = None
    device_name: str | None = None


class Measurement(Model):
    """One half of a result row (out-of-place or in-place); ``None`` where the log says ``N/A``."""

    time_us: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    wrong: int | None = None
    max_error: float | None = Field(default=None, description="old layout: the 'error' column")


class Row(Model):
    """One message size of the table."""

    size: int
    count: int
    type: str
    redop: str | None = None
    root: int | None = None
    out_of_place: Measurement | None = None
    in_place: Measurement | None = None
    line: int | None = Field(default=None, description="line number in the parsed log")

    def busbw(self) -> float | None:
        """The bus bandwidth judged at this size: the lower of out-of-place and in-place (GB/s)."""
        figures = [m.busbw_gbps for m in (self.out_of_place, self.in_place) if m and m.busbw_gbps is not None]
        return min(figures) if figures else None

    def wrong(self) -> int:
        """Wrong elements reported at this size, both halves together (``N/A`` counts as 0)."""
        return sum(m.wrong or 0 for m in (self.out_of_place, self.in_place) if m is not None)


class Footer(Model):
    """The two closing lines: ``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth : X``."""

    out_of_bounds: int | None = None
    out_of_bounds_ok: bool | None = None
    avg_busbw_gbps: float | None = None


class Failure(Model):
    """A ``Test NCCL failure``, ``Test CUDA failure``, ``Test failure`` or ``Test timeout`` line."""

    line: int
    host: str | None = None
    kind: str
    where: str | None = None
    message: str


class RankStats(Model):
    """How one rank of a dsx sweep spent its time: outside the collective (its own work) or inside it.

    A rank that arrives late to every collective spends its time outside; the others wait for it
    inside. ``skew`` is the rank's extra time outside, over the median rank's, as a fraction of the
    median rank's whole timed time.
    """

    rank: int
    host: str
    outside_s: float
    inside_s: float
    skew: float
    injected: str | None = None


class CollectiveRun(Model):
    """A collective benchmark run: a dsx sweep, or an nccl-tests log read by the parser."""

    source: Literal["nccl-tests", "dsx-sweep"]
    status: RunStatus
    problems: list[str] = Field(default_factory=list, description="why the run is not complete")
    collective: str | None = None
    backend: str | None = None
    layout: Literal["new", "old"] | None = None
    nccl_version: str | None = None
    preamble: Preamble | None = None
    ranks: list[RankInfo] = Field(default_factory=list)
    hosts: list[str] = Field(default_factory=list, description="hosts in rank order, each once")
    rows: list[Row] = Field(default_factory=list)
    footer: Footer | None = None
    failures: list[Failure] = Field(default_factory=list)
    injected: list[str] = Field(default_factory=list, description="faults injected on purpose")
    rank_stats: list[RankStats] = Field(default_factory=list)

    def row_at(self, size: int) -> Row | None:
        """The row measured at exactly ``size`` bytes (the first one, for logs with several types)."""
        return next((row for row in self.rows if row.size == size), None)


class Subject(Model):
    """What a verdict is about: one node, or a group of nodes tested together."""

    kind: Literal["node", "group"]
    name: str
    members: list[str] = Field(default_factory=list)


class Verdict(Model):
    """One certification result, as DESIGN.md "Verdict" says: who, what, figure, threshold, evidence."""

    subject: Subject
    test: str
    status: VerdictStatus
    measured: float | None = None
    threshold: float | None = None
    unit: str | None = None
    evidence: list[str] = Field(default_factory=list, description="paths of raw output kept")
    message: str
    rank: int | None = Field(default=None, description="the rank named by the verdict, if one is")
    node: str | None = Field(default=None, description="the node named by the verdict, if one is")
    injected: bool = Field(default=False, description="the verdict is about a fault injected on purpose")


def worst(statuses: list[str]) -> VerdictStatus:
    """The most severe of verdict statuses (``pass`` for none)."""
    result: VerdictStatus = "pass"
    for status in statuses:
        if STATUS_ORDER[status] > STATUS_ORDER[result]:
            result = status  # type: ignore[assignment]
    return result


def dump_json(model: BaseModel) -> str:
    """A model as deterministic JSON: sorted keys, two-space indent, trailing newline."""
    return json.dumps(model.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

"""The data every readiness step exchanges: collective runs, subjects and verdicts.

One model, :class:`CollectiveRun`, holds both a dsx all-reduce sweep and a parsed nccl-tests log, so the
same judging code applies to a local gloo sweep and to ``all_reduce_perf`` output from a cluster. Its
result rows are stored column by column (:class:`ResultTable`); :class:`Row` is the view of one row.
Every model is plain pydantic and serialises to JSON with sorted keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from steps.models import Frozen as Model  # every readiness model: unknown fields refused, immutable

__all__ = [
    "STATUS_ORDER",
    "CollectiveRun",
    "Failure",
    "Footer",
    "HalfColumns",
    "Measurement",
    "Model",
    "Preamble",
    "RankInfo",
    "RankStats",
    "ResultTable",
    "Row",
    "RunStatus",
    "Subject",
    "Verdict",
    "VerdictStatus",
    "dump_json",
    "worst",
]

RunStatus = Literal["complete", "failed", "corrupted", "incomplete"]
VerdictStatus = Literal["pass", "unschedulable", "fail", "hang", "error"]
"""``unschedulable``: the test's pods could not all be scheduled within the scheduling budget, so
nothing was measured; it says nothing about the nodes' health (they stay ``pending``)."""

#: Severity of verdict statuses, mildest first: the status of a set of verdicts is the worst one.
STATUS_ORDER: dict[str, int] = {"pass": 0, "unschedulable": 1, "fail": 2, "hang": 3, "error": 4}


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


_HALF_FIELDS = ("time_us", "algbw_gbps", "busbw_gbps", "wrong", "max_error")


class HalfColumns(Model):
    """One half of a result table (out-of-place or in-place), one list per figure: item ``i`` is row ``i``."""

    time_us: list[float | None] = Field(default_factory=list)
    algbw_gbps: list[float | None] = Field(default_factory=list)
    busbw_gbps: list[float | None] = Field(default_factory=list)
    wrong: list[int | None] = Field(default_factory=list)
    max_error: list[float | None] = Field(default_factory=list, description="old layout: the 'error' column")

    def measurement(self, index: int) -> Measurement | None:
        """Row ``index`` of this half, or ``None`` where the row has none of its figures."""
        values = {name: getattr(self, name)[index] for name in _HALF_FIELDS}
        if all(value is None for value in values.values()):
            return None
        return Measurement.model_construct(**values)


class ResultTable(Model):
    """The result rows of a run, stored column by column: item ``i`` of every list is row ``i``.

    A 10,000-row nccl-tests log is some twenty lists here rather than 30,000 objects: the parser fills it
    in a fraction of the time, its JSON is a fraction of the size (runs travel between workflow steps as
    JSON), and pandas reads it as it is. A half that a row lacks is ``None`` in every column of that half;
    a half that no row has is ``None``. :meth:`row` gives one row as a :class:`Row`.
    """

    size: list[int] = Field(default_factory=list)
    count: list[int] = Field(default_factory=list)
    type: list[str] = Field(default_factory=list)
    redop: list[str | None] = Field(default_factory=list)
    root: list[int | None] = Field(default_factory=list)
    line: list[int | None] = Field(default_factory=list, description="line numbers in the parsed log")
    out_of_place: HalfColumns | None = None
    in_place: HalfColumns | None = None

    @model_validator(mode="after")
    def _columns_of_one_length(self) -> ResultTable:
        length = len(self.size)
        columns: list[tuple[str, list[Any]]] = [
            (name, getattr(self, name)) for name in ("count", "type", "redop", "root", "line")
        ]
        for half_name, half in self.halves():
            columns += [(f"{half_name}.{name}", getattr(half, name)) for name in _HALF_FIELDS]
        for name, column in columns:
            if len(column) != length:
                raise ValueError(f"column {name} has {len(column)} items, column size has {length}")
        return self

    @classmethod
    def of(cls, rows: Iterable[Row]) -> ResultTable:
        """The table of ``rows``, in their order."""
        rows = list(rows)
        halves: dict[str, HalfColumns | None] = {}
        for half_name in ("out_of_place", "in_place"):
            measured = [getattr(row, half_name) for row in rows]
            if all(m is None for m in measured):
                halves[half_name] = None
                continue
            halves[half_name] = HalfColumns(
                **{name: [None if m is None else getattr(m, name) for m in measured] for name in _HALF_FIELDS}
            )
        return cls(
            size=[row.size for row in rows],
            count=[row.count for row in rows],
            type=[row.type for row in rows],
            redop=[row.redop for row in rows],
            root=[row.root for row in rows],
            line=[row.line for row in rows],
            **halves,
        )

    def __len__(self) -> int:
        """The number of rows."""
        return len(self.size)

    def __bool__(self) -> bool:
        """A model is true even when it holds no rows (``len`` counts them)."""
        return True

    def halves(self) -> list[tuple[str, HalfColumns]]:
        """The halves the table has, out-of-place first, each with its name."""
        named = (("out_of_place", self.out_of_place), ("in_place", self.in_place))
        return [(name, half) for name, half in named if half is not None]

    def find(self, size: int) -> int | None:
        """The index of the first row measured at exactly ``size`` bytes, or ``None``."""
        try:
            return self.size.index(size)
        except ValueError:
            return None

    def busbw(self, index: int) -> float | None:
        """Row ``index``'s bus bandwidth as judged: the lower of its halves' (GB/s), as :meth:`Row.busbw`."""
        figures = [f for _, half in self.halves() if (f := half.busbw_gbps[index]) is not None]
        return min(figures) if figures else None

    def wrong(self, index: int) -> int:
        """Wrong elements at row ``index``, both halves together (``N/A`` counts as 0)."""
        return sum(half.wrong[index] or 0 for _, half in self.halves())

    def row(self, index: int) -> Row:
        """Row ``index`` as a :class:`Row` (made from the columns, which were validated)."""
        oop, inp = self.out_of_place, self.in_place
        return Row.model_construct(
            size=self.size[index],
            count=self.count[index],
            type=self.type[index],
            redop=self.redop[index],
            root=self.root[index],
            out_of_place=None if oop is None else oop.measurement(index),
            in_place=None if inp is None else inp.measurement(index),
            line=self.line[index],
        )


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
    results: ResultTable = Field(default_factory=ResultTable, description="the result rows, by column")
    footer: Footer | None = None
    failures: list[Failure] = Field(default_factory=list)
    injected: list[str] = Field(default_factory=list, description="faults injected on purpose")
    rank_stats: list[RankStats] = Field(default_factory=list)

    @property
    def rows(self) -> list[Row]:
        """Every result row as a :class:`Row`, made on each access from :attr:`results`."""
        return [self.results.row(index) for index in range(len(self.results))]

    def row_at(self, size: int) -> Row | None:
        """The row measured at exactly ``size`` bytes (the first one, for logs with several types)."""
        index = self.results.find(size)
        return None if index is None else self.results.row(index)


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
    probability: float | None = Field(
        default=None, description="the posterior probability of a bisection's accusation, if it is one"
    )


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

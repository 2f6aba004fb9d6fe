"""Parser for the output of nccl-tests (``all_reduce_perf`` and the other ``*_perf`` programs).

It reads what real logs contain: unrelated lines before, between and after the table (shell prompts,
``mpirun`` command lines, ssh and kubectl warnings, NCCL version and debug lines), a launcher prefix on
every line (``0: `` from ``srun --label``, ``[1,0]<stdout>:`` from ``mpirun --tag-output``), the old
column layout (no Group on rank lines, no root column, an ``error`` column) and the new one, device ids
as ``[0x0f]`` or ``[0000:04:00]``, ``N/A`` and e-notation in figures, and failure lines.

The result is a :class:`~steps.readiness.models.CollectiveRun` whose status is ``complete`` (a clean
run with its footer), ``failed`` (a ``Test ... failure`` line), ``corrupted`` (wrong elements, or an
out-of-bounds footer that is not ``0 OK``) or ``incomplete`` (no footer). Input that is not an
nccl-tests log at all, or a table with a malformed row, raises :class:`~steps.errors.InputError`
naming the line.
"""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from steps.errors import InputError
from steps.readiness.models import (
    CollectiveRun,
    Failure,
    Footer,
    Measurement,
    Preamble,
    RankInfo,
    Row,
    RunStatus,
    trusted,
)
from steps.readiness.sizes import format_size

__all__ = ["EXIT_CODES", "exit_code", "parse_nccl_tests", "parse_nccl_tests_file"]

#: Exit status of ``dsx nccl parse`` for each run status (2 is bad input: an :class:`InputError`).
EXIT_CODES: dict[str, int] = {"complete": 0, "failed": 1, "corrupted": 1, "incomplete": 1}

_PREFIXES = (
    re.compile(r"^\s*\d+: ?"),  # srun --label
    re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>: ?"),  # mpirun --tag-output
)
_PREAMBLE = re.compile(r"\bnThread\s+\d+")
_PREAMBLE_FIELDS = {
    "n_threads": re.compile(r"\bnThread\s+(\d+)"),
    "n_gpus": re.compile(r"\bnGpus\s+(\d+)"),
    "min_bytes": re.compile(r"\bminBytes\s+(\d+)"),
    "max_bytes": re.compile(r"\bmaxBytes\s+(\d+)"),
    "step_factor": re.compile(r"\bstep:\s*(\d+)\(factor\)"),
    "step_bytes": re.compile(r"\bstep:\s*(\d+)\(bytes\)"),
    "warmup_iters": re.compile(r"\bwarmup iters:\s*(\d+)"),
    "iters": re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)"),
    "agg_iters": re.compile(r"\bagg iters:\s*(\d+)"),
    "validation": re.compile(r"\bvalidation:\s*(\d+)"),
    "graph": re.compile(r"\bgraph:\s*(\d+)"),
}
_RANK = re.compile(
    r"^#?\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+(?P<group>\d+)\s+)?Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)"
    r"\s+device\s+(?P<device>\d+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<name>.*?)\s*$"
)
_OOB = re.compile(r"Out of bounds values\s*:\s*(?P<count>\S+)\s*(?P<verdict>\w+)?")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*(?P<value>\S+)")
_NCCL_VERSION = re.compile(r"\bNCCL version\s+(?P<version>\S+)")
_STARTING = re.compile(r"Collective test starting:\s*(?P<name>\w+)")
_PROGRAM = re.compile(r"\b(?P<name>[a-z_]+)_perf\b")
_INJECTED = re.compile(r"^#\s*injected:\s*(?P<what>.+?)\s*$")
_FAILURE = re.compile(
    r"^\s*(?:\.\.\s*)?(?:(?P<host>[^\s:]+)(?:\s+pid\s+\d+)?:\s+)?"
    r"Test (?P<kind>NCCL failure|CUDA failure|failure|timeout)\b(?P<rest>.*)$"
)
_WHERE = re.compile(r"\b(?P<where>[\w.-]+\.\w+:\d+)")
_QUOTED = re.compile(r"'(?P<text>.*)'")
_LEADING = ("size", "count", "type", "redop", "root")
_TIME_NAMES = ("time", "cputime")
_NA = "N/A"


def _strip_prefix(line: str) -> str:
    if line[:1] == " " and line.lstrip()[:1] != "#" and ":" not in line[:12]:
        return line  # a plain result row: the common case, no regex needed
    for prefix in _PREFIXES:
        match = prefix.match(line)
        if match is not None:
            return line[match.end() :]
    return line


def _number(token: str, column: str, lineno: int) -> float | None:
    if token == _NA:
        return None
    try:
        return float(token)
    except ValueError:
        raise InputError(f"line {lineno}: {column} {token!r} is not a number") from None


def _count(token: str, column: str, lineno: int) -> int | None:
    value = _number(token, column, lineno)
    if value is None:
        return None
    if value != int(value) or value < 0:
        raise InputError(f"line {lineno}: {column} {token!r} is not a count")
    return int(value)


def _integer(token: str, column: str, lineno: int) -> int:
    try:
        return int(token)
    except ValueError:
        raise InputError(f"line {lineno}: {column} {token!r} is not a whole number") from None


# What each parsed model was given (``model_fields_set``): one set per shape, shared by every instance.
_ROW_FIELDS = {"size", "count", "type", "redop", "root", "out_of_place", "in_place", "line"}
_NEW_FIELDS = {"time_us", "algbw_gbps", "busbw_gbps", "wrong"}
_OLD_FIELDS = {"time_us", "algbw_gbps", "busbw_gbps", "max_error"}


class _Table:
    """The column layout read from a table header line."""

    __slots__ = (
        "count_at",
        "counts_at",
        "first",
        "layout",
        "leading",
        "lineno",
        "measured",
        "measurement_fields",
        "names",
        "redop_at",
        "root_at",
        "size_at",
        "type_at",
        "width",
        "wrong",
    )

    def __init__(self, names: list[str], lineno: int, wrong: list[Row]) -> None:
        """Read a header; :meth:`row` adds the rows that report wrong elements to ``wrong``."""
        self.lineno = lineno
        self.wrong = wrong
        start = next(i for i, name in enumerate(names) if name in _TIME_NAMES)
        self.leading = names[:start]
        self.measured = names[start:]
        unknown = [name for name in self.leading if name not in _LEADING]
        if unknown or "size" not in self.leading or "count" not in self.leading:
            raise InputError(f"line {lineno}: unknown table header columns {' '.join(names)!r}")
        if len(self.measured) not in (4, 8):
            raise InputError(
                f"line {lineno}: table header has {len(self.measured)} result columns, not 4 or 8"
            )
        self.width = len(names)
        self.names = names
        self.layout = "old" if "error" in self.measured else "new"
        self.first = start
        # Where the #wrong counts are among the result columns, and which fields a measurement is given.
        self.counts_at = () if self.layout == "old" else range(3, len(self.measured), 4)
        self.measurement_fields = _OLD_FIELDS if self.layout == "old" else _NEW_FIELDS
        # Where each leading column is (the last one of a name given twice).
        position = {name: index for index, name in enumerate(self.leading)}
        self.size_at = position["size"]
        self.count_at = position["count"]
        self.type_at = position.get("type")
        self.redop_at = position.get("redop")
        self.root_at = position.get("root")

    def row(self, tokens: list[str], lineno: int) -> Row:
        """A result row from its fields, checked here: its models are not validated again."""
        if len(tokens) != self.width:
            raise InputError(
                f"line {lineno}: a result row needs {self.width} fields ({' '.join(self.names)}), "
                f"found {len(tokens)}: the row is cut or corrupt"
            )
        figures: list[float | None]
        try:
            figures = [*map(float, tokens[self.first :])]  # the common case: no N/A
        except ValueError:
            figures = self._figures(tokens, lineno)
        any_wrong = False
        for index in self.counts_at:  # the new layout's #wrong: a count, or N/A
            last = figures[index]
            if last is not None:
                if not (0 <= last < math.inf and last == (whole := int(last))):
                    where = "out-of-place" if index < 4 else "in-place"
                    token = tokens[self.first + index]
                    raise InputError(f"line {lineno}: {where} #wrong {token!r} is not a count")
                figures[index] = whole  # an int from here on
                if last:
                    any_wrong = True
        old = self.layout == "old"
        fields = self.measurement_fields
        out_of_place = {
            "time_us": figures[0],
            "algbw_gbps": figures[1],
            "busbw_gbps": figures[2],
            "wrong": None if old else figures[3],
            "max_error": figures[3] if old else None,
        }
        in_place = None
        if len(figures) == 8:
            in_place = {
                "time_us": figures[4],
                "algbw_gbps": figures[5],
                "busbw_gbps": figures[6],
                "wrong": None if old else figures[7],
                "max_error": figures[7] if old else None,
            }
        size_at, count_at, root_at = self.size_at, self.count_at, self.root_at
        try:
            size = int(tokens[size_at])
            count = int(tokens[count_at])
            root = None if root_at is None else int(tokens[root_at])
        except ValueError:
            _integer(tokens[size_at], "size", lineno)
            _integer(tokens[count_at], "count", lineno)
            if root_at is not None:
                _integer(tokens[root_at], "root", lineno)
            raise
        row = {
            "size": size,
            "count": count,
            "type": "float" if self.type_at is None else tokens[self.type_at],
            "redop": None if self.redop_at is None else tokens[self.redop_at],
            "root": root,
            "out_of_place": trusted(Measurement, out_of_place, fields),
            "in_place": None if in_place is None else trusted(Measurement, in_place, fields),
            "line": lineno,
        }
        made = trusted(Row, row, _ROW_FIELDS)
        if any_wrong:
            self.wrong.append(made)
        return made

    def _figures(self, tokens: list[str], lineno: int) -> list[float | None]:
        """The result columns of a row with N/A in them, or an error naming the first bad one."""
        try:
            return [None if token == _NA else float(token) for token in tokens[self.first :]]
        except ValueError:
            for index, token in enumerate(tokens[self.first :]):
                where = "out-of-place" if index < 4 else "in-place"
                _number(token, f"{where} {self.measured[index]}", lineno)
            raise


def _header_names(body: str) -> list[str] | None:
    names = body.split()
    if len(names) >= 6 and names[0] == "size" and "count" in names and any(n in _TIME_NAMES for n in names):
        return names
    return None


def _failure(text: str, lineno: int) -> Failure | None:
    match = _FAILURE.match(text)
    if match is None:
        return None
    rest = match.group("rest").strip()
    where = _WHERE.search(rest)
    quoted = _QUOTED.search(rest)
    if quoted is not None:
        message = quoted.group("text").strip(" /")
    else:
        message = (rest.replace(where.group("where"), "") if where else rest).strip(" :")
    kind = f"Test {match.group('kind')}"
    return Failure(
        line=lineno,
        host=match.group("host"),
        kind=kind,
        where=where.group("where") if where else None,
        message=message or kind,
    )


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a log is read, and resume it after.

    A 10,000-row log makes some 40,000 model objects, none in a reference cycle. Every 700 new objects
    start a collection of the young ones, and about every hundredth is a full one over every object of the
    process, which alone took longer than the rest of the parse. Once resumed, the collector takes the
    new objects in as usual. It stays paused while a log is read from a pipe (the parser makes no
    cycles meanwhile); one paused by the caller stays paused.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def parse_nccl_tests(lines: Iterable[str], source: str = "<input>") -> CollectiveRun:
    """Read nccl-tests output into a :class:`CollectiveRun`.

    Args:
        lines: the log, one line per item (trailing newlines are ignored).
        source: the name used in error messages (a file name, or ``-`` for standard input).

    Raises:
        InputError: the input is empty or not an nccl-tests log, or a result row is malformed (the
            message names the line).
    """
    with _collector_paused():
        return _parse(lines, source)


def _parse(lines: Iterable[str], source: str) -> CollectiveRun:
    preamble: Preamble | None = None
    ranks: dict[int, RankInfo] = {}
    rows: list[Row] = []
    wrong: list[Row] = []  # the rows that report wrong elements
    failures: list[Failure] = []
    injected: list[str] = []
    table: _Table | None = None
    out_of_bounds: tuple[int | None, bool | None, int] | None = None
    avg_busbw: float | None = None
    nccl_version: str | None = None
    collective: str | None = None
    layout: str | None = None
    seen = 0
    try:
        for lineno, raw in enumerate(lines, start=1):
            seen = lineno
            if table is not None:
                # A plain result row, the bulk of a log (a row behind a launcher prefix is read below).
                tokens = raw.split()
                if len(tokens) >= 2 and tokens[0].isdigit() and tokens[1].isdigit():
                    rows.append(table.row(tokens, lineno))
                    continue
            text = _strip_prefix(raw.rstrip("\r\n"))
            body = text.strip()
            if not body:
                continue
            if body[0].isdigit() and table is not None:
                tokens = body.split()
                if len(tokens) >= 2 and tokens[0].isdigit() and tokens[1].isdigit():
                    rows.append(table.row(tokens, lineno))
                    continue
            if body.startswith("#"):
                inner = body[1:].strip()
                names = _header_names(inner)
                if names is not None:
                    table = _Table(names, lineno, wrong)
                    layout = table.layout
                    continue
                if _PREAMBLE.search(inner):
                    values = {}
                    for field, pattern in _PREAMBLE_FIELDS.items():
                        found = pattern.search(inner)
                        if found is not None:
                            values[field] = int(found.group(1))
                    preamble = Preamble(**values)
                    continue
                rank = _RANK.match(inner)
                if rank is not None:
                    number = int(rank.group("rank"))
                    ranks[number] = RankInfo(
                        rank=number,
                        group=None if rank.group("group") is None else int(rank.group("group")),
                        pid=int(rank.group("pid")),
                        host=rank.group("host"),
                        device=int(rank.group("device")),
                        bus_id=rank.group("bus"),
                        device_name=rank.group("name") or None,
                    )
                    continue
                found_injected = _INJECTED.match(body)
                if found_injected is not None:
                    injected.append(found_injected.group("what"))
                    continue
            oob = _OOB.search(body)
            if oob is not None:
                count = _count(oob.group("count"), "out-of-bounds count", lineno)
                word = (oob.group("verdict") or "").upper()
                out_of_bounds = (count, {"OK": True, "FAILED": False}.get(word), lineno)
                continue
            avg = _AVG.search(body)
            if avg is not None:
                avg_busbw = _number(avg.group("value"), "average bus bandwidth", lineno)
                continue
            failure = _failure(text, lineno)
            if failure is not None:
                failures.append(failure)
                continue
            version = _NCCL_VERSION.search(body)
            if version is not None and nccl_version is None:
                nccl_version = version.group("version")
            starting = _STARTING.search(body)
            if starting is not None:
                collective = starting.group("name").removesuffix("_perf")
            elif collective is None and table is None:
                program = _PROGRAM.search(body)
                if program is not None:
                    collective = program.group("name")
    except UnicodeDecodeError as exc:
        raise InputError(f"{source}: line {seen + 1}: not text ({exc.reason})") from None
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None

    if seen == 0:
        raise InputError(f"{source}: empty input, not an nccl-tests log")
    if not rows and not failures:
        if table is not None:
            raise InputError(
                f"{source}: line {table.lineno}: table header but no result rows after it "
                f"(the log is cut short, {seen} lines read)"
            )
        if preamble is None and not ranks and out_of_bounds is None:
            raise InputError(
                f"{source}: not an nccl-tests log: no '# nThread' line, no table header and no result "
                f"rows in {seen} lines"
            )
        raise InputError(f"{source}: line {seen}: no table header and no result rows (the log is cut short)")

    problems: list[str] = []
    for failure in failures:
        where = f" {failure.where}" if failure.where else ""
        host = f"{failure.host}: " if failure.host else ""
        problems.append(f"line {failure.line}: {host}{failure.kind}{where}: {failure.message}")
    wrong_rows = 0
    for row in wrong:
        for half, measured in (("out-of-place", row.out_of_place), ("in-place", row.in_place)):
            if measured is not None and measured.wrong:
                wrong_rows += 1
                problems.append(
                    f"line {row.line}: {measured.wrong} wrong elements at {format_size(row.size)} ({half})"
                )
    footer: Footer | None = None
    if out_of_bounds is not None:
        count, ok, oob_line = out_of_bounds
        footer = Footer(out_of_bounds=count, out_of_bounds_ok=ok, avg_busbw_gbps=avg_busbw)
        if ok is False or (count or 0) > 0:
            problems.append(
                f"line {oob_line}: out-of-bounds values: {count} {'FAILED' if ok is False else ''}"
            )
    else:
        last = rows[-1].line if rows else seen
        problems.append(
            f"no footer ('# Out of bounds values') after line {last}: "
            "the run did not finish or the log is cut"
        )

    status: RunStatus
    if failures:
        status = "failed"
    elif wrong_rows or (
        footer is not None and (footer.out_of_bounds_ok is False or (footer.out_of_bounds or 0) > 0)
    ):
        status = "corrupted"
    elif footer is None:
        status = "incomplete"
    else:
        status = "complete"
    ordered = [ranks[number] for number in sorted(ranks)]
    hosts = list(dict.fromkeys(rank.host for rank in ordered))
    return CollectiveRun.model_validate(
        {
            "source": "nccl-tests",
            "status": status,
            "problems": [p.rstrip() for p in problems],
            "collective": collective,
            "layout": layout,
            "nccl_version": nccl_version,
            "preamble": preamble,
            "ranks": ordered,
            "hosts": hosts,
            "rows": rows,
            "footer": footer,
            "failures": failures,
            "injected": injected,
        }
    )


def parse_nccl_tests_file(path: str | Path) -> CollectiveRun:
    """Parse an nccl-tests log file (``-`` is standard input).

    Raises:
        InputError: the file cannot be read, or its content is not a well-formed nccl-tests log.
    """
    import sys

    if str(path) == "-":
        return parse_nccl_tests(sys.stdin, source="-")
    file = Path(path)
    try:
        with file.open(encoding="utf-8", errors="strict") as handle:
            return parse_nccl_tests(handle, source=str(file))
    except FileNotFoundError:
        raise InputError(f"{file}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{file}: is a folder, not a log file") from None
    except PermissionError:
        raise InputError(f"{file}: permission denied") from None


def exit_code(run: CollectiveRun) -> int:
    """0 for a complete, clean run; 1 for a failed, corrupted or incomplete one."""
    return EXIT_CODES[run.status]

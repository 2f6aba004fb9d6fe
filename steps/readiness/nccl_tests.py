"""Parser for the output of nccl-tests (``all_reduce_perf`` and the other ``*_perf`` programs).

It reads what real logs contain: unrelated lines before, between and after the table (shell prompts,
``mpirun`` command lines, ssh and kubectl warnings, NCCL version and debug lines), a launcher prefix on
every line (``0: `` from ``srun --label``, ``[1,0]<stdout>:`` from ``mpirun --tag-output``), the old
column layout (no Group on rank lines, no root column, an ``error`` column) and the new one, device ids
as ``[0x0f]`` or ``[0000:04:00]``, ``N/A`` and e-notation in figures, and failure lines.

The result is a :class:`~steps.readiness.models.CollectiveRun` whose status is ``complete`` (a clean
run with its footer), ``failed`` (a ``Test ... failure`` line), ``corrupted`` (wrong elements, an
out-of-bounds footer that is not ``0 OK``, or a figure that is ``nan`` or ``inf``: kept as no figure,
so it never meets a threshold and never reaches JSON) or ``incomplete`` (no footer: the run stopped or
the log was cut, before the table or in the middle of its last row). Input that is not an nccl-tests log
at all, or a table with a malformed row followed by more of the log, raises
:class:`~steps.errors.InputError` naming the line.
"""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from steps.errors import InputError
from steps.readiness.models import CollectiveRun, Failure, Footer, Preamble, RankInfo, RunStatus
from steps.readiness.nccl_rows import TIME_NAMES, Results, Table, cut_row, read_count, read_number
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


def _strip_prefix(line: str) -> str:
    if line[:1] == " " and line.lstrip()[:1] != "#" and ":" not in line[:12]:
        return line  # a plain result row: the common case, no regex needed
    for prefix in _PREFIXES:
        match = prefix.match(line)
        if match is not None:
            return line[match.end() :]
    return line


def _header_names(body: str) -> list[str] | None:
    names = body.split()
    if len(names) >= 6 and names[0] == "size" and "count" in names and any(n in TIME_NAMES for n in names):
        return names
    return None


def _preamble(inner: str) -> Preamble:
    values = {}
    for field, pattern in _PREAMBLE_FIELDS.items():
        found = pattern.search(inner)
        if found is not None:
            values[field] = int(found.group(1))
    return Preamble(**values)


def _rank(inner: str) -> RankInfo | None:
    rank = _RANK.match(inner)
    if rank is None:
        return None
    return RankInfo(
        rank=int(rank.group("rank")),
        group=None if rank.group("group") is None else int(rank.group("group")),
        pid=int(rank.group("pid")),
        host=rank.group("host"),
        device=int(rank.group("device")),
        bus_id=rank.group("bus"),
        device_name=rank.group("name") or None,
    )


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
    results = Results()
    failures: list[Failure] = []
    injected: list[str] = []
    table: Table | None = None
    # The open table's row store and width, kept in locals for the loop over the rows.
    row_tokens: list[list[str]] = []
    row_lines: list[int] = []
    width = 0
    out_of_bounds: tuple[int | None, bool | None, int] | None = None
    avg_busbw: float | None = None
    nccl_version: str | None = None
    collective: str | None = None
    layout: str | None = None
    # Preamble and rank lines read before, by their text: a soak test's log repeats them for every run.
    preambles: dict[str, Preamble] = {}
    rank_lines: dict[str, RankInfo] = {}
    # A row of the wrong width: the last row of a run that stopped (or a log cut) mid-row, unless more
    # rows, a header or a footer follow it, which makes it a malformed row.
    cut: tuple[Table, list[str], int] | None = None
    lineno = 0
    try:
        for lineno, raw in enumerate(lines, start=1):
            if table is not None:
                # A plain result row, the bulk of a log (a row behind a launcher prefix is read below).
                tokens = raw.split()
                if len(tokens) >= 2 and tokens[0].isdigit() and tokens[1].isdigit():
                    if len(tokens) != width or cut is not None:
                        cut = cut_row(cut, table, tokens, lineno)
                        continue
                    row_tokens.append(tokens)
                    row_lines.append(lineno)
                    continue
            text = _strip_prefix(raw.rstrip("\r\n"))
            body = text.strip()
            if not body:
                continue
            if body[0].isdigit() and table is not None:
                tokens = body.split()
                if len(tokens) >= 2 and tokens[0].isdigit() and tokens[1].isdigit():
                    if len(tokens) != width or cut is not None:
                        cut = cut_row(cut, table, tokens, lineno)
                        continue
                    row_tokens.append(tokens)
                    row_lines.append(lineno)
                    continue
            # Every other line: a cheap substring test before each pattern, as most lines match none.
            if body[0] == "#":
                inner = body[1:].strip()
                names = _header_names(inner) if inner.startswith("size") else None
                if names is not None:
                    if cut is not None:
                        raise cut[0].cut(cut[1], cut[2])
                    if table is not None:
                        table.close(results)
                    table = Table(names, lineno)
                    row_tokens, row_lines, width = table.tokens, table.lines, table.width
                    layout = table.layout
                    continue
                if "nThread" in inner and _PREAMBLE.search(inner):
                    preamble = preambles.get(inner) or preambles.setdefault(inner, _preamble(inner))
                    continue
                if "Rank" in inner:
                    rank = rank_lines.get(inner) or _rank(inner)
                    if rank is not None:
                        ranks[rank.rank] = rank_lines.setdefault(inner, rank)
                        continue
                if "injected" in body:
                    found_injected = _INJECTED.match(body)
                    if found_injected is not None:
                        injected.append(found_injected.group("what"))
                        continue
            if "Out of bounds" in body and (oob := _OOB.search(body)) is not None:
                if cut is not None:
                    raise cut[0].cut(cut[1], cut[2])
                count = read_count(oob.group("count"), "out-of-bounds count", lineno)
                word = (oob.group("verdict") or "").upper()
                out_of_bounds = (count, {"OK": True, "FAILED": False}.get(word), lineno)
                continue
            if "Avg bus bandwidth" in body and (avg := _AVG.search(body)) is not None:
                avg_busbw = read_number(avg.group("value"), "average bus bandwidth", lineno)
                continue
            if "Test " in text and (failure := _failure(text, lineno)) is not None:
                failures.append(failure)
                continue
            if nccl_version is None and "NCCL version" in body:
                version = _NCCL_VERSION.search(body)
                if version is not None:
                    nccl_version = version.group("version")
            if "Collective test starting" in body and (starting := _STARTING.search(body)) is not None:
                collective = starting.group("name").removesuffix("_perf")
            elif collective is None and table is None and "_perf" in body:
                program = _PROGRAM.search(body)
                if program is not None:
                    collective = program.group("name")
        if table is not None:
            if cut is None and out_of_bounds is None and table.tokens and not table.row_is_readable(-1):
                # The run stopped (or the log was cut) inside the last row's last field: "N/" of N/A.
                cut = (table, table.tokens.pop(), table.lines.pop())
            table.close(results)
    except UnicodeDecodeError as exc:
        raise InputError(f"{source}: line {lineno + 1}: not text ({exc.reason})") from None
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    seen = lineno
    rows = len(results.size)

    if seen == 0:
        raise InputError(f"{source}: empty input, not an nccl-tests log")
    problems: list[str] = []
    if not rows and not failures:
        if preamble is None and not ranks and table is None and out_of_bounds is None:
            raise InputError(
                f"{source}: not an nccl-tests log: no '# nThread' line, no table header and no result "
                f"rows in {seen} lines"
            )
        if out_of_bounds is not None:
            raise InputError(f"{source}: line {out_of_bounds[2]}: a footer but no result rows before it")
        if table is not None:
            problems.append(f"line {table.lineno}: table header but no result rows after it")
        else:
            problems.append(f"no table header in {seen} lines: the run did not start its sweep")
    if cut is not None:
        _, cut_tokens, cut_line = cut
        problems.append(
            f"line {cut_line}: the last result row is cut ({len(cut_tokens)} of {cut[0].width} fields, "
            "or a field cut short): the run stopped or the log is cut there"
        )
    problems += results.nonfinite
    for failure in failures:
        where = f" {failure.where}" if failure.where else ""
        host = f"{failure.host}: " if failure.host else ""
        problems.append(f"line {failure.line}: {host}{failure.kind}{where}: {failure.message}")
    # Wrong elements, row by row in line order, out-of-place before in-place.
    wrong_rows = 0
    flagged = [
        (index, half, wrong)
        for half, columns in (("out-of-place", results.out_of_place), ("in-place", results.in_place))
        if any(columns[3])
        for index, wrong in enumerate(columns[3])
        if wrong
    ]
    for index, half, wrong in sorted(flagged, key=lambda item: item[0]):
        wrong_rows += 1
        at = format_size(results.size[index])
        problems.append(f"line {results.line[index]}: {wrong} wrong elements at {at} ({half})")
    footer: Footer | None = None
    avg_nonfinite = avg_busbw is not None and not math.isfinite(avg_busbw)
    if avg_nonfinite:
        problems.append(f"the footer's average bus bandwidth {avg_busbw} is not a finite number")
        avg_busbw = None
    if out_of_bounds is not None:
        count, ok, oob_line = out_of_bounds
        footer = Footer(out_of_bounds=count, out_of_bounds_ok=ok, avg_busbw_gbps=avg_busbw)
        if ok is False or (count or 0) > 0:
            problems.append(
                f"line {oob_line}: out-of-bounds values: {count} {'FAILED' if ok is False else ''}"
            )
    else:
        last = results.line[-1] if rows else seen
        problems.append(
            f"no footer ('# Out of bounds values') after line {last}: "
            "the run did not finish or the log is cut"
        )

    status: RunStatus
    if failures:
        status = "failed"
    elif (
        wrong_rows
        or results.nonfinite
        or avg_nonfinite
        or (footer is not None and (footer.out_of_bounds_ok is False or (footer.out_of_bounds or 0) > 0))
    ):
        status = "corrupted"
    elif footer is None or cut is not None:
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
            "results": results.table(),
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
    if file.exists() and not file.is_dir():
        from steps.yamlio import check_input_file

        check_input_file(file, what="a log file (pipe a stream to '-')")
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

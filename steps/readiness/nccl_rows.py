"""The result rows of an nccl-tests log, read column by column (for :mod:`steps.readiness.nccl_tests`).

A log's table is kept as its rows' fields while the log is read, and turned into columns when the table
ends (:meth:`Table.close`): each column is converted in one pass, which is what makes a 10,000-row log
quick to read. Only when a conversion fails are the rows read one by one, in line order, to name the first
bad field. :class:`Results` gathers the columns of every table of a log into one
:class:`~steps.readiness.models.ResultTable`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from steps.errors import InputError
from steps.readiness.models import HalfColumns, ResultTable

__all__ = [
    "LEADING",
    "NA",
    "TIME_NAMES",
    "Results",
    "Table",
    "cut_row",
    "read_count",
    "read_integer",
    "read_number",
]

#: The columns before the figures, in a header line.
LEADING = ("size", "count", "type", "redop", "root")
#: The first figure column's possible names: where the figures of a header line start.
TIME_NAMES = ("time", "cputime")
#: How nccl-tests writes a figure it does not have.
NA = "N/A"


def read_number(token: str, column: str, lineno: int) -> float | None:
    if token == NA:
        return None
    try:
        return float(token)
    except ValueError:
        raise InputError(f"line {lineno}: {column} {token!r} is not a number") from None


def read_count(token: str, column: str, lineno: int) -> int | None:
    value = read_number(token, column, lineno)
    if value is None:
        return None
    if not math.isfinite(value) or value != int(value) or value < 0:
        raise InputError(f"line {lineno}: {column} {token!r} is not a count")
    return int(value)


def read_integer(token: str, column: str, lineno: int) -> int:
    try:
        return int(token)
    except ValueError:
        raise InputError(f"line {lineno}: {column} {token!r} is not a whole number") from None


class Table:
    """One table of a log: the column layout read from its header line, and the rows read under it.

    Rows are kept as their fields while the log is read, and turned into columns when the table ends
    (:meth:`close`): each column is converted in one pass. Only when a conversion fails are the rows read
    one by one, in line order, to name the first bad field.
    """

    __slots__ = (
        "count_at",
        "first",
        "layout",
        "leading",
        "lineno",
        "lines",
        "measured",
        "names",
        "redop_at",
        "root_at",
        "size_at",
        "tokens",
        "type_at",
        "width",
    )

    def __init__(self, names: list[str], lineno: int) -> None:
        self.lineno = lineno
        start = next(i for i, name in enumerate(names) if name in TIME_NAMES)
        self.leading = names[:start]
        self.measured = names[start:]
        unknown = [name for name in self.leading if name not in LEADING]
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
        # Where each leading column is (the last one of a name given twice).
        position = {name: index for index, name in enumerate(self.leading)}
        self.size_at = position["size"]
        self.count_at = position["count"]
        self.type_at = position.get("type")
        self.redop_at = position.get("redop")
        self.root_at = position.get("root")
        self.tokens: list[list[str]] = []
        self.lines: list[int] = []

    def cut(self, tokens: list[str], lineno: int) -> InputError:
        """The error for a row of the wrong width (after any earlier bad row's own error)."""
        self.close(Results())  # an earlier row with a bad field is the first error of the log
        return InputError(
            f"line {lineno}: a result row needs {self.width} fields ({' '.join(self.names)}), "
            f"found {len(tokens)}: the row is cut or corrupt"
        )

    def row_is_readable(self, index: int) -> bool:
        """Whether row ``index`` has every field its column holds (a cut row may not)."""
        saved = self.tokens, self.lines
        self.tokens, self.lines = [saved[0][index]], [saved[1][index]]
        try:
            self._first_bad_field()
        except InputError:
            return False
        finally:
            self.tokens, self.lines = saved
        return True

    def close(self, into: Results) -> None:
        """Add this table's rows to ``into``, column by column."""
        rows = len(self.tokens)
        if not rows:
            return
        columns = list(zip(*self.tokens, strict=True))
        try:
            size = [*map(int, columns[self.size_at])]
            count = [*map(int, columns[self.count_at])]
            root = [None] * rows if self.root_at is None else [*map(int, columns[self.root_at])]
            figures: list[Sequence[float | None]] = [
                _figures(columns[self.first + k]) for k in range(len(self.measured))
            ]
            if self.layout == "new":
                for k in range(3, len(figures), 4):
                    figures[k] = _counts(columns[self.first + k], figures[k])
        except (ValueError, OverflowError):
            self._first_bad_field()
            raise
        for k, column in enumerate(figures):
            if (self.layout != "new" or k % 4 != 3) and not _all_finite(column):
                figures[k] = self._finite(column, k, into)
        into.size += size
        into.count += count
        into.type += ["float"] * rows if self.type_at is None else columns[self.type_at]
        into.redop += [None] * rows if self.redop_at is None else columns[self.redop_at]
        into.root += root
        into.line += self.lines
        nothing = [None] * rows
        for half, offset in ((into.out_of_place, 0), (into.in_place, 4)):
            if offset >= len(figures):
                for column in half:
                    column += nothing
                continue
            time_us, algbw, busbw, last = figures[offset : offset + 4]
            old = self.layout == "old"
            for column, values in zip(
                half,
                (time_us, algbw, busbw, nothing if old else last, last if old else nothing),
                strict=True,
            ):
                column += values
        into.has_in_place = into.has_in_place or len(figures) == 8

    def _finite(self, column: Sequence[float | None], k: int, into: Results) -> list[float | None]:
        """The column with each ``nan`` or ``inf`` figure replaced by no figure, each one noted."""
        where = "out-of-place" if k < 4 else "in-place"
        kept: list[float | None] = []
        for value, tokens, lineno in zip(column, self.tokens, self.lines, strict=True):
            if value is not None and not math.isfinite(value):
                into.nonfinite.append(
                    f"line {lineno}: {where} {self.measured[k]} {tokens[self.first + k]!r} is not a "
                    "finite number"
                )
                value = None
            kept.append(value)
        return kept

    def _first_bad_field(self) -> None:
        """Raise the error for the first field, in line order, that is not what its column holds."""
        for tokens, lineno in zip(self.tokens, self.lines, strict=True):
            read_integer(tokens[self.size_at], "size", lineno)
            read_integer(tokens[self.count_at], "count", lineno)
            if self.root_at is not None:
                read_integer(tokens[self.root_at], "root", lineno)
            for index, token in enumerate(tokens[self.first :]):
                where = "out-of-place" if index < 4 else "in-place"
                name = self.measured[index]
                if self.layout == "new" and index % 4 == 3:
                    read_count(token, f"{where} {name}", lineno)
                else:
                    read_number(token, f"{where} {name}", lineno)


def cut_row(
    cut: tuple[Table, list[str], int] | None, table: Table, tokens: list[str], lineno: int
) -> tuple[Table, list[str], int]:
    """Note a row of the wrong width as cut; a row after a cut one makes the cut one malformed.

    Raises:
        InputError: naming the first malformed row (or an earlier row's bad field).
    """
    if cut is not None:
        raise cut[0].cut(cut[1], cut[2])
    return table, tokens, lineno


def _figures(tokens: tuple[str, ...]) -> list[float | None]:
    """A column of figures: numbers, with ``N/A`` as ``None`` (``ValueError`` for anything else)."""
    try:
        return [*map(float, tokens)]  # the common case: no N/A
    except ValueError:
        return [None if token == NA else float(token) for token in tokens]


def _all_finite(column: Sequence[float | None]) -> bool:
    """Whether no figure of the column is ``nan`` or infinite (``None`` for ``N/A`` is fine)."""
    total: float
    try:
        total = sum(column)  # type: ignore[arg-type]
    except TypeError:  # N/A in the column
        total = sum(value for value in column if value is not None)
    return math.isfinite(total) or all(value is None or math.isfinite(value) for value in column)


def _counts(tokens: tuple[str, ...], figures: Sequence[float | None]) -> Sequence[int | None]:
    """A #wrong column as whole numbers (``ValueError`` for a figure that is not a count)."""
    try:
        whole = [*map(int, tokens)]  # the common case: plain whole numbers
        if not whole or min(whole) >= 0:
            return whole
    except ValueError:
        pass
    # N/A, or e-notation
    counts = [None if figure is None else int(figure) for figure in figures]
    if counts != figures or any(count is not None and count < 0 for count in counts):
        raise ValueError("a count that is not a whole number of at least 0")
    return counts


class Results:
    """The result columns of a whole log, filled table by table."""

    __slots__ = (
        "count",
        "has_in_place",
        "in_place",
        "line",
        "nonfinite",
        "out_of_place",
        "redop",
        "root",
        "size",
        "type",
    )

    def __init__(self) -> None:
        self.size: list[int] = []
        self.count: list[int] = []
        self.type: list[str] = []
        self.redop: list[str | None] = []
        self.root: list[int | None] = []
        self.line: list[int | None] = []
        self.out_of_place: list[list[float | None]] = [[] for _ in _HALF]
        self.in_place: list[list[float | None]] = [[] for _ in _HALF]
        self.has_in_place = False
        self.nonfinite: list[str] = []

    def table(self) -> ResultTable:
        """The columns as a :class:`ResultTable`.

        Made without validating the columns again: :meth:`Table.close` made every item with ``int`` or
        ``float`` (or ``None`` for ``N/A``), the strings are the log's, and each table added as many
        items to every column. The tests hold the result equal to what validation makes.
        """

        def half(columns: list[list[Any]]) -> HalfColumns:
            time_us, algbw, busbw, wrong, max_error = columns
            return HalfColumns.model_construct(
                time_us=time_us, algbw_gbps=algbw, busbw_gbps=busbw, wrong=wrong, max_error=max_error
            )

        return ResultTable.model_construct(
            size=self.size,
            count=self.count,
            type=self.type,
            redop=self.redop,
            root=self.root,
            line=self.line,
            out_of_place=half(self.out_of_place) if self.size else None,
            in_place=half(self.in_place) if self.size and self.has_in_place else None,
        )


#: The columns of each half, in the order the log gives them: time, algbw, busbw, #wrong, error.
_HALF = tuple(HalfColumns.model_fields)

"""Message sizes written for people (``1GiB``, ``512MiB``, ``32M``) and as plain byte counts."""

from __future__ import annotations

import re

from steps.errors import InputError

__all__ = ["format_size", "parse_size", "size_series"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: int | str, what: str = "size") -> int:
    """Turn ``1GiB``, ``512 MiB``, ``32M`` (binary, as nccl-tests reads ``-b``), ``1024`` into bytes.

    Args:
        value: a byte count, or a number with one of the units B, KiB, MiB, GiB, TiB (K, M, G, T
            are read as the same binary units).
        what: the name used in the error message.

    Raises:
        InputError: the value is negative, not a whole number of bytes, or has an unknown unit
            (decimal units such as ``GB`` are refused on purpose: they are ambiguous).
    """
    if isinstance(value, bool):
        raise InputError(f"{what}: {value!r} is not a size")
    if isinstance(value, int):
        if value < 0:
            raise InputError(f"{what}: {value} is negative")
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise InputError(f"{what}: {value!r} is not a size (examples: 1GiB, 512MiB, 4096)")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise InputError(f"{what}: unknown unit {unit!r} in {value!r} (use B, KiB, MiB, GiB)")
    nbytes = float(number) * factor
    if nbytes != int(nbytes):
        raise InputError(f"{what}: {value!r} is not a whole number of bytes")
    return int(nbytes)


def format_size(nbytes: int) -> str:
    """The shortest exact binary form: ``1073741824`` -> ``1GiB``, ``1536`` -> ``1536B``."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return f"{nbytes}B"


def size_series(min_bytes: int, max_bytes: int, factor: int, align: int = 4) -> list[int]:
    """Message sizes from ``min_bytes`` to ``max_bytes`` multiplying by ``factor``, as nccl-tests ``-f``.

    Each size is rounded down to a multiple of ``align`` (the element size) and is at least one element.

    Raises:
        InputError: the bounds are reversed or the factor is below 2.
    """
    if factor < 2:
        raise InputError(f"--factor must be 2 or more, not {factor}")
    if min_bytes <= 0 or max_bytes <= 0:
        raise InputError(f"message sizes must be positive (min {min_bytes}, max {max_bytes})")
    if min_bytes > max_bytes:
        raise InputError(
            f"--min-bytes {format_size(min_bytes)} is above --max-bytes {format_size(max_bytes)}"
        )
    sizes: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        aligned = max(align, size - size % align)
        if not sizes or aligned != sizes[-1]:
            sizes.append(aligned)
        size *= factor
    return sizes

"""Durations as Argo reads them: Go duration strings (``1m30s``, ``500ms``) or plain seconds."""

from __future__ import annotations

import re

__all__ = ["format_duration", "parse_duration"]

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(value: object) -> float:
    """Seconds in ``value``: an int, a string of digits (seconds) or a Go duration such as ``1h2m3.5s``.

    Raises:
        ValueError: the text is not a duration.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    if re.fullmatch(r"\d+", text):
        return float(text)
    sign = 1.0
    if text[:1] in "+-":
        sign = -1.0 if text[0] == "-" else 1.0
        text = text[1:]
    if text == "0":
        return 0.0
    total = 0.0
    position = 0
    for match in _PART.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position != len(text) or not text:
        raise ValueError(f"invalid duration {value!r}: use seconds or a Go duration such as 30s, 5m, 1h")
    return sign * total


def format_duration(seconds: float) -> str:
    """A short human duration: ``850ms``, ``12.3s``, ``4m05s``, ``1h02m``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"

"""Durations as Argo reads them: Go duration strings (``1m30s``, ``500ms``) or plain seconds."""

from __future__ import annotations

import re

__all__ = ["format_duration", "humanize_duration", "parse_duration"]

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


_DAY = 86400
_MONTH = 30 * _DAY
# Argo's util/humanize magnitudes (go-humanize's Day, Week, Month = 30 days, Year = 12 months):
# below each limit, the text, with {} the whole number of the divisor.
_MAGNITUDES = (
    (1, "0 seconds", 1),
    (2, "1 second", 1),
    (60, "{} seconds", 1),
    (120, "1 minute", 1),
    (3600, "{} minutes", 60),
    (7200, "1 hour", 1),
    (_DAY, "{} hours", 3600),
    (2 * _DAY, "1 day", 1),
    (7 * _DAY, "{} days", _DAY),
    (14 * _DAY, "1 week", 1),
    (_MONTH, "{} weeks", 7 * _DAY),
    (2 * _MONTH, "1 month", 1),
    (12 * _MONTH, "{} months", _MONTH),
    (18 * _MONTH, "1 year", 1),
    (24 * _MONTH, "2 years", 1),
)


def _truncated(seconds: float) -> str:
    for limit, text, divisor in _MAGNITUDES:
        if seconds < limit:
            return text.format(int(seconds // divisor))
    return f"{int(seconds // (12 * _MONTH))} years"


def humanize_duration(seconds: float) -> str:
    """A duration as Argo's messages write it (``Backoff for 1 minute 30 seconds``): up to two units."""
    if seconds < 60:
        return _truncated(seconds)
    if seconds < 3600:
        return f"{_truncated(seconds)} {int(seconds % 60)} seconds"
    if seconds < _DAY:
        return f"{_truncated(seconds)} {int(seconds // 60 % 60)} minutes"
    return f"{_truncated(seconds)} {int(seconds // 3600 % 24)} hours"

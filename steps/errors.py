"""Errors shared by every part of dsx.

A :class:`DsxError` is a problem a person can act on: bad input, an unreachable cluster, a node that
does not exist. Its message names what is wrong and where, on one line. The CLI prints it and exits 2.
"""

from __future__ import annotations

__all__ = ["DsxError", "InputError"]


class DsxError(Exception):
    """A failure with a message a person can act on (the CLI exits 2)."""


class InputError(DsxError):
    """Input that dsx cannot use: a malformed file, an unknown name, a bad flag value."""

"""Errors shared by every part of dsx, and the exit codes of the ``dsx`` command.

A :class:`DsxError` is a problem a person can act on: bad input, an unreachable cluster, a node that
does not exist. Its message names what is wrong and where, on one line. The CLI prints it and exits 2.
Any other exception is a defect of dsx: the CLI exits :data:`EXIT_INTERNAL`, never 1, so that a CI gate
never takes a crash for a verdict.
"""

from __future__ import annotations

__all__ = ["EXIT_INPUT", "EXIT_INTERNAL", "EXIT_NOT_OK", "EXIT_OK", "DsxError", "InputError"]

EXIT_OK = 0
"""The command did what was asked and what it checked is fine."""
EXIT_NOT_OK = 1
"""What the command checked is not ok: drift found, certification failed, a workflow that failed."""
EXIT_INPUT = 2
"""Bad input or usage: a malformed file, an unknown name, a bad flag (one line says which)."""
EXIT_INTERNAL = 70
"""An unexpected error, a defect of dsx (``EX_SOFTWARE`` of sysexits.h); ``dsx --debug`` shows where."""


class DsxError(Exception):
    """A failure with a message a person can act on (the CLI exits 2)."""


class InputError(DsxError):
    """Input that dsx cannot use: a malformed file, an unknown name, a bad flag value."""

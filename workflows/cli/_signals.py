"""SIGTERM handled as Ctrl-C around work that starts processes of its own.

CI cancelling a job, ``timeout`` and systemd stop a program with SIGTERM, whose default action ends
the process at once: no ``finally`` runs, so rank processes and their fork server outlive the command.
Inside :func:`sigterm_as_interrupt`, SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) in
the main thread, so the same clean-up as for Ctrl-C runs: ranks killed and reaped, the server closed.

It is used only where the main thread waits in Python (the local launcher's loop). A process blocked
inside a C call (a rank inside a collective) would not see a Python-level handler until the call
returns, so ranks keep the default action.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["EXIT_TERMINATED", "Terminated", "sigterm_as_interrupt"]

EXIT_TERMINATED = 128 + int(signal.SIGTERM)
"""The exit status of a command stopped by SIGTERM, as a shell reports a process it killed (143)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while :func:`sigterm_as_interrupt` was active."""

    signum = int(signal.SIGTERM)
    """The signal, for code that tells it from Ctrl-C without importing this module."""


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (elsewhere: no change)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

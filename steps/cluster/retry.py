"""Capped exponential backoff with jitter, and the rule for which failures may be retried."""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from steps.cluster import vocabulary as vocab
from steps.errors import InputError

__all__ = ["MAX_ATTEMPTS", "RetryPolicy", "TransientError"]

MAX_ATTEMPTS = 100
"""The most tries ``DSX_RETRY_ATTEMPTS`` may ask for: with the delay capped at a few seconds, more would
keep a step retrying a dead API server for longer than any step's deadline."""


class TransientError(Exception):
    """A failure that may go away: 429, 5xx, a timeout, a refused or reset connection.

    Attributes:
        status: HTTP status, 0 when no answer came.
        detail: what went wrong, in the API's or the network's words.
        sent: whether the server may have acted on the request (so repeating it is safe only for
            idempotent calls); a refused connection or a 429 was never acted on.
        retry_after: seconds the server asked to wait, if it said.
    """

    def __init__(self, status: int, detail: str, *, sent: bool, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.sent = sent
        self.retry_after = retry_after


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry.

    Attributes:
        attempts: tries in all, the first included.
        base_delay: seconds before the first retry; each further retry doubles it.
        max_delay: the cap on one delay.
        jitter: fraction of each delay drawn at random (0 waits exactly, 1 waits between 0 and the delay).
        conflict_attempts: read-modify-write rounds before a conflict is given up.
        conflict_delay: scale of the random pause between such rounds, so racing writers spread out.
        sleep: how to wait (tests pass a recorder).
    """

    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 5.0
    jitter: float = 0.5
    conflict_attempts: int = 16
    conflict_delay: float = 0.01
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first retry)."""
        exact = min(self.max_delay, self.base_delay * 2.0**retry)
        if retry_after is not None:
            exact = min(self.max_delay, max(exact, retry_after))
        return exact * (1.0 - self.jitter * random.random())

    def wait(self, retry: int, retry_after: float | None = None) -> None:
        """Sleep before retry number ``retry``."""
        seconds = self.delay(retry, retry_after)
        if seconds > 0:
            self.sleep(seconds)

    def wait_conflict(self, attempt: int) -> None:
        """Pause a random moment (growing with ``attempt``) before reading again after a conflict."""
        seconds = random.uniform(0, self.conflict_delay * 2 ** min(attempt, 5))
        if seconds > 0:
            self.sleep(seconds)

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The default policy, tuned by ``DSX_RETRY_ATTEMPTS`` and ``DSX_RETRY_BASE_DELAY`` when set.

        Raises:
            InputError: ``DSX_RETRY_ATTEMPTS`` is not a whole number from 1 to :data:`MAX_ATTEMPTS`, or
                ``DSX_RETRY_BASE_DELAY`` is not a finite number of seconds from 0 to ``max_delay``
                (``nan`` would make every wait ``nan`` and ``time.sleep`` fail mid-call; ``inf``
                would wait forever).
        """
        attempts_text = os.environ.get(vocab.ENV_RETRY_ATTEMPTS, "").strip()
        base_text = os.environ.get(vocab.ENV_RETRY_BASE_DELAY, "").strip()
        attempts, base = cls.attempts, cls.base_delay
        if attempts_text:
            try:
                attempts = int(attempts_text)
            except ValueError:
                attempts = 0
            if not 1 <= attempts <= MAX_ATTEMPTS:
                raise InputError(
                    f"{vocab.ENV_RETRY_ATTEMPTS}={attempts_text!r}: expected a whole number "
                    f"from 1 to {MAX_ATTEMPTS}"
                )
        if base_text:
            try:
                base = float(base_text)
            except ValueError:
                base = math.nan
            if not (math.isfinite(base) and 0 <= base <= cls.max_delay):
                raise InputError(
                    f"{vocab.ENV_RETRY_BASE_DELAY}={base_text!r}: expected seconds "
                    f"from 0 to {cls.max_delay:g}"
                )
        return cls(attempts=attempts, base_delay=base)

"""Faults injected on purpose into one rank of a local run, to play a slow or failing node.

A spec reads ``RANK:KIND[=VALUE]``: ``3:delay=5ms`` (the rank arrives that much late to every
collective or training step), ``2:fail`` (the rank raises half-way through), ``1:hang`` (the rank stops
answering half-way through), ``1:corrupt`` (the rank's reduced data is altered, so the data check
fails) and, for training, ``0:nan`` (the rank's loss becomes NaN). Every output of a run with an
injected fault says so.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict

from steps.errors import InputError

__all__ = ["InjectedFailure", "Injection", "fail_or_hang", "parse_duration", "parse_injections"]

Kind = Literal["delay", "fail", "hang", "corrupt", "nan"]
_KINDS: tuple[str, ...] = ("delay", "fail", "hang", "corrupt", "nan")
_SPEC = re.compile(r"^\s*(?P<rank>\d+)\s*:\s*(?P<kind>[a-z]+)\s*(?:=\s*(?P<value>\S+))?\s*$")
_DURATION = re.compile(r"^(?P<number>\d+(?:\.\d+)?)(?P<unit>us|ms|s)?$")
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1e-3}


class InjectedFailure(RuntimeError):
    """Raised by a rank told to fail (``RANK:fail``)."""


class Injection(BaseModel):
    """One injected fault: which rank, what kind, and for ``delay`` how long."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    kind: Kind
    seconds: float = 0.0
    spec: str

    def label(self) -> str:
        """How every output names it: ``rank 2: delay=20ms (injected)``."""
        return f"rank {self.rank}: {self.spec.split(':', 1)[1]} (injected)"


def fail_or_hang(mine: Injection | None, rank: int, where: str) -> None:
    """At the fault point of a rank program, do what a ``fail`` or ``hang`` injection asks (else nothing).

    A hang never returns: the rank stops answering, as a wedged GPU does, until the launcher's timeout
    names it.

    Args:
        mine: this rank's injection, if any.
        rank: this rank.
        where: the fault point, for the message (``at step 10``, ``at 1048576 bytes``).

    Raises:
        InjectedFailure: the rank was told to fail.
    """
    if mine is None:
        return
    if mine.kind == "fail":
        raise InjectedFailure(f"rank {rank}: injected failure {where} ({mine.spec})")
    if mine.kind == "hang":
        print(f"rank {rank}: injected hang {where} ({mine.spec})", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)


def parse_duration(text: str) -> float:
    """``5ms``, ``0.5s``, ``200us`` or a plain number of milliseconds, in seconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise InputError(f"{text!r} is not a duration (examples: 5ms, 0.5s, 200us)")
    return float(match.group("number")) * _DURATION_UNITS[match.group("unit")]


def parse_injections(specs: list[str], world_size: int, allowed: tuple[str, ...] = _KINDS) -> list[Injection]:
    """Read ``--inject`` specs for a run of ``world_size`` ranks.

    Raises:
        InputError: a spec is malformed, names a rank outside the run or a kind not allowed here, or
            one rank gets two faults.
    """
    injections: dict[int, Injection] = {}
    for spec in specs:
        match = _SPEC.match(spec)
        if match is None:
            raise InputError(f"--inject {spec!r}: expected RANK:KIND[=VALUE], e.g. 3:delay=5ms or 2:fail")
        rank, kind, value = int(match.group("rank")), match.group("kind"), match.group("value")
        if kind not in allowed:
            raise InputError(f"--inject {spec!r}: unknown fault {kind!r} (one of {', '.join(allowed)})")
        if rank >= world_size:
            raise InputError(f"--inject {spec!r}: rank {rank} is outside a run of {world_size} ranks")
        if rank in injections:
            raise InputError(f"--inject {spec!r}: rank {rank} already has a fault injected")
        seconds = 0.0
        if kind == "delay":
            if value is None:
                raise InputError(f"--inject {spec!r}: a delay needs a duration, e.g. {rank}:delay=20ms")
            try:
                seconds = parse_duration(value)
            except InputError as exc:
                raise InputError(f"--inject {spec!r}: {exc}") from None
        elif value is not None:
            raise InputError(f"--inject {spec!r}: {kind} takes no value")
        canonical = f"{rank}:{kind}" + (f"={value}" if value is not None else "")
        injections[rank] = Injection(rank=rank, kind=kind, seconds=seconds, spec=canonical)
    return [injections[rank] for rank in sorted(injections)]

"""The all-reduce sweep: one program for both worlds, NCCL between GPUs and gloo between CPU processes.

Run one process per rank, by torchrun on a cluster or by :func:`steps.readiness.launchers.local.launch_local`
on one machine::

    torchrun --nproc-per-node 8 -m steps.readiness.ranks.sweep --backend nccl --max-bytes 8GiB \
        --out sweep.json

For each message size from ``--min-bytes`` to ``--max-bytes`` (times ``--factor``) every rank first
checks the data (a rank-dependent pattern is reduced and every element compared with the expected
sum: a wrong result is counted, and the size gets no bandwidth figure), then runs warm-up and timed
iterations. Time per size is the mean over ranks of the timed loop divided by the iterations, as
nccl-tests reports it; algbw is size over time, busbw is algbw times 2(n-1)/n.

Each rank also records the time it spends outside the collective (its own work, and any injected
delay) against inside it (waiting for the others and moving data). A rank that arrives late spends
its time outside while the others wait for it inside, which names the straggler.

Rank 0 writes the :class:`~steps.readiness.models.CollectiveRun` as JSON to ``--out`` and prints the
table in the nccl-tests layout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from steps.errors import DsxError
from steps.files import write_text
from steps.readiness.models import (
    CollectiveRun,
    Footer,
    Measurement,
    Preamble,
    RankInfo,
    RankStats,
    ResultTable,
    Row,
    dump_json,
)
from steps.readiness.ranks.inject import Injection, fail_or_hang, parse_injections
from steps.readiness.ranks.rankenv import PhaseMarker, RankEnv, exit_rank, joined, stacks_on_signals, sync
from steps.readiness.sizes import format_size, parse_size, size_series
from steps.readiness.table import format_nccl_table

__all__ = ["SweepConfig", "bus_factor", "main", "run_rank", "sweep_args", "timed_loop"]

_ELEMENT_BYTES = 4  # float32
_PATTERN_PERIOD = 7


class SweepConfig(BaseModel):
    """What one sweep measures; the same on every rank."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = "gloo"
    min_bytes: int = 1024
    max_bytes: int = 16 << 20
    factor: int = 4
    warmup: int = Field(default=5, ge=0)
    iters: int = Field(default=20, ge=1)
    inject: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=300.0, gt=0)

    def sizes(self) -> list[int]:
        """The message sizes of the sweep, in bytes."""
        return size_series(self.min_bytes, self.max_bytes, self.factor, align=_ELEMENT_BYTES)


DEFAULTS = SweepConfig()
"""The sweep's one set of defaults (1 KiB to 16 MiB by 4, 5 warm-up and 20 timed iterations a size, 300 s),
which the requests, ``dsx nccl sweep``, certification's plan and this program's own options start from."""


def bus_factor(world_size: int) -> float:
    """The all-reduce bus bandwidth factor 2(n-1)/n of nccl-tests."""
    return 2.0 * (world_size - 1) / world_size


def sweep_args(config: SweepConfig) -> list[str]:
    """The command-line flags that make :func:`main` run ``config``."""
    args = [
        "--backend",
        config.backend,
        "--min-bytes",
        str(config.min_bytes),
        "--max-bytes",
        str(config.max_bytes),
        "--factor",
        str(config.factor),
        "--warmup",
        str(config.warmup),
        "--iters",
        str(config.iters),
        "--timeout",
        str(config.timeout_s),
    ]
    for spec in config.inject:
        args += ["--inject", spec]
    return args


def _device_info(torch: Any, device: Any) -> tuple[str, str]:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        parts: list[int] = [
            getattr(props, name, -1) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")
        ]
        bus_id = (
            f"{parts[0]:04x}:{parts[1]:02x}:{parts[2]:02x}" if min(parts) >= 0 else f"cuda:{device.index}"
        )
        return bus_id, str(torch.cuda.get_device_name(device))
    return "cpu", "CPU (gloo)"


def run_rank(config: SweepConfig, env: RankEnv) -> CollectiveRun | None:
    """Run the sweep as one rank of an initialised-on-demand process group.

    Returns:
        The run on rank 0, ``None`` on the other ranks.

    Raises:
        InjectedFailure: this rank was told to fail (``RANK:fail``).
    """
    injections = {
        i.rank: i
        for i in parse_injections(config.inject, env.world_size, ("delay", "fail", "hang", "corrupt"))
    }
    mine: Injection | None = injections.get(env.rank)
    sizes = config.sizes()
    with joined(config.backend, env, config.timeout_s) as (torch, dist, device):
        return _sweep(torch, dist, config, env, device, sizes, mine, list(injections.values()))


def timed_loop(dist: Any, buf: Any, iters: int, delay: float, phase: PhaseMarker) -> float:
    """The sweep's timed iterations: ``iters`` all-reduces of ``buf``, each after the rank's own work
    (an injected ``delay``). Returns the seconds spent outside the collective."""
    outside = 0.0
    for _ in range(iters):
        before = time.perf_counter()
        if delay:
            time.sleep(delay)
        after = time.perf_counter()
        phase.inside()
        dist.all_reduce(buf)
        phase.outside()
        outside += after - before
    return outside


def _sweep(
    torch: Any,
    dist: Any,
    config: SweepConfig,
    env: RankEnv,
    device: Any,
    sizes: list[int],
    mine: Injection | None,
    injections: list[Injection],
) -> CollectiveRun | None:
    phase = PhaseMarker()
    world = env.world_size
    delay = mine.seconds if mine is not None and mine.kind == "delay" else 0.0
    fault_at = len(sizes) // 2
    total_expected = world * (world + 1) / 2
    base = torch.arange(1, _PATTERN_PERIOD + 1, dtype=torch.float32, device=device)
    per_rank = torch.zeros((world, 3), dtype=torch.float64, device=device)
    rows: list[Row] = []
    gathered = [torch.zeros(3, dtype=torch.float64, device=device) for _ in range(world)]
    for index, size in enumerate(sizes):
        count = size // _ELEMENT_BYTES
        if index == fault_at:
            fail_or_hang(mine, env.rank, f"at {size} bytes")
        pattern = base.repeat((count + _PATTERN_PERIOD - 1) // _PATTERN_PERIOD)[:count]
        buf = pattern * float(env.rank + 1)
        phase.inside()
        dist.all_reduce(buf)
        phase.outside()
        if mine is not None and mine.kind == "corrupt":
            buf[count // 2] += 1.0
        wrong = int(torch.ne(buf, pattern.mul_(total_expected)).sum().item())
        del pattern
        buf.zero_()
        for _ in range(config.warmup):
            if delay:
                time.sleep(delay)
            phase.inside()
            dist.all_reduce(buf)
            phase.outside()
        sync(torch, device)
        phase.inside()
        dist.barrier()
        phase.outside()
        start = time.perf_counter()
        outside = timed_loop(dist, buf, config.iters, delay, phase)
        sync(torch, device)
        total = time.perf_counter() - start
        wrong += int(torch.count_nonzero(buf).item())
        stats = torch.tensor([total, outside, float(wrong)], dtype=torch.float64, device=device)
        phase.inside()
        dist.all_gather(gathered, stats)
        phase.outside()
        table = torch.stack(gathered).cpu()
        per_rank += table.to(device)
        if env.rank == 0:
            rows.append(_row(size, count, table.tolist(), config.iters, world))
        del buf
    who = (env.rank, env.host, os.getpid(), env.local_rank, *_device_info(torch, device))
    everyone: list[Any] = [None] * world
    phase.inside()
    dist.all_gather_object(everyone, who)
    phase.outside()
    if env.rank != 0:
        return None
    return _run(config, sizes, rows, per_rank.cpu().tolist(), everyone, injections)


def _significant(value: float) -> float:
    """``value`` kept to 6 significant digits (tiny CPU bandwidths keep their precision)."""
    return float(f"{value:.6g}")


def _row(size: int, count: int, table: list[list[float]], iters: int, world: int) -> Row:
    seconds = statistics.fmean(entry[0] for entry in table) / iters
    wrong = int(sum(entry[2] for entry in table))
    algbw = size / 1e9 / seconds if seconds > 0 else None
    busbw = None if algbw is None else algbw * bus_factor(world)
    if wrong:
        algbw = busbw = None  # a wrong result is an error, never a number
    return Row(
        size=size,
        count=count,
        type="float",
        redop="sum",
        root=-1,
        out_of_place=None,
        in_place=Measurement(
            time_us=_significant(seconds * 1e6),
            algbw_gbps=None if algbw is None else _significant(algbw),
            busbw_gbps=None if busbw is None else _significant(busbw),
            wrong=wrong,
        ),
    )


def _run(
    config: SweepConfig,
    sizes: list[int],
    rows: list[Row],
    per_rank: list[list[float]],
    everyone: list[Any],
    injections: list[Injection],
) -> CollectiveRun:
    labels = {i.rank: i.label() for i in injections}
    ranks = [
        RankInfo(rank=r, host=host, group=0, pid=pid, device=local, bus_id=bus, device_name=name)
        for r, host, pid, local, bus, name in sorted(everyone)
    ]
    hosts = {rank.rank: rank.host for rank in ranks}
    outside = [entry[1] for entry in per_rank]
    totals = [entry[0] for entry in per_rank]
    median_outside = statistics.median(outside)
    median_total = statistics.median(totals) or 1e-12
    stats = [
        RankStats(
            rank=r,
            host=hosts[r],
            outside_s=round(entry[1], 6),
            inside_s=round(max(entry[0] - entry[1], 0.0), 6),
            skew=round((entry[1] - median_outside) / median_total, 4),
            injected=labels.get(r),
        )
        for r, entry in enumerate(per_rank)
    ]
    wrong = sum(row.wrong() for row in rows)
    figures = [row.busbw() for row in rows]
    known = [f for f in figures if f is not None]
    problems = [
        f"{row.wrong()} wrong elements at {row.size} bytes: the reduced data is not the expected sum"
        for row in rows
        if row.wrong()
    ]
    return CollectiveRun(
        source="dsx-sweep",
        status="corrupted" if wrong else "complete",
        problems=problems,
        collective="all_reduce",
        backend=config.backend,
        layout="new",
        preamble=Preamble(
            n_threads=1,
            n_gpus=1,
            min_bytes=sizes[0],
            max_bytes=sizes[-1],
            step_factor=config.factor,
            warmup_iters=config.warmup,
            iters=config.iters,
            agg_iters=1,
            validation=1,
            graph=0,
        ),
        ranks=ranks,
        hosts=list(dict.fromkeys(rank.host for rank in ranks)),
        results=ResultTable.of(rows),
        footer=Footer(
            out_of_bounds=wrong,
            out_of_bounds_ok=wrong == 0,
            avg_busbw_gbps=round(statistics.fmean(known), 6) if known else None,
        ),
        injected=[labels[r] for r in sorted(labels)],
        rank_stats=stats,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m steps.readiness.ranks.sweep", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    parser.add_argument("--min-bytes", default=format_size(DEFAULTS.min_bytes))
    parser.add_argument("--max-bytes", default=format_size(DEFAULTS.max_bytes))
    parser.add_argument("--factor", type=int, default=DEFAULTS.factor)
    parser.add_argument("--warmup", type=int, default=DEFAULTS.warmup)
    parser.add_argument("--iters", type=int, default=DEFAULTS.iters)
    parser.add_argument("--timeout", type=float, default=DEFAULTS.timeout_s, help="process-group timeout, s")
    parser.add_argument("--inject", action="append", default=[], help="RANK:KIND[=VALUE], e.g. 2:delay=20ms")
    parser.add_argument("--out", type=Path, help="where rank 0 writes the run as JSON")
    parser.add_argument("--table", type=Path, help="where rank 0 writes the table (nccl-tests layout)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one rank of the sweep; rank 0 prints the table and writes ``--out``. Returns the exit status."""
    args = _parser().parse_args(argv)
    stacks_on_signals()
    try:
        config = SweepConfig(
            backend=args.backend,
            min_bytes=parse_size(args.min_bytes, "--min-bytes"),
            max_bytes=parse_size(args.max_bytes, "--max-bytes"),
            factor=args.factor,
            warmup=args.warmup,
            iters=args.iters,
            inject=args.inject,
            timeout_s=args.timeout,
        )
        config.sizes()
        run = run_rank(config, RankEnv.from_environ())
    except DsxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if run is not None:
        table = format_nccl_table(run)
        sys.stdout.write(table)
        sys.stdout.flush()
        if args.out is not None:
            write_text(args.out, dump_json(run))
        if args.table is not None:
            write_text(args.table, table)
    return 0


if __name__ == "__main__":
    exit_rank(main())

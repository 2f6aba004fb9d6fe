"""A :class:`~steps.readiness.models.CollectiveRun` as a table in the layout of nccl-tests.

The text reads back through :func:`steps.readiness.nccl_tests.parse_nccl_tests`, so a dsx sweep and an
``all_reduce_perf`` log can go through the same tools. Figures a run does not have print as ``N/A``
(a torch.distributed all-reduce is in-place only, so the out-of-place half is ``N/A``).
"""

from __future__ import annotations

from steps.readiness.models import CollectiveRun, Measurement

__all__ = ["format_nccl_table"]

_LEAD = "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}"
_META = _LEAD.format("", "", "", "", "") + "           out-of-place                       in-place          "
_NAMES = (
    _LEAD.format("size", "count", "type", "redop", "root")
    + "  {:>7}  {:>6}  {:>6} {:>6}".format("time", "algbw", "busbw", "#wrong") * 2
)
_UNITS = (
    _LEAD.format("(B)", "(elements)", "", "", "")
    + "  {:>7}  {:>6}  {:>6}  {:>5}".format("(us)", "(GB/s)", "(GB/s)", "") * 2
)
_HALF = "  {:>7}  {:>6}  {:>6}  {:>5}"


def _time(value: float | None) -> str:
    if value is None:
        return "N/A"
    return f"{value:.2f}" if value < 10_000 else f"{value:.0f}"


def _figure(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.2f}"


def _half(measured: Measurement | None) -> str:
    if measured is None:
        return _HALF.format("N/A", "N/A", "N/A", "N/A")
    wrong = "N/A" if measured.wrong is None else str(measured.wrong)
    return _HALF.format(
        _time(measured.time_us),
        _figure(measured.algbw_gbps),
        _figure(measured.busbw_gbps),
        wrong,
    )


def format_nccl_table(run: CollectiveRun) -> str:
    """The run in the nccl-tests layout: preamble, devices, result rows and both footer lines."""
    lines: list[str] = []
    if run.source == "dsx-sweep":
        lines.append(
            f"# dsx {run.collective or 'all_reduce'} sweep: torch.distributed, backend {run.backend}"
        )
    for label in run.injected:
        lines.append(f"# injected: {label}")
    pre = run.preamble
    if pre is not None:
        step = f"{pre.step_factor}(factor)" if pre.step_factor is not None else f"{pre.step_bytes}(bytes)"
        lines.append(
            f"# nThread {pre.n_threads} nGpus {pre.n_gpus} minBytes {pre.min_bytes} maxBytes {pre.max_bytes} "
            f"step: {step} warmup iters: {pre.warmup_iters} iters: {pre.iters} agg iters: {pre.agg_iters} "
            f"validation: {pre.validation} graph: {pre.graph}"
        )
    lines.append("#")
    if run.ranks:
        lines.append("# Using devices")
        for rank in run.ranks:
            lines.append(
                f"#  Rank {rank.rank:2d} Group {rank.group or 0:2d} Pid {rank.pid or 0:6d} "
                f"on {rank.host:>10} "
                f"device {rank.device or 0:2d} [{rank.bus_id or ''}] {rank.device_name or ''}"
            )
        lines.append("#")
    lines += [_META, _NAMES, _UNITS]
    for row in run.rows:
        root = -1 if row.root is None else row.root
        lines.append(
            f"{row.size:12d}  {row.count:12d}  {row.type:>8}  {row.redop or 'none':>6}  {root:6d}"
            + _half(row.out_of_place)
            + _half(row.in_place)
        )
    footer = run.footer
    if footer is not None:
        count = footer.out_of_bounds if footer.out_of_bounds is not None else "N/A"
        lines.append(f"# Out of bounds values : {count} {'OK' if footer.out_of_bounds_ok else 'FAILED'}")
        avg = "N/A" if footer.avg_busbw_gbps is None else f"{footer.avg_busbw_gbps:g}"
        lines.append(f"# Avg bus bandwidth    : {avg}")
        lines.append("#")
    return "\n".join(lines) + "\n"

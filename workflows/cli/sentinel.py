"""``dsx sentinel``: the per-node health agent, its one-shot probe, the fault catalogue, and the two
fleet-wide brakes a person resets: the quarantine breaker and the agents' taint budget."""

from __future__ import annotations

import datetime as dt
import os
import shlex
import signal
import threading
from pathlib import Path
from typing import Any

import typer

from steps.cluster import ClusterError, NotFoundError, connect
from steps.cluster import vocabulary as vocab
from steps.durations import parse_duration
from steps.errors import InputError
from steps.sentinel import ledger
from steps.sentinel.agent import GuardedProbe, ProbeTimeoutError, probe_fault, serve
from steps.sentinel.budget import TaintBudget, TaintBudgetSettings, parse_daemonset
from steps.sentinel.catalogue import FaultCatalogue, load_catalogue
from steps.sentinel.history import NodeHistory, Returned, XidHistory, port_counts
from steps.sentinel.kernel_log import Boot
from steps.sentinel.node import Sentinel, build_probes, build_sentinel
from steps.sentinel.policy import Breaker
from steps.sentinel.probes import parse_fabric_nics
from steps.sentinel.rates import CounterRates
from steps.sentinel.remediate import returns_within
from steps.sentinel.state import StateFile
from workflows.cli._reconcile import reconcile_cmd, reconcile_now
from workflows.cli._signals import EXIT_TERMINATED
from workflows.cli.output import OUTPUT_OPTION, OutputFormat, emit, print_table

OVERRIDES_OPTION = typer.Option(
    None,
    "--overrides",
    envvar=vocab.ENV_SENTINEL_OVERRIDES,
    help="A FaultOverrides file: this cluster's severities, actions and modes.",
)
KERNEL_LOG_OPTION = typer.Option(
    None,
    "--kernel-log",
    envvar=vocab.ENV_SENTINEL_KERNEL_LOG,
    help="Read XIDs from this file of dmesg, journalctl -k or syslog lines, such as /var/log/kern.log "
    "(default /dev/kmsg on a GPU node); only this boot's lines count.",
)
SYSFS_OPTION = typer.Option(
    None, "--sysfs", envvar=vocab.ENV_SENTINEL_SYSFS, help="Where the node's /sys is mounted (default /sys)."
)
SOURCE_OPTION = typer.Option(
    "auto",
    "--source",
    help="auto (the simulated fleet's hardware where it has one, else NVML), nvml, cluster.",
)
EXPECTED_OPTION = typer.Option(
    None,
    "--expected-gpus",
    min=1,
    max=64,
    help="GPUs the node should have (default: its nvidia.com/gpu capacity as the API server reports it).",
)
STATE_DIR_OPTION = typer.Option(
    None,
    "--state-dir",
    envvar=vocab.ENV_SENTINEL_STATE_DIR,
    help="Keep the agent's state in this directory of the node, so that a restart in the same boot "
    "neither reports again nor forgets (default: none).",
)
FABRIC_NICS_OPTION = typer.Option(
    None,
    "--fabric-nics",
    help="The fabric's ports, comma-separated device names or globs (mlx5_*,efa*,ib0): only they are "
    "watched (default: the RDMA ports in /sys/class/infiniband and the Ethernet interfaces up at start). "
    "Either way a port never up since the agent started is not a fault.",
)
TAINT_BUDGET_OPTION = typer.Option(
    0.1,
    "--taint-budget",
    help="The largest share of the GPU nodes the agents may taint within the window, fleet-wide "
    "(0.1: 10%; at least one node); past it taints are withheld until `dsx sentinel budget reset`.",
)
TAINT_WINDOW_OPTION = typer.Option(
    "1h", "--taint-budget-window", help="The taint budget's sliding window: seconds or 30m, 1h..."
)
FLEET_DAEMONSET_OPTION = typer.Option(
    None,
    "--fleet-daemonset",
    help="NAMESPACE/NAME of the sentinel's DaemonSet: the taint budget's share is of the nodes it runs on "
    "(default: count the nodes with GPUs, which needs nodes list).",
)


def _catalogue(overrides: Path | None) -> FaultCatalogue:
    return load_catalogue(overrides=overrides)


def _catalogue_table(entries: list[Any]) -> None:
    rows = [[e.check, e.code, e.severity, e.action, e.mode, e.source, e.description] for e in entries]
    print_table(None, ["check", "code", "severity", "action", "mode", "source", "description"], rows)


def _events_table(events: list[Any]) -> None:
    rows = [
        [e.check, e.entity, e.code or "-", "healthy" if e.healthy else e.severity, e.action, e.message]
        for e in events
    ]
    print_table(None, ["check", "entity", "code", "state", "action", "message"], rows)


def _source(value: str) -> Any:
    if value not in ("auto", "nvml", "cluster"):
        raise InputError(f"--source {value!r}: expected auto, nvml or cluster")
    return value


def _one_pass(sentinel: Any, output: OutputFormat) -> None:
    """``agent --once``: one pass, what changed printed; exit 1 if the node has a degraded or fatal fault."""
    result = sentinel.run_once()
    emit(result.changed, output, _events_table)
    if result.queued:
        typer.echo(f"warning: {result.queued} writes not delivered (API server unreachable)", err=True)
    states = sentinel.agent.state.values()
    if any(s.event is not None and s.event.severity != "info" for s in states):
        raise typer.Exit(1)


def catalog_cmd(overrides: Path | None = OVERRIDES_OPTION, output: OutputFormat = OUTPUT_OPTION) -> None:
    """Print the effective fault catalogue: check, code, severity, action and mode of every entry
    (code * is the default for an XID or SXid the catalogue does not list)."""
    emit(_catalogue(overrides).entries(), output, _catalogue_table)


PROBE_TIMEOUT_OPTION = typer.Option(
    10.0,
    "--probe-timeout",
    min=0.1,
    help="Seconds a probe may take; one that does not return is reported degraded and skipped "
    "until it does, while passes go on.",
)


def probe_cmd(
    node: str = typer.Option(
        os.environ.get(vocab.ENV_NODE_NAME) or os.uname().nodename, "--node", help="This node's name."
    ),
    cluster: str | None = typer.Option(
        None, "--cluster", help="Probe a simulated node of this fleet instead of this machine."
    ),
    kernel_log: str | None = KERNEL_LOG_OPTION,
    sysfs: str | None = SYSFS_OPTION,
    expected: int | None = EXPECTED_OPTION,
    fabric_nics: str | None = FABRIC_NICS_OPTION,
    probe_timeout: float = PROBE_TIMEOUT_OPTION,
    overrides: Path | None = OVERRIDES_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Run every probe once on this node and print the readings. Exit 1 when one finds a degraded
    or fatal fault (a machine without a GPU: NVML unavailable; a probe that did not answer within
    --probe-timeout), 0 when all are healthy."""

    catalogue = _catalogue(overrides)
    fabric = parse_fabric_nics(fabric_nics) if fabric_nics is not None else ()
    port = None
    if cluster is not None:
        port = connect(cluster)
    probes, nvml = build_probes(
        node,
        catalogue,
        port=port,
        kernel_log=kernel_log,
        sysfs=sysfs,
        expected_gpus=expected,
        fabric_nics=fabric,
    )
    events: list[Any] = []
    hung = False
    try:
        for name, probe in probes.probes():
            try:
                events.extend(GuardedProbe(name, probe).call(probe_timeout))
            except ProbeTimeoutError as exc:  # a wedged driver: said, the other probes still run
                hung = True
                now = dt.datetime.now(dt.UTC)
                events.append(probe_fault(catalogue, node, name, "probe-timeout", str(exc), now))
                events.extend(probes.timeout_readings(name, exc.timeout))
            except OSError as exc:  # an unreadable kernel log or sysfs: said, not a traceback
                typer.echo(f"warning: probe {name}: {exc}", err=True)
    finally:
        # NVML calls may still hang in a probe's thread: shutting NVML down under them could block
        if nvml is not None and not hung:
            nvml.close()
    emit(events, output, _events_table)
    bad = [e for e in events if not e.healthy and e.severity != "info"]
    if any(e.check == "nvml" and e.code != "nvml-timeout" for e in bad):
        typer.echo("NVML is not available on this machine (no NVIDIA GPU or driver)", err=True)
    if bad:
        raise typer.Exit(1)


METRICS_PORT_OPTION = typer.Option(
    9400, "--metrics-port", min=0, max=65535, help="Port of /metrics and /healthz (0: none)."
)
NODE_READ_INTERVAL_OPTION = typer.Option(
    60.0,
    "--node-read-interval",
    min=0.0,
    help="Seconds between two reads of the node for the dsx_sentinel_node_* metrics (its taint, state, "
    "certification, drift; 0: every pass).",
)
RESET_GPUS_OPTION = typer.Option(
    False,
    "--reset-gpus/--no-reset-gpus",
    help="Carry out dsx-remediate's reset-gpu requests on this node: reset each GPU the request names "
    "once nothing holds it (nvidia-smi --gpu-reset; needs root), then probe again.",
)
KURED_SENTINEL_OPTION = typer.Option(
    None,
    "--kured-sentinel",
    help="Carry out dsx-remediate's reboot requests through kured: write this file, the one kured "
    "watches (its --reboot-sentinel, /var/run/reboot-required on the host by default), as this "
    "process sees it.",
)
REBOOT_COMMAND_OPTION = typer.Option(
    None,
    "--reboot-command",
    help="Carry out dsx-remediate's reboot requests with this command, the agent's own (the chart's: "
    "nsenter -m/proc/1/ns/mnt -- /bin/systemctl reboot, from a privileged container in the host's PID "
    "namespace); not with --kured-sentinel.",
)


def agent_cmd(
    node: str = typer.Option(
        os.environ.get(vocab.ENV_NODE_NAME) or "",
        "--node",
        help="The node this agent watches ($DSX_NODE_NAME).",
    ),
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster spec (default $DSX_CLUSTER, kube)."),
    once: bool = typer.Option(False, "--once", help="Run one pass, print what changed, exit."),
    interval: float = typer.Option(10.0, "--interval", min=0.1, help="Seconds between passes."),
    debounce: int = typer.Option(1, "--debounce", min=1, help="Passes a non-fatal reading must hold."),
    probe_timeout: float = PROBE_TIMEOUT_OPTION,
    metrics_port: int = METRICS_PORT_OPTION,
    node_read_interval: float = NODE_READ_INTERVAL_OPTION,
    source: str = SOURCE_OPTION,
    kernel_log: str | None = KERNEL_LOG_OPTION,
    sysfs: str | None = SYSFS_OPTION,
    expected: int | None = EXPECTED_OPTION,
    state_dir: str | None = STATE_DIR_OPTION,
    fabric_nics: str | None = FABRIC_NICS_OPTION,
    taint_budget: float = TAINT_BUDGET_OPTION,
    taint_window: str = TAINT_WINDOW_OPTION,
    fleet_daemonset: str | None = FLEET_DAEMONSET_OPTION,
    reset_gpus: bool = RESET_GPUS_OPTION,
    kured_sentinel: str | None = KURED_SENTINEL_OPTION,
    reboot_command: str | None = REBOOT_COMMAND_OPTION,
    overrides: Path | None = OVERRIDES_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Watch this node: conditions, Events, metrics and, on a fatal fault, the dsx.dev/unhealthy taint
    (never on a node labelled dsx.dev/managed=false, never past the fleet-wide taint budget); with
    --reset-gpus, --kured-sentinel or --reboot-command, carry out the repairs dsx-remediate asks for on it.
    With --once: one pass, then exit 1 if the node has a degraded or fatal fault, else 0."""

    if not node:
        raise InputError("--node: no node name given (or set $DSX_NODE_NAME)")
    fabric = parse_fabric_nics(fabric_nics) if fabric_nics is not None else ()
    budget = _budget_settings(taint_budget, taint_window)
    daemonset = parse_daemonset(fleet_daemonset) if fleet_daemonset is not None else None
    if state_dir is not None and Path(state_dir).exists() and not Path(state_dir).is_dir():
        raise InputError(f"--state-dir {state_dir}: not a directory")
    if kured_sentinel is not None and (not kured_sentinel or Path(kured_sentinel).is_dir()):
        raise InputError(f"--kured-sentinel {kured_sentinel!r}: not a file's path")
    rebooting = _reboot_command(reboot_command, kured_sentinel)
    port = connect(cluster)
    try:
        port.get_node(node)
    except NotFoundError:
        raise InputError(f"--node {node}: no such node in the cluster") from None
    except ClusterError as exc:  # the API server away at start: the agent queues and carries on
        typer.echo(f"warning: sentinel: node/{node} not read at start: {exc}", err=True)
    sentinel = build_sentinel(
        port,
        node,
        _catalogue(overrides),
        source=_source(source),
        kernel_log=kernel_log,
        sysfs=sysfs,
        expected_gpus=expected,
        debounce=debounce,
        probe_timeout=probe_timeout,
        state_dir=state_dir,
        fabric_nics=fabric,
        taint_budget=budget,
        fleet_daemonset=daemonset,
        node_read_s=node_read_interval,
        reset_gpus=reset_gpus,
        kured_sentinel=kured_sentinel,
        reboot_command=rebooting,
    )
    if once:
        _one_pass(sentinel, output)
        return
    if metrics_port:
        serve(sentinel.agent, "0.0.0.0", metrics_port, interval)
    _run(sentinel, interval)


def _run(sentinel: Sentinel, interval: float) -> None:
    """Run passes every ``interval`` seconds until stopped: Ctrl-C, or the kubelet's SIGTERM, after which
    the queued writes are made and the state file written (exit :data:`EXIT_TERMINATED`)."""
    stop = threading.Event()
    terminated = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        # The kubelet stops the pod with SIGTERM: the pass under way ends, then the queue is written.
        terminated.set()
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        sentinel.agent.run(interval, stop, lambda seconds: sentinel.wait(seconds, stop), sentinel.finish_pass)
    except KeyboardInterrupt:
        stop.set()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if terminated.is_set():
        left = sentinel.agent.flush_queue()
        sentinel.after_pass()  # the state file: what a restarted agent of this boot takes up
        typer.echo(
            f"sentinel: stopped by SIGTERM; {left.written} queued write(s) made, {left.queued} left queued",
            err=True,
        )
        raise typer.Exit(EXIT_TERMINATED)


def _reboot_command(text: str | None, kured_sentinel: str | None) -> list[str] | None:
    """``--reboot-command`` as the program and its arguments (shell quoting, no shell run).

    Raises:
        InputError: it is empty or unbalanced, or given with ``--kured-sentinel``.
    """
    if text is None:
        return None
    if kured_sentinel is not None:
        raise InputError("--reboot-command and --kured-sentinel: a reboot goes through one of them, not both")
    try:
        command = shlex.split(text)
    except ValueError as exc:
        raise InputError(f"--reboot-command {text!r}: {exc}") from None
    if not command:
        raise InputError("--reboot-command: no command given")
    return command


def _budget_settings(share: float, window: str) -> Any:
    """The taint budget's settings from ``--taint-budget`` and ``--taint-budget-window``; InputError
    naming the option when one is out of range."""

    if not 0 < share <= 1:
        raise InputError(
            f"--taint-budget {share:g}: a share of the GPU nodes, more than 0 and at most 1 (0.1: 10%)"
        )
    try:
        seconds = parse_duration(window)
    except ValueError as exc:
        raise InputError(f"--taint-budget-window {window!r}: {exc}") from None
    if seconds <= 0:
        raise InputError(f"--taint-budget-window {window!r}: the window must be longer than 0 s")
    return TaintBudgetSettings(max_share=share, window_s=seconds)


def _budget_table(s: Any) -> None:
    row = [s.state, s.held_at, s.held_reason, ", ".join(sorted(s.tainted)), s.reset_at, s.reset_by]
    print_table(None, ["state", "held at", "reason", "tainted in window", "reset at", "reset by"], [row])


def budget_status_cmd(
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster spec (default $DSX_CLUSTER, kube)."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Print whether the taint budget holds, since when and why, and the nodes agents tainted in its
    window (ConfigMap dsx-taint-budget in dsx's namespace, $DSX_NAMESPACE)."""

    emit(TaintBudget(connect(cluster)).status(), output, _budget_table)


def budget_reset_cmd(
    by: str = typer.Option(..., "--by", help="Who resets it (recorded)."),
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster spec (default $DSX_CLUSTER, kube)."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Let the agents taint again: the budget stops holding and its window empties, so the taints
    withheld land at the agents' next ask (as many as the budget allows before it holds again). It never
    lets go by itself once it held."""

    if not by.strip():
        raise InputError("--by: name who resets the taint budget (it is recorded)")
    status = TaintBudget(connect(cluster)).reset(by.strip())
    emit(status, output, lambda s: print(f"taint budget reset by {s.reset_by} at {s.reset_at}"))


def _breaker_table(s: Any) -> None:
    row = [s.state, s.tripped_at, s.tripped_reason, ", ".join(sorted(s.admitted)), s.reset_at, s.reset_by]
    print_table(None, ["state", "tripped at", "reason", "in window", "reset at", "reset by"], [row])


def breaker_status_cmd(
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster spec (default $DSX_CLUSTER, kube)."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Print whether the breaker is open, since when and why, and the nodes in its window."""

    status = Breaker(connect(cluster)).status()
    emit(status, output, _breaker_table)


def breaker_reset_cmd(
    by: str = typer.Option(..., "--by", help="Who resets it (recorded)."),
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster spec (default $DSX_CLUSTER, kube)."),
    output: OutputFormat = OUTPUT_OPTION,
    resubmit: bool = typer.Option(
        True,
        "--resubmit/--no-resubmit",
        help="Then start dsx-remediate again for the nodes it refused (a reconciler pass).",
    ),
) -> None:
    """Close the breaker and empty its window (it never closes by itself once tripped); then, unless
    --no-resubmit, a reconciler pass re-submits the nodes it refused."""

    if not by.strip():
        raise InputError("--by: name who resets the breaker (it is recorded)")
    status = Breaker(connect(cluster)).reset(by.strip())
    emit(status, output, lambda s: print(f"breaker closed by {s.reset_by} at {s.reset_at}"))
    if resubmit:  # the nodes it refused are tainted with no state: the reconciler starts them again
        raise typer.Exit(reconcile_now(cluster, by=f"dsx sentinel breaker reset --by {by.strip()}", err=True))


def _against(seen: int, count: int, within_minutes: float, fired: bool) -> list[str]:
    """A history rule's columns: what it saw within its window against its count, and whether it fired."""
    return [f"{seen} of {count} within {within_minutes:g} min", "fired" if fired else "-"]


def _history_table(h: NodeHistory) -> None:
    source = h.state_file or "no state file of this boot (the agent keeps none, or has not run)"
    print(f"{h.node}, boot {h.boot_id or '-'}: XID counts from {source}")
    rows = [[x.pci, x.code, x.rule, *_against(x.lines, x.count, x.within_minutes, x.fired)] for x in h.xid]
    if rows:
        print_table(
            "XID history (kernel-log lines per GPU and code)", ["GPU", "XID", "rule", "lines", ""], rows
        )
    else:
        print("no XID a history rule counts")
    ports = [
        [p.port, p.counter, p.rule, *_against(p.grown, p.count, p.within_minutes, p.fired)] for p in h.ports
    ]
    if ports:
        print_table(
            "Port history (counter growth per fabric port)", ["port", "counter", "rule", "grown", ""], ports
        )
    if h.lemon is None:
        print("no lemon rule")
        return
    verdict = "fired: the next remediation asks for its replacement" if h.lemon_fired else "not fired"
    print(
        f"remediations that returned it to service within {h.lemon.within_days:g} days: {len(h.returned)} "
        f"of {h.lemon.count} (lemon rule {verdict})"
    )
    for r in h.returned:
        print(f"  {r.at}  {r.workflow or '-'}")


def history_cmd(
    node: str = typer.Argument(..., help="The node."),
    state_dir: Path | None = typer.Option(
        None,
        "--state-dir",
        envvar=vocab.ENV_SENTINEL_STATE_DIR,
        help="The agent's state directory on this node (default: none: no XID counts).",
    ),
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster spec (default $DSX_CLUSTER, kube)."),
    overrides: Path | None = OVERRIDES_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Show what the fault history rules see of NODE now: from the agent's state file on this node,
    the kernel log's XID lines per GPU and code within each rule's window, and which rule fired; from
    the ledger, the remediations that returned it to service within the lemon rule's window. Run it on
    the node (in its sentinel pod) for the XID counts."""

    history = _catalogue(overrides).history
    boot_id, state_file, counts, ports = "", "", [], []
    if state_dir is not None:
        boot = Boot.read()
        if boot is None:
            raise InputError("--state-dir: this boot's id cannot be read (/proc/sys/kernel/random/boot_id)")
        boot_id = boot.id
        state = StateFile(state_dir, node, boot.id)
        data = state.load()
        if data is not None and isinstance(data.get("xid_history"), dict):
            xids = XidHistory(history.xid)
            try:
                xids.restore(data["xid_history"])
            except ValueError as exc:
                raise InputError(f"{state.path}: {exc}") from None
            state_file, counts = str(state.path), xids.counts(dt.datetime.now(dt.UTC).timestamp())
        if data is not None and "counters" in data:
            rates = CounterRates()
            try:
                rates.restore(data["counters"])
            except ValueError as exc:
                raise InputError(f"{state.path}: {exc}") from None
            state_file, ports = (
                str(state.path),
                port_counts(history.nic, rates, dt.datetime.now(dt.UTC).timestamp()),
            )
    lemon = history.lemon
    entries = ledger.entries(connect(cluster), node)
    now = dt.datetime.now(dt.UTC)
    returned = returns_within(entries, lemon.within_days, now) if lemon is not None else []
    result = NodeHistory(
        node=node,
        boot_id=boot_id,
        state_file=state_file,
        xid=counts,
        ports=ports,
        returned=[Returned(at=e.at, workflow=e.workflow) for e in returned],
        lemon=lemon,
        lemon_fired=lemon is not None and len(returned) >= lemon.count,
    )
    emit(result, output, _history_table)


def register(app: typer.Typer) -> None:
    """Add the ``sentinel`` command group and its ``breaker`` and ``budget`` subgroups."""
    group = typer.Typer(
        name="sentinel",
        help="The per-node health agent: NVML, kernel log and sysfs probes, the fault catalogue.",
        no_args_is_help=True,
    )
    group.command("catalog")(catalog_cmd)
    group.command("probe")(probe_cmd)
    group.command("agent")(agent_cmd)
    group.command("history")(history_cmd)
    group.command("reconcile")(reconcile_cmd)
    breaker = typer.Typer(
        name="breaker",
        help="The quarantine circuit breaker (ConfigMap dsx-quarantine-breaker): status, reset.",
        no_args_is_help=True,
    )
    breaker.command("status")(breaker_status_cmd)
    breaker.command("reset")(breaker_reset_cmd)
    group.add_typer(breaker, name="breaker")
    budget = typer.Typer(
        name="budget",
        help="The agents' fleet-wide taint budget (ConfigMap dsx-taint-budget): status, reset.",
        no_args_is_help=True,
    )
    budget.command("status")(budget_status_cmd)
    budget.command("reset")(budget_reset_cmd)
    group.add_typer(budget, name="budget")
    app.add_typer(group, name="sentinel")

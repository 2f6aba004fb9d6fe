"""The error counters NVML and sysfs keep, judged as rates: a counter climbing past its catalogue
threshold within the hour turns a healthy reading degraded, with its condition, Event and metric; a
large lifetime total that no longer grows does not. Through the whole agent, over a fake NVML and a
fake sysfs tree, with a clock the test moves."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pynvml
import pytest

from steps.cluster import RetryPolicy, load_fleet
from steps.cluster import vocabulary as vocab
from steps.cluster.sim import MemoryStore, SimCluster
from steps.sentinel.agent import Agent
from steps.sentinel.catalogue import load_catalogue
from steps.sentinel.kernel_log import Boot
from steps.sentinel.node import Sentinel, build_sentinel
from steps.sentinel.probes import NodeProbes
from steps.sentinel.rates import CounterRates
from tests.steps.sentinel.fake_nvml import FakeGpu, FakeNvml, gpus

FAST = RetryPolicy(attempts=2, base_delay=0.0, max_delay=0.0, jitter=0.0)
NODE = "node-01"
START = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


# ------------------------------------------------------------------------------- the rates alone


def test_no_rate_until_a_counter_was_watched_for_the_minimum_span() -> None:
    rates = CounterRates(window_s=3600, min_span_s=60)
    assert rates.observe("c", 10_000, 0.0) is None  # a lifetime total says nothing
    assert rates.observe("c", 10_050, 30.0) is None  # a burst two readings apart is not extrapolated
    rate = rates.observe("c", 10_060, 600.0)
    assert rate is not None and rate.increase == 60 and rate.per_hour == pytest.approx(360.0)
    assert rate.words() == "60 in the last 10 min"


def test_growth_older_than_the_window_no_longer_counts() -> None:
    rates = CounterRates(window_s=3600, min_span_s=60)
    for minute, value in ((0, 0), (10, 500), (20, 500), (90, 500), (100, 500)):
        rate = rates.observe("c", value, minute * 60.0)
    assert rate is not None and rate.increase == 0  # the burst of minute 10 is out of the last hour
    assert rates.observe("c", 530, 110 * 60.0).increase == 30  # type: ignore[union-attr]


def test_a_counter_that_goes_down_was_reset_and_counts_again_from_there() -> None:
    rates = CounterRates(window_s=3600, min_span_s=60)
    rates.observe("c", 9_000, 0.0)
    assert rates.observe("c", 3, 600.0) is None  # a driver reload: watched for 0 s since
    rate = rates.observe("c", 13, 1200.0)
    assert rate is not None and rate.increase == 10


def test_a_snapshot_restores_the_same_history_and_nonsense_is_refused() -> None:
    rates = CounterRates()
    for at, value in ((0.0, 5), (30.0, 5), (300.0, 9)):
        rates.observe(("GPU-1", "pcie-replays"), value, at)
    again = CounterRates()
    again.restore(json.loads(json.dumps(rates.snapshot())))  # as the state file holds it
    assert again.snapshot() == rates.snapshot() == [[["GPU-1", "pcie-replays"], 0.0, [[0.0, 5], [300.0, 9]]]]
    assert again.observe(("GPU-1", "pcie-replays"), 12, 600.0) == rates.observe(
        ("GPU-1", "pcie-replays"), 12, 600.0
    )
    for nonsense in ([["x"]], [[["k"], 0.0, []]], "text", [[["k"], "soon", [[0, 1]]]]):
        with pytest.raises(ValueError, match="not a counter history snapshot"):
            CounterRates().restore(nonsense)


# --------------------------------------------------------------------------------- the agent


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> dt.datetime:
        return self.now


@dataclass
class Signal:
    """A counter (or state) to move, and what the agent must then say."""

    name: str
    check: str
    code: str
    start: Callable[[list[FakeGpu], Path], None]
    climb: Callable[[list[FakeGpu], Path], None]
    entity: str


def _counter(root: Path, port: str, name: str, value: int) -> None:
    path = root / "class/infiniband" / port.split("/")[0] / "ports" / port.split("/")[1] / "counters" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def _fabric(root: Path) -> None:
    """Eight healthy 400 Gb/s InfiniBand rails, their counters at lifetime totals."""
    for i in range(8):
        port = root / "class/infiniband" / f"mlx5_{i}" / "ports/1"
        port.mkdir(parents=True, exist_ok=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
        for name, value in (
            ("link_downed", 7),
            ("symbol_error", 4_000),
            ("excessive_buffer_overrun_errors", 90),
        ):
            _counter(root, f"mlx5_{i}/1", name, value)


def _aer(root: Path, index: int, kind: str, total: int) -> None:
    """GPU ``index``'s AER file ``aer_dev_KIND`` as the kernel writes it, its total ``total``."""
    device = root / "bus/pci/devices" / f"0000:{0x18 + 0x10 * index:02x}:00.0"
    device.mkdir(parents=True, exist_ok=True)
    name = {"correctable": "COR", "nonfatal": "NONFATAL", "fatal": "FATAL"}[kind]
    first = "RxErr" if kind == "correctable" else "Undefined"
    (device / f"aer_dev_{kind}").write_text(f"{first} {total}\nBadTLP 0\nTOTAL_ERR_{name} {total}\n")


def _aer_set(index: int, kind: str, total: int) -> Callable[[list[FakeGpu], Path], None]:
    return lambda devices, root: _aer(root, index, kind, total)


def _set(index: int, **values: object) -> Callable[[list[FakeGpu], Path], None]:
    def apply(devices: list[FakeGpu], root: Path) -> None:
        for key, value in values.items():
            setattr(devices[index], key, value)

    return apply


def _port(name: str, value: int) -> Callable[[list[FakeGpu], Path], None]:
    return lambda devices, root: _counter(root, "mlx5_3/1", name, value)


# Each rate signal starts from a large lifetime total (healthy) and grows, twenty minutes after the
# first reading, by just more than its hourly threshold's worth of twenty minutes.
BUFFERS = "excessive_buffer_overrun_errors"
SIGNALS = [
    Signal("pcie-replays", "pcie", "replay-rate",
           _set(2, pcie_replays=10_000), _set(2, pcie_replays=10_161), "GPU-fake-2"),
    Signal("ecc-corrected", "ecc", "correctable-rate",
           _set(4, corrected_ecc=5_000), _set(4, corrected_ecc=5_201), "GPU-fake-4"),
    Signal("nvlink-crc", "nvlink", "crc-rate",
           _set(1, crc={3: 10**6}), _set(1, crc={3: 10**6 + 120_001}), "GPU-fake-1"),
    Signal("nvlink-replays", "nvlink", "error-rate",
           _set(5, replays={7: 40}, recoveries={7: 2}),
           _set(5, replays={7: 58}, recoveries={7: 5}), "GPU-fake-5"),
    Signal("aer-correctable", "pcie", "aer-correctable-rate",
           _aer_set(3, "correctable", 500), _aer_set(3, "correctable", 521), "GPU-fake-3"),
    Signal("aer-nonfatal", "pcie", "aer-nonfatal-rate",
           _aer_set(3, "nonfatal", 4), _aer_set(3, "nonfatal", 5), "GPU-fake-3"),
    Signal("ib-link-downed", "nic", "link-downed-rate",
           _port("link_downed", 7), _port("link_downed", 8), "mlx5_3/1"),
    Signal("ib-symbol-errors", "nic", "symbol-error-rate",
           _port("symbol_error", 4_000), _port("symbol_error", 4_034), "mlx5_3/1"),
    Signal("ib-buffer-overruns", "nic", "buffer-overrun-rate",
           _port(BUFFERS, 90), _port(BUFFERS, 94), "mlx5_3/1"),
]  # fmt: skip


def _agent(
    devices: list[FakeGpu],
    root: Path,
    clock: Clock,
    overrides: Path | None = None,
    port: SimCluster | None = None,
    state: Path | None = None,
    boot: Boot | None = None,
) -> tuple[Sentinel, SimCluster]:
    """The agent of :data:`NODE` over a fake NVML of ``devices`` and the sysfs tree under ``root``; with
    ``state``, keeping its state there (one boot) as the DaemonSet's agent does."""
    port = port or SimCluster(MemoryStore(load_fleet("sim:nodes=2,gpu=h100,workloads=false")), retry=FAST)
    sentinel = build_sentinel(
        port,
        NODE,
        load_catalogue(overrides=overrides),
        source="nvml",
        nvml_module=FakeNvml(devices),
        sysfs=str(root),
        clock=clock,
        state_dir=state,
        boot=boot or Boot("0b5c1e7a-0000-4000-8000-000000000002", START.timestamp() - 3600),
    )
    return sentinel, port


@pytest.mark.parametrize("signal", SIGNALS, ids=[s.name for s in SIGNALS])
def test_a_counter_climbing_past_its_threshold_turns_its_reading_degraded(
    signal: Signal, tmp_path: Path
) -> None:
    devices, clock = gpus(8), Clock()
    _fabric(tmp_path)
    signal.start(devices, tmp_path)
    sentinel, port = _agent(devices, tmp_path, clock)
    assert sentinel.run_once().changed == []  # a lifetime total, however large, is no fault
    clock.now += dt.timedelta(minutes=10)
    assert sentinel.run_once().changed == []  # it did not grow
    clock.now += dt.timedelta(minutes=10)
    signal.climb(devices, tmp_path)
    (event,) = sentinel.run_once().changed
    assert (event.check, event.entity, event.code, event.severity, event.healthy) == (
        signal.check, signal.entity, signal.code, "degraded", False,
    )  # fmt: skip
    assert "in the last 20 min" in event.message and "an hour allowed" in event.message
    node = port.get_node(NODE)
    assert node.condition(vocab.CONDITION_SENTINEL[signal.check]).status == "True"
    assert not node.has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")  # degraded: no taint
    metrics = sentinel.agent.metrics.exposition().decode()
    assert f'dsx_sentinel_unhealthy{{check="{signal.check}"' in metrics
    # the counter stops growing: an hour later the growth is out of the window, the reading healthy
    clock.now += dt.timedelta(minutes=70)
    (cleared,) = sentinel.run_once().changed
    assert (cleared.check, cleared.entity, cleared.healthy) == (signal.check, signal.entity, True)


def test_growth_below_the_threshold_stays_healthy(tmp_path: Path) -> None:
    devices, clock = gpus(8), Clock()
    _fabric(tmp_path)
    sentinel, _ = _agent(devices, tmp_path, clock)
    sentinel.run_once()
    clock.now += dt.timedelta(minutes=20)
    devices[2].pcie_replays = 150  # 450 an hour, under 480
    devices[5].replays = {7: 19}  # 57 an hour, under 60
    _counter(tmp_path, "mlx5_3/1", "symbol_error", 4_033)  # 99 an hour, under 100
    assert sentinel.run_once().changed == []


def test_an_override_moves_a_rate_threshold(tmp_path: Path) -> None:
    devices, clock = gpus(8), Clock()
    _fabric(tmp_path)
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(
        "apiVersion: dsx.dev/v1alpha1\nkind: FaultOverrides\n"
        "entries:\n  - {check: pcie, code: replay-rate, threshold: 100}\n"
    )
    sentinel, _ = _agent(devices, tmp_path, clock, overrides)
    sentinel.run_once()
    clock.now += dt.timedelta(minutes=20)
    devices[2].pcie_replays = 40  # 120 an hour: over the fleet's 100, under the default 480
    (event,) = sentinel.run_once().changed
    assert (event.code, event.severity) == ("replay-rate", "degraded")


def test_the_hardware_slowdown_signal_is_a_degraded_thermal_reading(tmp_path: Path) -> None:
    devices, clock = gpus(8), Clock()
    devices[6].reasons = pynvml.nvmlClocksThrottleReasonHwSlowdown
    sentinel, port = _agent(devices, tmp_path, clock)
    (event,) = sentinel.run_once().changed
    assert (event.check, event.entity, event.code, event.severity) == (
        "thermal", "GPU-fake-6", "hw-slowdown", "degraded",
    )  # fmt: skip
    assert port.get_node(NODE).condition(vocab.CONDITION_SENTINEL["thermal"]).status == "True"


def test_nvml_and_sysfs_give_the_counters(tmp_path: Path) -> None:
    from steps.sentinel.nvml import NvmlSource
    from steps.sentinel.sysfs import read_nics

    devices = gpus(2)
    devices[1].pcie_replays, devices[1].corrected_ecc, devices[1].corrected_ecc_aggregate = 12, 3, 40
    devices[1].crc, devices[1].replays, devices[1].recoveries = {0: 5}, {0: 6}, {1: 7}
    report = NvmlSource(FakeNvml(devices), NODE).node_report(NODE)
    gpu = report.gpus[1]
    assert (gpu.pcie_replays, gpu.ecc_correctable, gpu.ecc_correctable_aggregate) == (12, 3, 40)
    assert [(k.crc_errors, k.replay_errors, k.recovery_errors) for k in gpu.nvlinks[:2]] == [
        (5, 6, 0),
        (0, 0, 7),
    ]
    _fabric(tmp_path)
    (tmp_path / "class/infiniband/mlx5_7/ports/1/counters/symbol_error").unlink()  # a RoCE device's gap
    nics = {n.name: n for n in read_nics(tmp_path)}
    first = nics["mlx5_0/1"]
    assert (first.link_downed, first.symbol_errors, first.buffer_overruns) == (7, 4_000, 90)
    assert nics["mlx5_7/1"].symbol_errors is None


def test_the_readme_lists_every_signal_with_the_catalogues_severity_action_and_threshold() -> None:
    from tests.paths import REPO

    readme = (REPO / "README.md").read_text()
    header = "| check | code | source | severity | action | threshold |"
    assert header in readme
    rows = {}
    for line in readme.split(header, 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        check, code, _, severity, action, threshold = (cell.strip() for cell in line.strip("|").split("|"))
        rows[(check, code)] = (severity, action, threshold)
    catalogue = load_catalogue()
    shipped = {(e.check, e.code) for e in catalogue.entries() if e.check not in ("xid", "sxid")}
    assert shipped == {key for key in rows if key[0] not in ("xid", "sxid")}
    assert {("xid", "each code"), ("sxid", "each code")} <= set(rows)
    for check, code in shipped:
        rule = catalogue.rule(check, code)
        severity, action, threshold = rows[(check, code)]
        assert (severity, action) == (rule.severity, rule.action), (check, code)
        number = threshold.split()[0] if threshold else None
        assert number == (None if rule.threshold is None else f"{rule.threshold:g}"), (check, code, threshold)


@pytest.mark.parametrize(
    ("fabric", "code", "severity"),
    [((3, 0), None, None), ((2, 0), "fabric-not-ready", "degraded"), ((3, 7), "fabric-failed", "fatal")],
    ids=["completed", "in-progress", "failed"],
)
def test_the_nvlink_fabric_registration_is_read_where_nvml_reports_one(
    fabric: tuple[int, int], code: str | None, severity: str | None, tmp_path: Path
) -> None:
    devices, clock = gpus(8), Clock()
    devices[0].fabric = fabric  # the others: not supported, as on a machine with no NVSwitch fabric
    sentinel, port = _agent(devices, tmp_path, clock)
    changed = sentinel.run_once().changed
    if code is None:
        assert changed == []
        return
    (event,) = changed
    assert (event.check, event.entity, event.code, event.severity) == ("nvlink", "GPU-fake-0", code, severity)
    assert port.get_node(NODE).has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule") is (severity == "fatal")


def test_a_fatal_pcie_aer_error_this_boot_is_fatal_at_once(tmp_path: Path) -> None:
    devices, clock = gpus(8), Clock()
    _aer(tmp_path, 5, "fatal", 1)
    sentinel, port = _agent(devices, tmp_path, clock)
    (event,) = sentinel.run_once().changed
    assert (event.check, event.entity, event.code, event.severity, event.action) == (
        "pcie", "GPU-fake-5", "aer-fatal", "fatal", "reboot",
    )  # fmt: skip
    assert port.get_node(NODE).has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")


def test_aer_counters_are_read_by_the_gpus_pci_address(tmp_path: Path) -> None:
    from steps.sentinel.sysfs import read_aer, sysfs_pci

    assert sysfs_pci("00000000:1B:00.0") == "0000:1b:00.0" and sysfs_pci("nonsense") == ""
    _aer(tmp_path, 0, "correctable", 12)
    (tmp_path / "bus/pci/devices/0000:18:00.0/aer_dev_fatal").write_text("Undefined 0\nDLP 2\n")  # no TOTAL
    assert read_aer(tmp_path, "00000000:18:00.0") == {
        "aer_correctable": 12,
        "aer_nonfatal": None,
        "aer_fatal": 2,
    }
    assert read_aer(tmp_path, "00000000:28:00.0") == dict.fromkeys(
        ("aer_correctable", "aer_nonfatal", "aer_fatal")
    )


def test_uncorrectable_ecc_errors_say_whether_they_are_in_sram_or_dram(tmp_path: Path) -> None:
    devices, clock = gpus(8), Clock()
    devices[1].volatile_ecc, devices[1].sram_ecc = 3, 2
    devices[2].volatile_ecc = 1  # NVML does not split them on this GPU
    sentinel, _ = _agent(devices, tmp_path, clock)
    messages = {e.entity: e.message for e in sentinel.run_once().changed if e.check == "ecc"}
    assert messages["GPU-fake-1"].endswith("3 uncorrectable ECC errors (2 in SRAM, 1 in DRAM)")
    assert messages["GPU-fake-2"].endswith("1 uncorrectable ECC errors")


def test_a_restarted_agent_keeps_a_climbing_rate_and_its_condition(tmp_path: Path) -> None:
    """The counters' last hour is in the agent's state file: the restarted agent's first pass neither
    clears the degraded reading (it would have no rate for a minute) nor loses the growth."""
    devices, clock, state = gpus(8), Clock(), tmp_path / "state"
    sentinel, port = _agent(devices, tmp_path, clock, state=state)
    sentinel.run_once()
    clock.now += dt.timedelta(minutes=20)
    devices[2].pcie_replays = 200  # 600 an hour
    (event,) = sentinel.run_once().changed
    assert (event.code, event.healthy) == ("replay-rate", False)
    restarted, _ = _agent(devices, tmp_path, clock, port=port, state=state)
    clock.now += dt.timedelta(seconds=10)
    assert restarted.run_once().changed == []  # still degraded: nothing to write
    assert port.get_node(NODE).condition(vocab.CONDITION_SENTINEL["pcie"]).status == "True"


def test_a_port_that_goes_on_flapping_is_degraded_then_fatal_by_the_history_rule(tmp_path: Path) -> None:
    """recipes/faults/history.yaml's flapping-port: six link-downs within the hour make the port's reading
    fatal (tainted, remediated); the catalogue's link-downed-rate had made it degraded at the first ones."""
    devices, clock = gpus(8), Clock()
    _fabric(tmp_path)  # mlx5_3/1's link_downed at 7 over its life
    sentinel, port = _agent(devices, tmp_path, clock)
    sentinel.run_once()
    seen: list[tuple[str, str]] = []
    for downs in range(1, 7):
        clock.now += dt.timedelta(minutes=5)
        _counter(tmp_path, "mlx5_3/1", "link_downed", 7 + downs)
        seen += [(e.severity, e.message) for e in sentinel.run_once().changed]
    assert [severity for severity, _ in seen] == ["degraded", "fatal"]
    assert seen[-1][1].endswith("(6 times within 60 min: history rule flapping-port)")
    assert port.get_node(NODE).has_taint(vocab.TAINT_UNHEALTHY, "NoSchedule")


def test_dsx_sentinel_history_shows_each_ports_counter_against_the_port_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.cli import dsx_here

    this_boot = Boot.read()
    assert this_boot is not None
    devices, clock, state = gpus(8), Clock(), tmp_path / "state"
    clock.now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=35)
    _fabric(tmp_path)
    sentinel, _ = _agent(devices, tmp_path, clock, state=state, boot=this_boot)
    sentinel.run_once()
    for downs in range(1, 7):  # six link-downs on mlx5_3/1, five minutes apart, the last 5 min ago
        clock.now += dt.timedelta(minutes=5)
        _counter(tmp_path, "mlx5_3/1", "link_downed", 7 + downs)
        sentinel.run_once()
    args = ("sentinel", "history", NODE, "--state-dir", str(state), "--cluster", "sim:nodes=2,gpu=h100")
    code, out, err = dsx_here(capsys, *args, "-o", "json")
    assert code == 0, err
    ports = {(p["port"], p["counter"]): (p["grown"], p["fired"]) for p in json.loads(out)["ports"]}
    assert ports[("mlx5_3/1", "link_downed")] == (6, True)
    assert ports[("mlx5_0/1", "link_downed")] == (0, False)
    code, table, _ = dsx_here(capsys, *args)
    assert code == 0 and "6 of 6 within 60 min" in table and "flapping-port" in table


# ------------------------------------------------------------------------------- node-problem-detector


def test_node_problem_detectors_conditions_on_the_node_are_read_as_sentinel_findings(tmp_path: Path) -> None:
    """The agent reads its node (every pass here): a condition of NPD's the catalogue lists, True, is the
    node-problem finding with NPD's reason and message; False clears it; a condition NPD writes that the
    catalogue does not list, or one Unknown, says nothing."""
    port = SimCluster(MemoryStore(load_fleet("sim:nodes=2,gpu=h100,workloads=false")), retry=FAST)
    catalogue = load_catalogue()
    probes = NodeProbes(NODE, catalogue, port, lambda: dt.datetime.now(dt.UTC), 8)
    sentinel = Sentinel(
        Agent(NODE, port, probes.probes(), catalogue, probe_timeout=None, node_read_s=0), probes, None
    )
    condition = vocab.CONDITION_SENTINEL["node-problem"]
    sentinel.run_once()
    port.set_condition(NODE, "NTPProblem", True, "NTPIsDown", "ntp service is not running")
    port.set_condition(
        NODE, "ReadonlyFilesystem", False, "FilesystemIsNotReadOnly", "Filesystem is not read-only"
    )
    sentinel.run_once()
    sentinel.run_once()
    assert port.get_node(NODE).condition(condition) is None  # nothing to say yet

    said = "task docker:7 blocked for more than 300 seconds."
    port.set_condition(NODE, "KernelDeadlock", True, "DockerHung", said)
    sentinel.run_once()  # the pass reads the node after its probes ...
    (finding,) = sentinel.run_once().changed  # ... and the next one reads its conditions
    assert (finding.check, finding.entity, finding.code, finding.severity, finding.action) == (
        "node-problem", "KernelDeadlock", "KernelDeadlock", "fatal", "reboot",
    )  # fmt: skip
    assert finding.message == f"node-problem-detector: KernelDeadlock (DockerHung): {said}"
    node = port.get_node(NODE)
    assert node.condition(condition).status == "True"  # type: ignore[union-attr]
    assert node.has_taint(vocab.TAINT_UNHEALTHY, vocab.TAINT_UNHEALTHY_EFFECT)

    port.set_condition(NODE, "KernelDeadlock", False, "KernelHasNoDeadlock", "kernel has no deadlock")
    sentinel.run_once()
    (cleared,) = sentinel.run_once().changed
    assert cleared.healthy and port.get_node(NODE).condition(condition).status == "False"  # type: ignore[union-attr]

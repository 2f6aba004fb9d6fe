"""The kernel-log parser, the sysfs NIC reader and the NVML adapter over a fake pynvml."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from steps.sentinel.kernel_log import Boot, KernelLog, normalise_pci, parse_lines
from steps.sentinel.nvml import NvmlSource, NvmlUnavailableError
from steps.sentinel.sysfs import read_nics
from tests.steps.sentinel.fake_nvml import FakeNvml, gpus

LINES = [
    # dmesg
    "[ 1234.567890] NVRM: Xid (PCI:0000:1b:00): 79, pid=1901, name=python, GPU has fallen off the bus.",
    # dmesg -T
    "[Mon Mar  3 12:00:01 2025] NVRM: Xid (PCI:0000:2B:00): 48, pid=2, name=x, "
    "An uncorrectable double bit error",
    # journalctl -k
    "Mar 03 12:00:02 gpu-7 kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=3, Graphics Exception",
    # /dev/kmsg record as read raw
    "4,1021,5678901,-;NVRM: Xid (0000:4b:00): 154, GPU recovery action changed from 0x0 (None) "
    "to 0x1 (GPU Reset Required)",
    "Mar 03 12:00:03 gpu-7 kernel: nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, "
    "Link 32 egress",
    "Mar 03 12:00:04 gpu-7 kernel: NVRM: Xid (PCI:0000:1b:00): unreadable garbage",
    "Mar 03 12:00:05 gpu-7 kernel: eth0: link up",
    # the driver's own line for a lost GPU, which may come without its Xid 79
    "Mar 03 12:00:06 gpu-7 kernel: NVRM: GPU 0000:5B:00.0: GPU has fallen off the bus.",
    "Mar 03 12:00:07 gpu-7 kernel: usb 1-1: device fallen off the bus",
]


def test_every_log_format_parses_and_bad_lines_are_counted() -> None:
    result = parse_lines(LINES)
    assert [(x.kind, x.pci, x.code) for x in result.xids] == [
        ("xid", "0000:1b:00", 79),
        ("xid", "0000:2b:00", 48),
        ("xid", "0000:3b:00", 13),
        ("xid", "0000:4b:00", 154),
        ("sxid", "0000:05:00", 12028),
        ("xid", "0000:5b:00", 79),
    ]
    assert result.xids[0].message.endswith("GPU has fallen off the bus.")
    assert result.xids[-1].message == "GPU has fallen off the bus"
    assert result.bad_lines == 1


def test_nvml_and_kernel_pci_addresses_meet() -> None:
    assert normalise_pci("00000000:1B:00.0") == normalise_pci("PCI:0000:1b:00") == "0000:1b:00"
    assert normalise_pci("nonsense") == ""


LONG_AGO = Boot("0b5c1e7a-0000-4000-8000-000000000001", 0.0)
"""A boot older than every line of :data:`LINES`: each of them is this boot's."""


def test_a_log_file_is_read_incrementally_and_a_partial_line_waits(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(LINES[0] + "\n" + LINES[2][:30])
    reader = KernelLog(log, LONG_AGO)
    assert [x.code for x in reader.read().xids] == [79]
    with log.open("a") as handle:
        handle.write(LINES[2][30:] + "\n")
    assert [x.code for x in reader.read().xids] == [13]
    assert [x.code for x in reader.xids] == [79, 13]


# ------------------------------------------------------------------ the kernel log from this boot

NOW = time.time()
BOOT = Boot("5c1e7a2b-93d4-4f1e-8a6b-0c9d8e7f6a5b", NOW - 3600)  # up for an hour
OLD_XID = "NVRM: Xid (PCI:0000:18:00): 79, pid=1901, name=python, GPU has fallen off the bus."
NEW_XID = "NVRM: Xid (PCI:0000:38:00): 79, pid=77, name=python, GPU has fallen off the bus."


def _traditional(t: float) -> str:
    """rsyslog's RSYSLOG_TraditionalFileFormat stamp (local time, no year), as Ubuntu up to 23.04 writes."""
    return dt.datetime.fromtimestamp(t).strftime("%b %e %H:%M:%S")


def _rfc3339(t: float) -> str:
    """rsyslog's RSYSLOG_FileFormat stamp, Ubuntu's default since 23.10."""
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="microseconds")


def _kern_log(stamp: Callable[[float], str], *, new_boot: bool = True, marker: bool = True) -> list[str]:
    """A kern.log over two boots: the last one (ours, when ``new_boot``) began at BOOT.time."""
    old_boot = BOOT.time - 2 * 86400
    lines = [
        f"{stamp(old_boot + 20)} gpu-7 kernel: [    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02)",
        f"{stamp(old_boot + 90)} gpu-7 kernel: [   70.120000] eth0: link up",
        f"{stamp(BOOT.time - 600)} gpu-7 kernel: [172180.5] {OLD_XID}",
        f"{stamp(BOOT.time - 300)} gpu-7 kernel: [172480.1] reboot: Restarting system",
    ]
    if new_boot:
        if marker:
            lines.append(
                f"{stamp(BOOT.time + 25)} gpu-7 kernel: [    0.000000] Linux version 6.8.0-45-generic"
            )
        lines.append(f"{stamp(BOOT.time + 900)} gpu-7 kernel: [  875.250000] {NEW_XID}")
    return lines


@pytest.mark.parametrize("stamp", [_traditional, _rfc3339], ids=["traditional", "rfc3339"])
def test_a_kern_log_over_two_boots_gives_only_this_boots_xids(
    tmp_path: Path, stamp: Callable[[float], str]
) -> None:
    log = tmp_path / "kern.log"
    log.write_text("\n".join(_kern_log(stamp)) + "\n")
    reader = KernelLog(log, BOOT, clock=lambda: NOW)
    assert [(x.pci, x.code) for x in reader.read().xids] == [("0000:38:00", 79)]
    assert reader.earlier_boot_lines == 1
    # no boot marker (the file rotated after the boot): the stamps alone say which boot
    log.write_text("\n".join(_kern_log(stamp, marker=False)) + "\n")
    assert [x.pci for x in KernelLog(log, BOOT, clock=lambda: NOW).read().xids] == ["0000:38:00"]
    # rebooted, and nothing of this boot written yet: the old XID is no XID of this boot
    log.write_text("\n".join(_kern_log(stamp, new_boot=False)) + "\n")
    reader = KernelLog(log, BOOT, clock=lambda: NOW)
    assert reader.read().xids == [] and reader.xids == []
    with log.open("a") as handle:  # then this boot's lines arrive
        handle.write("\n".join(_kern_log(stamp)[4:]) + "\n")
    assert [x.pci for x in reader.read().xids] == ["0000:38:00"]


def test_journalctl_boot_separators_and_the_kernel_clock_say_the_boot(tmp_path: Path) -> None:
    log = tmp_path / "journal.log"
    log.write_text(
        "-- Boot 0123456789abcdef0123456789abcdef --\n"
        f"Mar 03 12:00:02 gpu-7 kernel: {OLD_XID}\n"
        f"-- Boot {BOOT.journal_id} --\n"
        f"Mar 03 12:00:02 gpu-7 kernel: {NEW_XID}\n"  # the stamp is old, the boot id says ours
    )
    assert [x.pci for x in KernelLog(log, BOOT, clock=lambda: NOW).read().xids] == ["0000:38:00"]
    # `dmesg -w >> file` across a reboot: seconds since boot start again; beyond this uptime is earlier
    log.write_text(
        f"[    0.000000] Linux version 6.8.0\n[ 5000.1] {OLD_XID}\n[    0.000000] x\n[ 875.2] {NEW_XID}\n"
    )
    assert [x.pci for x in KernelLog(log, BOOT, clock=lambda: NOW).read().xids] == ["0000:38:00"]


def test_a_rotated_kern_log_is_finished_and_a_snapshot_resumes_where_it_stopped(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("\n".join(_kern_log(_rfc3339)) + "\n")
    reader = KernelLog(log, BOOT, clock=lambda: NOW)
    reader.read()
    with log.open("a") as handle:  # written, then logrotate moves the file before the next read
        handle.write(
            f"{_rfc3339(NOW - 5)} gpu-7 kernel: [ 3595.0] NVRM: Xid (PCI:0000:28:00): 13, pid=5, x\n"
        )
    log.rename(tmp_path / "kern.log.1")
    log.write_text(f"{_rfc3339(NOW)} gpu-7 kernel: [ 3600.0] NVRM: Xid (PCI:0000:48:00): 31, pid=6, y\n")
    assert [x.code for x in reader.read().xids] == [13, 31]
    resumed = KernelLog(log, BOOT, clock=lambda: NOW)
    assert resumed.restore(reader.snapshot())
    assert resumed.read().xids == []  # nothing new: nothing read twice
    assert [(x.pci, x.code) for x in resumed.xids] == [(x.pci, x.code) for x in reader.xids]
    assert not KernelLog(tmp_path / "other.log", BOOT).restore(reader.snapshot())  # another log's


def test_an_xid_repeated_word_for_word_is_kept_once(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text((LINES[0] + "\n") * 50 + LINES[0].replace("pid=1901", "pid=1902") + "\n")
    reader = KernelLog(log, LONG_AGO, clock=lambda: NOW)
    assert len(reader.read().xids) == 2  # what it newly kept; every line is counted
    assert [x.message.split(",")[0] for x in reader.xids] == ["pid=1901", "pid=1902"]
    ((key, (count, first, last)),) = reader.seen.items()
    assert (key[0], key[2], count, first, last) == ("xid", 79, 51, NOW, NOW)


def test_the_boot_is_read_from_proc(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text(BOOT.id + "\n")
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n")
    assert Boot.read(tmp_path) == Boot(BOOT.id, 1700000000.0)
    assert Boot.read(tmp_path / "nothing") is None


def _tree(root: Path) -> None:
    for dev, state, phys, rate in (
        ("mlx5_0", "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)"),
        ("mlx5_1", "1: DOWN", "3: Disabled", "400 Gb/sec (4X NDR)"),
        ("mlx5_2", "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)"),
    ):
        port = root / "class/infiniband" / dev / "ports/1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "phys_state").write_text(phys + "\n")
        (port / "rate").write_text(rate + "\n")
    for name, oper, speed, device in (("eth0", "up", "100000", True), ("lo", "unknown", "", False)):
        iface = root / "class/net" / name
        iface.mkdir(parents=True)
        (iface / "operstate").write_text(oper + "\n")
        (iface / "speed").write_text(speed + "\n")
        (iface / "type").write_text("1\n")
        if device:
            (iface / "device").mkdir()


def test_sysfs_reads_ib_ports_and_physical_ethernet(tmp_path: Path) -> None:
    _tree(tmp_path)
    nics = {n.name: n for n in read_nics(tmp_path)}
    assert set(nics) == {"mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "eth0"}
    assert nics["mlx5_0/1"].up and nics["mlx5_0/1"].speed_gbps == 400
    assert not nics["mlx5_1/1"].up and nics["mlx5_1/1"].phys_state == "Disabled"
    assert nics["eth0"].kind == "ethernet" and nics["eth0"].speed_gbps == 100


def test_nvml_adapter_reads_every_figure_the_probes_need() -> None:
    devices = gpus(8)
    devices[1].links[4] = False
    devices[2].pcie = (4, 5, 8, 16)
    devices[3].lost = True
    devices[4].remap = (0, 1, 1, 0)
    devices[5].reasons = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    devices[6].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    fake = FakeNvml(devices)
    fake.pending_events = [(0, 79), (0, 13)]
    source = NvmlSource(fake, "gpu-7")
    source.start()
    assert source.wait_xids(10) == [(0, 79), (0, 13)]
    report = source.node_report("gpu-7")
    gpu = report.gpus
    assert gpu[0].xids == (79, 13) and gpu[0].pci_bus_id == "00000000:18:00.0"
    assert [link.link for link in gpu[1].nvlinks if not link.active] == [4]
    assert (gpu[2].pcie_generation, gpu[2].pcie_max_generation, gpu[2].pcie_width) == (4, 5, 8)
    assert not gpu[3].healthy
    assert gpu[4].remap_pending and not gpu[4].remap_failed
    assert gpu[5].throttle_reasons == ("hw-thermal",)
    assert gpu[6].reset_required


def test_nvml_that_will_not_initialise_is_its_own_error() -> None:
    source = NvmlSource(FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED), "gpu-7")
    try:
        source.node_report("gpu-7")
    except NvmlUnavailableError as exc:
        assert "did not initialise" in str(exc)
    else:
        raise AssertionError("expected NvmlUnavailableError")


def test_the_catalogue_gives_nvidias_immediate_action_for_the_xids_operators_meet() -> None:
    from steps.sentinel.catalogue import load_catalogue

    catalogue = load_catalogue()
    expected = {  # NVIDIA's resolution bucket (immediate action), as dsx acts on it
        "13": ("info", "restart-app"),  # RESTART_APP
        "31": ("info", "restart-app"),  # RESTART_APP
        "43": ("info", "none"),  # IGNORE
        "45": ("info", "none"),  # WORKFLOW_XID_45: follow the Xid beside it
        "48": ("fatal", "reset-gpu"),  # WORKFLOW_XID_48
        "63": ("info", "none"),  # IGNORE: a row remapped
        "64": ("fatal", "reset-gpu"),  # RESET_GPU: remapping failed
        "74": ("fatal", "reset-gpu"),  # WORKFLOW_NVLINK_ERR
        "79": ("fatal", "reboot"),  # RESTART_BM: fallen off the bus
        "92": ("info", "none"),  # IGNORE
        "94": ("info", "restart-app"),  # RESTART_APP: contained to one application
        "95": ("fatal", "reset-gpu"),  # RESET_GPU: uncontained
        "119": ("fatal", "reset-gpu"),  # RESET_GPU
        "120": ("fatal", "reset-gpu"),  # RESET_GPU
    }
    found = {code: (r.severity, r.action) for code in expected for r in [catalogue.rule("xid", code)]}
    assert found == expected
    reset = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    assert (catalogue.rule("xid", "154", reset).action, catalogue.rule("xid", "154", reset).severity) == (
        "reset-gpu",
        "fatal",
    )
    assert catalogue.rule("xid", "999").action == "contact-support"  # unlisted: the default


@pytest.mark.story
def test_an_xid_storm_is_read_in_bounded_chunks_and_memory(tmp_path: Path) -> None:
    """60,000 lines of an application's MMU faults (Xid 31, each with its own pid and address): each
    read takes what its budget allows, a chunk at a time, and lets each go; the reader keeps a count and
    16 wordings, never the lines. It once held every XID it ever read and read the file in one piece."""
    import tracemalloc

    from steps.sentinel.kernel_log import CHUNK_BYTES

    log = tmp_path / "kern.log"
    with log.open("w") as out:
        for i in range(60_000):
            out.write(
                f"[ {100 + i / 100:.2f}] NVRM: Xid (PCI:0000:1b:00): 31, pid={i}, MMU Fault @ 0x{i:08x}\n"
            )
    reader = KernelLog(log, LONG_AGO, clock=lambda: NOW)
    ticks = iter(range(10**6))
    reader.monotonic = lambda: float(next(ticks))  # each look at the clock: a second later
    tracemalloc.start()
    try:
        first = reader.read()
        assert CHUNK_BYTES <= reader.snapshot()["offset"] <= 2 * CHUNK_BYTES  # two chunks, then the budget
        reads = 1
        while reader.snapshot()["offset"] < log.stat().st_size:
            reader.read()
            reads += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(first.xids) == 16 and len(reader.xids) == 16
    ((_, (count, _, _)),) = reader.seen.items()
    assert count == 60_000
    assert reads > 1 and log.stat().st_size > 16 * CHUNK_BYTES
    assert peak < 16 * CHUNK_BYTES, f"peak {peak / 2**20:.1f} MiB"  # a few chunks, not the file

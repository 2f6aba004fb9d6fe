"""One exit-code contract for every command: 0 ok, 1 not ok, 2 bad input (one line), 70 a defect of dsx.

A CI gate reads the exit code: a crash must never read as "drift found" or "certification failed" (1),
and bad input must be refused on one line naming the file or option, before any work starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from steps.errors import EXIT_INTERNAL
from tests.cli import dsx_here as _dsx
from tests.paths import REPO

NOT_UTF8 = b"kind: Recipe\nmetadata:\n  name: caf\xe9\n"


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _subprocess(*args: str, code: str | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "workflows.cli", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DSX_CLUSTER", None)
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, check=False, timeout=120)


# A defect of dsx is exit 70 with one line; --debug shows where -------------------------------------------

_CRASHING = (
    "import sys, steps.runtime.resolve as r\n"
    "def broken(*a, **k): raise ZeroDivisionError('a defect in resolution')\n"
    "r.resolve = broken\n"
    "sys.argv[0] = 'dsx'\n"
    "from workflows.cli.main import main\n"
    "main()\n"
)


def test_an_unexpected_error_exits_70_with_one_line_and_the_debug_hint() -> None:
    result = _subprocess("recipe", "resolve", code=_CRASHING)
    assert result.returncode == EXIT_INTERNAL == 70
    line = _one_line(result.stderr)
    assert "ZeroDivisionError: a defect in resolution" in line
    assert "dsx --debug" in line


def test_debug_prints_the_traceback_and_keeps_the_code() -> None:
    result = _subprocess("--debug", "recipe", "resolve", code=_CRASHING)
    assert result.returncode == 70
    assert "Traceback (most recent call last)" in result.stderr
    assert "ZeroDivisionError: a defect in resolution\n" in result.stderr  # the traceback's last line
    assert result.stderr.strip().splitlines()[-1].startswith("error: unexpected ZeroDivisionError")


def test_usage_errors_are_one_line_naming_the_command() -> None:
    result = _subprocess("nccl", "sweep", "--ranks", "0")
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert line.startswith("error: dsx nccl sweep: ") and "'--ranks'" in line
    assert line.endswith("(see 'dsx nccl sweep --help')")


def test_the_readme_states_the_exit_codes() -> None:
    readme = (REPO / "README.md").read_text()
    assert f"{EXIT_INTERNAL} an unexpected error" in readme and "--debug" in readme


# Files that are not UTF-8 -----------------------------------------------------------------------------


def test_a_catalogue_overlay_that_is_not_utf8_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    catalogue = tmp_path / "cat"
    shutil.copytree(REPO / "recipes", catalogue, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    (catalogue / "overlays" / "zz-bad.yaml").write_bytes(NOT_UTF8)
    code, _, err = _dsx(capsys, "recipe", "resolve", "--recipes", str(catalogue))
    assert code == 2
    assert _one_line(err) == f"error: {catalogue}/overlays/zz-bad.yaml:3: not UTF-8 text " + (
        "(invalid continuation byte at byte 34)"
    )


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("bundle", "-f", "helm", "--out", "{tmp}/b", "--recipe", "{file}"), "--recipe"),
        (("drift", "--snapshot", "{file}"), "--snapshot"),
        (("certify", "report", "{file}"), "report"),
        (("run", "x", "--local", "--dry-run", "--file", "{file}"), "--file"),
        (("nccl", "sweep", "--thresholds", "{file}"), "--thresholds"),
        (("cluster", "nodes", "--cluster", "sim:{file},nodes=2"), "fleet"),
    ],
)
def test_files_that_are_not_utf8_are_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: tuple[str, ...], name: str
) -> None:
    file = tmp_path / ("fleet.yaml" if name == "fleet" else "input.yaml")
    file.write_bytes(NOT_UTF8)
    code, _, err = _dsx(capsys, *(a.format(tmp=tmp_path, file=file) for a in args))
    assert code == 2, err
    line = _one_line(err)
    assert str(file) in line and "not UTF-8 text" in line


# Wrong types, outputs in the way, empty state paths, rank counts ------------------------------------------


def test_wrongly_typed_fields_of_a_file_workflow_name_the_field_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(
        "apiVersion: argoproj.io/v1alpha1\nkind: Workflow\nmetadata:\n  name: typed\nspec:\n"
        "  entrypoint: main\n  templates:\n  - name: main\n    inputs: nope\n"
        "    script:\n      image: python\n      source: print(1)\n"
    )
    for extra in ([], ["--dry-run"]):
        code, _, err = _dsx(capsys, "run", "typed", "--local", "--file", str(workflow), *extra)
        assert code == 2
        line = _one_line(err)
        assert line.startswith(f"error: --file {workflow}:9: Workflow (document 1): spec.templates.0.inputs:")
    workflow.write_text(workflow.read_text().split("  templates:")[0] + "  templates: 7\n")
    code, _, err = _dsx(capsys, "run", "typed", "--local", "--dry-run", "--file", str(workflow))
    assert code == 2 and f"{workflow}:7: Workflow (document 1): spec.templates:" in _one_line(err)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("run", "certify", "--local", "--out", "{file}"), "--out"),
        (("run", "certify", "--local", "--out", "{file}/run"), "--out"),
        (("compile", "--out", "{file}"), "--out"),
        (("nccl", "sweep", "--out-dir", "{file}"), "--out-dir"),
        (("train", "smoke", "--out-dir", "{file}"), "--out-dir"),
        (("bundle", "-f", "helm", "--out", "{file}"), "--out"),
    ],
)
def test_an_output_folder_that_is_a_file_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: tuple[str, ...], option: str
) -> None:
    file = tmp_path / "taken"
    file.write_text("mine")
    code, _, err = _dsx(capsys, *(a.format(file=file) for a in args))
    assert code == 2
    line = _one_line(err)
    assert f"{option} {file}" in line and "a file" in line
    assert file.read_text() == "mine"


#: Places no file can be written, even by root: a folder of /proc cannot be made, /sys takes no new file.
UNWRITABLE = ("/proc/dsx-test/out", "/sys/dsx-test")


@pytest.mark.parametrize("place", UNWRITABLE)
@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("run", "certify", "--local", "--cluster", "sim:nodes=2", "--out", "{place}"), "--out"),
        (("compile", "--out", "{place}"), "--out"),
        (("events", "play", "--cluster", "sim:nodes=2", "--for", "1s", "--out", "{place}"), "--out"),
        (("goodput", "--cluster", "sim:nodes=2", "--metrics", "{place}/m.prom"), "--metrics"),
        (("goodput", "--cluster", "sim:nodes=2", "--plot", "{place}/p.png"), "--plot"),
    ],
)
def test_an_output_place_that_takes_no_file_is_bad_input_on_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    place: str,
    args: tuple[str, ...],
    option: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _dsx(capsys, *(a.format(place=place) for a in args))
    assert code == 2, err
    assert _one_line(err).startswith(f"error: {option}"), err
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere, no run folder started


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("nccl", "parse", "{device}"), "{device}: cannot read a log file"),
        (("cluster", "nodes", "--cluster", "state:{device}"), "--cluster 'state:{device}'"),
        (("goodput", "simulate", "--rates", "{device}"), "{device}: cannot read"),
        (("run", "certify", "--local", "-f", "{device}"), "--file {device}: cannot read"),
    ],
)
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_input_that_is_no_regular_file_is_refused_without_reading_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: tuple[str, ...], named: str, kind: str
) -> None:
    """A FIFO with no writer would block on open and /dev/zero would never end: refused, not read."""
    device = "/dev/zero"
    if kind == "fifo":
        device = str(tmp_path / "pipe")
        os.mkfifo(device)
    code, _, err = _dsx(capsys, *(a.format(device=device) for a in args))
    assert code == 2 and "not a regular file" in _one_line(err) and named.format(device=device) in err, err


def test_a_goodput_whose_second_output_cannot_be_written_writes_neither(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plot = tmp_path / "lost.png"
    code, _, err = _dsx(
        capsys, "goodput", "--cluster", "sim:nodes=2", "--plot", str(plot), "--metrics", "/sys/dsx/m.prom"
    )
    assert code == 2 and "--metrics /sys/dsx/m.prom: /sys takes no new files" in _one_line(err)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_bad_input_naming_the_file_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while writing: the error names the file and the system's reason (exit 2, not 70), and the
    temporary file and the folders made for it are gone."""
    import errno

    from steps import files
    from steps.errors import InputError

    class Full:
        def __init__(self, handle: int, mode: str) -> None:
            self.handle = handle

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: object) -> None:
            os.close(self.handle)

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fdopen", Full)
    with pytest.raises(InputError, match=r"^cannot write .*/a/b/report\.json: No space left on device$"):
        files.write_text(tmp_path / "a" / "b" / "report.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_a_metrics_port_in_use_or_out_of_range_is_bad_input() -> None:
    import socket

    from steps.errors import InputError
    from steps.sentinel.agent import serve_metrics

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InputError, match=rf"^--metrics-port {port}: cannot listen on 127.0.0.1:{port}: "):
            serve_metrics("127.0.0.1", port, lambda: b"", lambda: True)
    with pytest.raises(InputError, match=r"^--port 70000: not a port"):
        serve_metrics("127.0.0.1", 70000, lambda: b"", lambda: True, option="--port")


def test_an_empty_state_path_is_bad_input_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _dsx(capsys, "cluster", "nodes", "--cluster", "state:")
    assert code == 2 and "state: needs the path of a fleet state file" in _one_line(err)
    code, _, err = _dsx(capsys, "run", "certify", "--local", "--cluster", "state:")
    assert code == 2 and "state: needs the path" in _one_line(err)
    code, _, err = _dsx(capsys, "run", "certify", "--local", "--cluster", f"state:{tmp_path}")
    assert code == 2 and "is a folder" in _one_line(err)
    assert list(tmp_path.iterdir()) == []  # no run folder was started


@pytest.mark.parametrize("command", [("nccl", "sweep"), ("train", "smoke")])
@pytest.mark.parametrize("ranks", ["0", "-1", "65", "100000"])
def test_rank_counts_are_bounded(
    capsys: pytest.CaptureFixture[str], command: tuple[str, ...], ranks: str
) -> None:
    code, _, err = _dsx(capsys, *command, "--ranks", ranks)
    assert code == 2
    line = _one_line(err)
    assert "'--ranks'" in line and ("than or equal to 1" in line or "than or equal to 64" in line)


def test_json_output_is_strict_json(capsys: pytest.CaptureFixture[str]) -> None:
    from workflows.cli.output import OutputFormat, emit

    emit({"loss": float("nan"), "busbw": [1.0, float("inf")]}, OutputFormat.json)
    data = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert data == {"loss": None, "busbw": [1.0, None]}

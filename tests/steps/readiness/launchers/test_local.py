"""The local launcher: ranks as processes of this machine, in the launcher's own process group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from steps.readiness.launchers.base import RankProgram
from steps.readiness.launchers.local import LocalLauncher, launch_local, stderr_tail
from steps.readiness.models import Subject


def test_ranks_stay_in_the_launchers_process_group_and_session(tmp_path: Path) -> None:
    # A step's process group is what the local runner kills: a rank outside it would outlive the step.
    result = launch_local(
        "tests.steps.readiness.launchers.rank_probe",
        [str(tmp_path), "0"],
        2,
        tmp_path / "ranks",
        timeout_s=60,
    )
    assert result.ok, [stderr_tail(rank.stderr) for rank in result.ranks]
    for rank in range(2):
        note = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert note["pgid"] == os.getpgrp() and note["sid"] == os.getsid(0)


def test_a_programs_preload_is_imported_once_before_its_ranks_are_forked(tmp_path: Path) -> None:
    # The smoke run's ranks each loaded torch._dynamo for themselves (seconds of CPU a rank); what a
    # program names in its preload the fork server imports once, and every rank finds it there.
    program = RankProgram(
        module="tests.steps.readiness.launchers.rank_probe",
        args=[str(tmp_path), "0", "xml.dom.minidom", "xml.dom.pulldom"],
        outputs=[("--out", "unused.json")],  # the probe writes its notes; the flag is a module name to it
        preload=["xml.dom.minidom"],
    )
    subject = Subject(kind="node", name="node-00", members=["node-00"])
    launched = LocalLauncher(folder=tmp_path / "run", ranks=2).run("probe", subject, program, timeout_s=60)
    assert not launched.verdicts, launched.verdicts
    for rank in range(2):
        assert json.loads((tmp_path / f"rank-{rank}.json").read_text())["imported"] == ["xml.dom.minidom"]


def test_the_smoke_run_preloads_what_its_ranks_import() -> None:
    from steps.readiness.checks import SMOKE_PRELOAD, SmokeRequest, training_smoke_check

    check = training_smoke_check(SmokeRequest.model_validate({"subject": {"kind": "node", "name": "n"}}))
    assert check.program.preload == list(SMOKE_PRELOAD)
    assert check.program.module in SMOKE_PRELOAD and "torch._dynamo" in SMOKE_PRELOAD


def test_the_step_modules_that_launch_ranks_name_what_every_rank_imports() -> None:
    # A local runner's fork server imports these once for all of the module's steps (steps.forkserver).
    from steps import figures
    from steps.readiness import certify, checks
    from steps.readiness.bisect import flow
    from steps.readiness.launchers.local import RANK_SERVER_PRELOAD

    for module in (certify, flow):
        assert {*RANK_SERVER_PRELOAD, *checks.SMOKE_PRELOAD} <= set(module.FORK_SERVER_PRELOAD)
    assert set(figures.IMPORTS) <= set(certify.FORK_SERVER_PRELOAD)  # the report's plots


def test_figures_imports_name_what_drawing_a_figure_imports(tmp_path: Path) -> None:
    code = (
        "import importlib, pathlib, sys\n"
        "from steps import figures\n"
        "for module in figures.IMPORTS: importlib.import_module(module)\n"
        "before = set(sys.modules)\n"
        "figure = figures.new_figure(figsize=(2, 1))\n"
        "figure.subplots().plot([0, 1], [1, 0], label='a')\n"
        "figures.save_png(figure, pathlib.Path(sys.argv[1]))\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith('matplotlib')))\n"
    )
    png = tmp_path / "figure.png"
    done = subprocess.run([sys.executable, "-c", code, str(png)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]" and png.read_bytes()[:4] == b"\x89PNG"

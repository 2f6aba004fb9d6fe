"""The local launcher: ranks as processes of this machine, in the launcher's own process group."""

from __future__ import annotations

import json
import os
from pathlib import Path

from steps.readiness.launchers.local import launch_local, stderr_tail


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

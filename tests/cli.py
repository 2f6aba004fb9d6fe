"""Running the ``dsx`` command from a test, as a user would, or in the test's own process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.paths import REPO
from workflows.cli.main import run


def dsx(
    *args: str,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``dsx ARGS`` in a new process (exit code, standard output and error as text)."""
    return subprocess.run(
        [sys.executable, "-m", "workflows.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=None if env is None else dict(env),
        input=stdin,
        check=False,
        timeout=timeout,
    )


def dsx_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``dsx ARGS`` in this process; its exit code, stdout and stderr."""
    code = run(list(args))
    out, err = capsys.readouterr()
    return code, out, err

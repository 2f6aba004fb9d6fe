"""The dsx command line: fast start, help everywhere, errors as exit codes."""

import json
import subprocess
import sys

from tests.cli import dsx as _dsx
from tests.paths import REPO

HEAVY = ("torch", "pandas", "kubernetes", "hera", "matplotlib", "numpy")


def test_starting_the_cli_imports_no_heavy_library() -> None:
    probe = (
        "import sys, workflows.cli.main as m; "
        f"print(sorted({{n.split('.')[0] for n in sys.modules}} & set({HEAVY!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert result.stdout.strip() == "[]"


def test_every_command_has_help() -> None:
    from workflows.cli.main import app

    top = _dsx("--help")
    assert top.returncode == 0
    names = sorted(c.name or "" for c in app.registered_commands) + sorted(
        g.name or "" for g in app.registered_groups
    )
    assert "compile" in names
    for name in names:
        result = _dsx(name, "--help")
        assert result.returncode == 0, (name, result.stderr)
        assert "Usage" in result.stdout


def test_version_and_output_formats() -> None:
    assert _dsx("--version").stdout.startswith("dsx ")
    data = json.loads(_dsx("version", "-o", "json").stdout)
    assert "hera" in data
    assert "hera:" in _dsx("version", "-o", "yaml").stdout


def test_usage_errors_exit_2() -> None:
    result = _dsx("version", "-o", "xml")
    assert result.returncode == 2
    assert "xml" in result.stderr


def test_a_cron_workflow_runs_once_by_name() -> None:
    result = _dsx("run", "drift", "--local", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "dsx-drift" in result.stdout
    assert "steps.runtime.tasks:detect_drift" in result.stdout

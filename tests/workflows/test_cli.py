"""The dsx command line: fast start, help everywhere, errors as exit codes."""

import json
import subprocess
import sys

import pytest

from steps.cluster import vocabulary as vocab
from tests.cli import dsx as _dsx
from tests.cli import dsx_here
from tests.paths import REPO
from workflows.cli import main as cli_main

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


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    """``dsx --help`` names every command (the real entry point), and each command's own ``--help``
    answers (in this process: the lazy registry loads each command module as the entry point would)."""
    from workflows.cli.main import COMMANDS

    top = _dsx("--help")
    assert top.returncode == 0
    assert "compile" in COMMANDS
    for name in COMMANDS:
        assert name in top.stdout
        code, out, err = dsx_here(capsys, name, "--help")
        assert code == 0, (name, err)
        assert "Usage" in out


def test_the_command_registry_is_what_the_modules_register() -> None:
    """Each command module's ``register`` adds exactly the commands the registry names for it, with the
    summary ``dsx --help`` shows; a new module or command not in the registry fails here."""
    import importlib
    import pkgutil

    import typer
    import typer.main

    import workflows.cli
    from workflows.cli.main import COMMANDS

    registered: dict[str, tuple[str, str]] = {}
    for info in pkgutil.iter_modules(workflows.cli.__path__):
        if info.name in {"main", "output", "__main__"} or info.name.startswith("_"):
            continue
        app = typer.Typer()
        importlib.import_module(f"workflows.cli.{info.name}").register(app)
        for name, command in typer.main.get_group(app).commands.items():
            registered[name] = (info.name, command.get_short_help_str(limit=1000))
    assert registered == COMMANDS


def test_a_command_imports_only_its_own_module() -> None:
    probe = (
        "import sys; from workflows.cli.main import run; run(['version', '-o', 'json']); "
        "print(sorted(m for m in sys.modules if m.startswith('workflows.cli.')), file=sys.stderr)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True
    )
    loaded = result.stderr.strip().splitlines()[-1]
    assert "workflows.cli.version_cmd" in loaded
    assert "workflows.cli.bisect" not in loaded and "workflows.cli.sentinel" not in loaded


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


def test_the_debug_variable_is_the_vocabulary_s() -> None:
    # The CLI spells it to start without importing steps.cluster; the vocabulary names it for the rest.
    assert cli_main._DEBUG_ENV == vocab.ENV_DEBUG

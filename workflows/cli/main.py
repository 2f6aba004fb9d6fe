"""Entry point of the ``dsx`` command: the root typer app, its command registry and its error handling.

The commands load lazily, as pip's command registry does: :data:`COMMANDS` names each top-level command's
module and the line ``dsx --help`` shows for it, and a command's module is imported only when that
command runs or its own help is asked for. So a command module imports what it needs at its top and
``dsx version`` pays for nothing else. A test keeps the registry equal to what the modules register.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

# Plain help text: rendering help through rich costs more than the whole start-up budget (0.5 s).
# Command output still uses rich tables.
os.environ.setdefault("TYPER_USE_RICH", "0")

import typer
import typer.main
from typer.core import TyperGroup

from steps.errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, DsxError

__all__ = ["COMMANDS", "LazyGroup", "app", "main", "run"]

# vocabulary.ENV_DEBUG, spelled here: importing steps.cluster would add a fifth of a second to every
# command's start (tests/workflows/test_cli.py holds the two the same).
_DEBUG_ENV = "DSX_DEBUG"

#: Every top-level command: its module under ``workflows.cli`` (whose ``register(app)`` adds it) and
#: its summary in ``dsx --help`` (the first line of its help, which a test keeps equal).
COMMANDS: dict[str, tuple[str, str]] = {
    "bisect": (
        "bisect",
        "Screen the group, and if it fails, find the nodes at fault; exit 1 when it is not healthy.",
    ),
    "bundle": (
        "bundle",
        "Render the recipe as a bundle with checksums.txt; the same inputs give identical bytes.",
    ),
    "certify": ("certify", "Readiness certification."),
    "cluster": (
        "cluster",
        "List nodes and cordon, uncordon or taint them, on a real cluster or a simulated fleet.",
    ),
    "compile": (
        "compile_cmd",
        "Compile every dsx WorkflowTemplate, CronWorkflow, EventSource and Sensor to YAML.",
    ),
    "drift": (
        "drift",
        "Compare the cluster with the recipe per node and per component; exit 1 when it drifted.",
    ),
    "events": ("events", "Argo Events on this machine: dsx's EventSources and Sensors against a cluster."),
    "exporter": ("exporter", "Serve the fleet's metrics for Prometheus, read from dsx's ConfigMaps."),
    "goodput": (
        "goodput",
        "Goodput: what a fleet lost to faults (from the ledger), and what each policy wins back.",
    ),
    "nccl": ("nccl", "NCCL all-reduce: parse nccl-tests logs, run sweeps."),
    "recipe": (
        "recipe",
        "Resolve runtime recipes: pinned components, their dependency graph, the catalogue.",
    ),
    "resume": (
        "resume_cmd",
        "Resume a suspended step of a local run (one running under its suspend duration).",
    ),
    "run": ("run_cmd", "Run a dsx workflow; with --local, on this machine, exiting 0 only if it Succeeded."),
    "sentinel": (
        "sentinel",
        "The per-node health agent: NVML, kernel log and sysfs probes, the fault catalogue.",
    ),
    "snapshot": (
        "drift",
        "Read node software, GPU Feature Discovery labels, Helm releases and images from a cluster.",
    ),
    "train": ("train", "Training smoke runs."),
    "version": ("version_cmd", "Show dsx's version and the library versions it runs with."),
}


def load(name: str) -> Any:
    """The click command ``name`` of :data:`COMMANDS`, its module imported and registered on its own."""
    module = importlib.import_module(f"workflows.cli.{COMMANDS[name][0]}")
    own = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    module.register(own)
    return typer.main.get_group(own).commands[name]


class LazyGroup(TyperGroup):
    """The root group: commands listed from :data:`COMMANDS`, each module imported when first needed."""

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in COMMANDS:
            found = load(cmd_name)
            self.add_command(found, cmd_name)
        return found

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """``dsx --help``'s command list from the registry, importing no command module."""
        rows = [(name, COMMANDS[name][1]) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = typer.Typer(
    name="dsx",
    cls=LazyGroup,
    help="Keep Kubernetes GPU clusters productive: runtime recipes, readiness certification, sentinel.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class _State:
    """What the root options set for the error handling of this invocation."""

    debug = False


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"dsx {version('dsx')}")
        except PackageNotFoundError:  # running from a source tree that is not installed
            typer.echo("dsx (not installed)")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False,
        "--debug",
        help=f"Print the traceback of an error (also ${_DEBUG_ENV}=1); give it before the command.",
    ),
) -> None:
    """Keep Kubernetes GPU clusters productive: runtime recipes, readiness certification, sentinel.

    Exit codes: 0 ok; 1 what was checked is not ok (drift, a failed certification, a failed workflow);
    2 bad input or usage; 70 an unexpected error (a defect of dsx: --debug shows the traceback).
    """
    _State.debug = _State.debug or debug


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _error(message: str) -> None:
    typer.secho(f"error: {_one_line(message)}", fg=typer.colors.RED, err=True)


def _traceback() -> None:
    if _State.debug:
        import traceback

        traceback.print_exc(file=sys.stderr)


def _usage_error(exc: Exception) -> int:
    """A usage error from the command-line parser (typer's click), as one line; exit 2.

    Recognised by the interface click's exceptions share (``format_message`` and ``exit_code``), so the
    same code serves typer with its own copy of click and typer over click.
    """
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":  # ``dsx recipe`` alone: its help, as before
        typer.echo(exc.format_message(), err=True)  # type: ignore[attr-defined]
        return EXIT_INPUT
    message = exc.format_message().rstrip(".")  # type: ignore[attr-defined]
    if ctx is not None:
        path = ctx.command_path
        _error(f"{path}: {message} (see '{path} --help')")
    else:
        _error(message)
    return EXIT_INPUT


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: the process's arguments) and return its exit status.

    Every outcome is 0 ok, 1 what was checked is not ok, 2 bad input or usage (one line on stderr naming
    what and where), 70 an unexpected error (one line naming it, and the hint to rerun with ``--debug``
    for the traceback), or 130 and 143 when Ctrl-C or SIGTERM stopped the work. No exception escapes,
    so a caller (a CI gate, a test) never mistakes a crash for a verdict.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    _State.debug = os.environ.get(_DEBUG_ENV, "") not in ("", "0")
    try:
        result = app(args=args, prog_name="dsx", standalone_mode=False)
        return result if isinstance(result, int) else EXIT_OK
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return EXIT_OK
        if isinstance(code, int):
            return code
        _error(str(code))
        return EXIT_INPUT
    except DsxError as exc:
        _traceback()
        _error(str(exc))
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the boundary of the program: every error ends here as one line
        if hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int):
            return _usage_error(exc)
        if type(exc).__name__ == "Abort":
            return 130
        _traceback()
        hint = "" if _State.debug else "; rerun as 'dsx --debug ...' for the traceback"
        text = _one_line(exc)
        text = text if len(text) <= 300 else text[:297] + "..."
        _error(f"unexpected {type(exc).__name__}: {text} (a defect of dsx, exit {EXIT_INTERNAL}){hint}")
        return EXIT_INTERNAL


def main() -> None:
    """The ``dsx`` console script: :func:`run` with the process's arguments.

    Once the status is known, Ctrl-C and SIGTERM are ignored: the second of two quick Ctrl-Cs may arrive
    after the first stopped a run and its summary is out, with Python's default handlers back, and would
    otherwise turn 130 into a death by SIGINT."""
    code = run()
    while True:
        try:  # signal.signal runs the handler of a signal still pending before it changes the handler
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
            break
        except KeyboardInterrupt:
            continue
    sys.exit(code)

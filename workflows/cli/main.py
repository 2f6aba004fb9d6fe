"""Entry point of the ``dsx`` command: the root typer app and its error handling."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

# Plain help text: rendering help through rich costs more than the whole start-up budget (0.5 s).
# Command output still uses rich tables.
os.environ.setdefault("TYPER_USE_RICH", "0")

import typer

from steps.errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, DsxError

__all__ = ["app", "main", "run"]

_NOT_COMMANDS = {"main", "output", "__main__"}
_DEBUG_ENV = "DSX_DEBUG"

app = typer.Typer(
    name="dsx",
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


def _register_all() -> None:
    package = importlib.import_module("workflows.cli")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name in _NOT_COMMANDS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"workflows.cli.{info.name}")
        module.register(app)


_register_all()


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
    return result if isinstance(result, int) else EXIT_OK


def main() -> None:
    """The ``dsx`` console script: :func:`run` with the process's arguments."""
    sys.exit(run())

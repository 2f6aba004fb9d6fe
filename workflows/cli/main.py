"""Entry point of the ``dsx`` command: the root typer app and its error handling."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

# Plain help text: rendering help through rich costs more than the whole start-up budget (0.5 s).
# Command output still uses rich tables.
os.environ.setdefault("TYPER_USE_RICH", "0")

import typer

from steps.errors import DsxError

__all__ = ["app", "main"]

_NOT_COMMANDS = {"main", "output", "__main__"}

app = typer.Typer(
    name="dsx",
    help="Keep Kubernetes GPU clusters productive: runtime recipes, readiness certification, sentinel.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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
) -> None:
    """Keep Kubernetes GPU clusters productive: runtime recipes, readiness certification, sentinel."""


def _register_all() -> None:
    package = importlib.import_module("workflows.cli")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name in _NOT_COMMANDS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"workflows.cli.{info.name}")
        module.register(app)


_register_all()


def main() -> None:
    """Run the CLI; a :class:`DsxError` becomes a one-line message and exit status 2."""
    try:
        app(prog_name="dsx")
    except DsxError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        sys.exit(2)

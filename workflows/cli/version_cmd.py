"""``dsx version``: the installed version and the versions of the engines dsx targets."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import typer

from workflows.cli.output import OUTPUT_OPTION, OutputFormat, emit, print_table


def register(app: typer.Typer) -> None:
    """Add the ``version`` command."""

    @app.command("version")
    def version_cmd(output: OutputFormat = OUTPUT_OPTION) -> None:
        """Show dsx's version and the library versions it runs with."""

        info: dict[str, str] = {}
        for dist in ("dsx", "hera", "kubernetes", "pydantic"):
            try:
                info[dist] = version(dist)
            except PackageNotFoundError:
                info[dist] = "not installed"
        info["argo-workflows"] = "v4 (through hera 7)"
        emit(info, output, lambda d: print_table(None, ["component", "version"], sorted(d.items())))

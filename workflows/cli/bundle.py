"""``dsx bundle``: the resolved recipe as a Helm, Argo CD or Flux bundle, ready for a GitOps repository."""

from __future__ import annotations

from pathlib import Path

import typer

from steps.runtime.bundle import render_bundle, write_bundle
from steps.runtime.names import BUNDLE_FORMATS
from workflows.cli.recipe import (
    ACCELERATOR,
    INTENT,
    NODES,
    OS,
    PLATFORM,
    RECIPES,
    SERVICE,
    criteria_flags,
    recipe_from_file_or_flags,
)

__all__ = ["register"]


_FORMATS_HELP = f"{', '.join(BUNDLE_FORMATS[:-1])} or {BUNDLE_FORMATS[-1]}."


def register(app: typer.Typer) -> None:
    """Add the ``bundle`` command."""

    @app.command("bundle")
    def bundle_cmd(
        fmt: str = typer.Option(..., "--format", "-f", help=_FORMATS_HELP),
        out: Path = typer.Option(..., "--out", help="Bundle folder (replaced atomically if it is a bundle)."),
        recipes: Path | None = RECIPES,
        service: str = SERVICE,
        accelerator: str = ACCELERATOR,
        os_: str = OS,
        intent: str = INTENT,
        platform: str = PLATFORM,
        nodes: str = NODES,
        recipe_file: Path | None = typer.Option(
            None,
            "--recipe",
            help="Render this resolved recipe (RecipeResult, JSON or YAML) instead of resolving.",
        ),
        repo_url: str | None = typer.Option(
            None, "--repo-url", help="Git repository the bundle is committed to (required for argocd)."
        ),
        revision: str = typer.Option("main", "--revision", help="Git revision Argo CD tracks."),
        repo_path: str = typer.Option(
            ".", "--repo-path", help="Folder of the bundle inside that repository."
        ),
    ) -> None:
        """Render the recipe as a bundle with checksums.txt; the same inputs give identical bytes."""

        result = recipe_from_file_or_flags(
            recipe_file, recipes, **criteria_flags(service, accelerator, os_, intent, platform, nodes)
        )
        files = render_bundle(result, fmt, repo_url=repo_url, revision=revision, repo_path=repo_path)
        write_bundle(files, out)
        typer.echo(f"wrote {len(files)} files to {out} ({fmt}, recipe {result.digest})")

"""Small catalogues written on the fly, for tests of resolution rules and error messages."""

from pathlib import Path
from typing import Any

import yaml

REGISTRY_HEADER = {"apiVersion": "dsx.dev/v1alpha1", "kind": "ComponentRegistry", "metadata": {"name": "t"}}


def component(version: str = "1.0.0", **extra: Any) -> dict[str, Any]:
    """A registry entry with a chart at example.org."""
    spec = {
        "repository": "https://charts.example.org",
        "chart": "chart",
        "defaultVersion": version,
        "namespace": "ns",
    }
    spec.update(extra)
    return spec


def overlay(name: str, criteria: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A Recipe overlay document."""
    body: dict[str, Any] = {"criteria": criteria or {}}
    body.update(spec)
    return {"apiVersion": "dsx.dev/v1alpha1", "kind": "Recipe", "metadata": {"name": name}, "spec": body}


def write_catalogue(
    root: Path,
    components: dict[str, dict[str, Any]],
    overlays: list[dict[str, Any]],
    values: dict[str, dict[str, Any]] | None = None,
    manifests: dict[str, dict[str, str]] | None = None,
) -> Path:
    """Write registry.yaml, overlays/<name>.yaml and components/<name>/... under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    registry = dict(REGISTRY_HEADER, spec={"components": components})
    (root / "registry.yaml").write_text(yaml.safe_dump(registry, sort_keys=False))
    (root / "overlays").mkdir(exist_ok=True)
    for document in overlays:
        name = document["metadata"]["name"]
        (root / "overlays" / f"{name}.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    for name, data in (values or {}).items():
        folder = root / "components" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "values.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    for name, files in (manifests or {}).items():
        folder = root / "components" / name / "manifests"
        folder.mkdir(parents=True, exist_ok=True)
        for filename, text in files.items():
            (folder / filename).write_text(text)
    return root

"""The recipe catalogue: a ComponentRegistry, Recipe overlays and per-component default values.

Layout of a catalogue folder (the packaged one is ``recipes/``; ``--recipes DIR`` names another)::

    registry.yaml                      kind ComponentRegistry
    overlays/*.yaml                    kind Recipe, one overlay a file
    components/<name>/values.yaml      default Helm values of a component (optional)
    components/<name>/manifests/*.yaml extra manifests a componentRef may list (optional)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from steps.cluster import vocabulary as vocab
from steps.errors import InputError
from steps.models import Frozen, validate
from steps.runtime.criteria import Criteria, parse_criteria
from steps.runtime.yamlio import LineDict, line_of, load_yaml
from steps.yamlio import shipped

__all__ = [
    "API_VERSION",
    "PATTERNS",
    "Catalogue",
    "ComponentRef",
    "ComponentSpec",
    "NodeScheduling",
    "Overlay",
    "check_value",
    "default_catalogue_dir",
    "load_catalogue",
]

API_VERSION = vocab.API_VERSION
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"

#: What each value a bundle hands to helm, kubectl, Argo CD or Flux may look like. These values end up
#: in ``install.sh`` and in manifests; checked when the catalogue is read, a hostile or mistyped value
#: (``$(curl ...)`` as a version) is refused with its file and line instead of reaching a shell.
PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    "version": (
        re.compile(r"^v?\d+(\.\d+){0,2}(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"),
        "a pinned chart version (SemVer, e.g. 1.2.3, v25.3.4 or 2.0.0-rc.1)",
    ),
    "chart": (
        re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$"),
        "a chart name (lowercase letters, digits, '-', '_' and '.')",
    ),
    "repository": (
        re.compile(
            r"^(https?|oci)://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:\d{1,5})?(/[A-Za-z0-9._~%+-]+)*/?$"
        ),
        "a chart repository URL (https://host/path or oci://host/path)",
    ),
    "namespace": (
        re.compile(rf"^(?=.{{1,63}}$){_LABEL}$"),
        "a namespace name (a DNS label: lowercase letters, digits and '-', at most 63)",
    ),
    "release": (
        re.compile(rf"^(?=.{{1,53}}$){_LABEL}(\.{_LABEL})*$"),
        "a Helm release name (lowercase letters, digits, '-' and '.', at most 53)",
    ),
}


def check_value(kind: str, value: str) -> str:
    """``value`` if it matches the pattern for ``kind`` (a key of :data:`PATTERNS`).

    Raises:
        ValueError: naming the value and what it should be (pydantic reports it with file and line).
    """
    pattern, meaning = PATTERNS[kind]
    if not pattern.match(value):
        raise ValueError(f"{kind} {value!r} is not {meaning}")
    return value


class _Metadata(Frozen):
    name: str
    description: str = ""


class NodeScheduling(Frozen):
    """Where a chart takes the node selector and tolerations of its control-plane pods (values paths)."""

    nodeSelector: list[str] = Field(default_factory=list)
    tolerations: list[str] = Field(default_factory=list)


class ComponentSpec(Frozen):
    """One component of the registry: where its chart lives and how it is installed by default."""

    description: str = ""
    repository: str
    chart: str
    defaultVersion: str
    namespace: str
    release: str | None = None
    dependsOn: list[str] = Field(default_factory=list)
    images: dict[str, str] = Field(default_factory=dict)
    nodeScheduling: NodeScheduling = Field(default_factory=NodeScheduling)
    nodeFacts: dict[str, str] = Field(default_factory=dict)
    """Node facts this component decides, each read from a values path (``driverVersion: driver.version``)."""

    @field_validator("repository", "chart", "namespace", "release")
    @classmethod
    def _pattern(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else check_value(str(info.field_name), value)

    @field_validator("defaultVersion")
    @classmethod
    def _version(cls, value: str) -> str:
        return check_value("version", value)


class _RegistrySpec(Frozen):
    components: dict[str, ComponentSpec]


class _Registry(Frozen):
    apiVersion: vocab.ApiVersion
    kind: Literal["ComponentRegistry"]
    metadata: _Metadata
    spec: _RegistrySpec


class ComponentRef(Frozen):
    """What an overlay says about one component; absent fields leave earlier settings alone."""

    name: str
    enabled: bool | None = None
    version: str | None = None
    namespace: str | None = None
    images: dict[str, str | None] | None = None
    dependsOn: list[str] | None = None
    values: dict[str, Any] | None = None
    manifests: list[str] | None = None

    @field_validator("version", "namespace")
    @classmethod
    def _pattern(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else check_value(str(info.field_name), value)


class _Fabric(Frozen):
    """How rank pods reach the fabric: a rank pod profile (readiness checks its fields) and, for every
    setting, the documentation it follows."""

    rankPod: dict[str, Any] | None = Field(default_factory=dict)
    sources: dict[str, str] | None = Field(default_factory=dict)
    """``null`` takes out what an earlier overlay set, as anywhere else in a merged mapping."""


class _RecipeSpec(Frozen):
    base: str | None = None
    abstract: bool = False
    criteria: dict[str, Any] = Field(default_factory=dict)
    componentRefs: list[ComponentRef] = Field(default_factory=list)
    constraints: dict[str, Any] = Field(default_factory=dict)
    thresholds: dict[str, Any] = Field(default_factory=dict)
    scheduling: dict[str, Any] = Field(default_factory=dict)
    fabric: _Fabric | None = None


class _Recipe(Frozen):
    apiVersion: vocab.ApiVersion
    kind: Literal["Recipe"]
    metadata: _Metadata
    spec: _RecipeSpec


class Overlay(BaseModel):
    """A loaded overlay: its name, file, criteria and spec, with line numbers for error messages."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    name: str
    file: str
    description: str
    criteria: Criteria
    base: str | None
    abstract: bool
    componentRefs: list[ComponentRef]
    constraints: dict[str, Any]
    thresholds: dict[str, Any]
    scheduling: dict[str, Any]
    fabric: dict[str, Any]
    lines: dict[str, int]

    def where(self, *path: Any) -> str:
        """``file:line`` of a location inside ``spec`` (the closest line known)."""
        line = self.lines.get(".".join(str(p) for p in path)) or self.lines.get("")
        return f"{self.file}:{line}" if line else self.file

    @property
    def specificity(self) -> int:
        """How many criteria fields the overlay pins."""
        return self.criteria.specificity()


class Catalogue(BaseModel):
    """A whole catalogue, loaded and checked: components by name, overlays by name."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    root: str
    components: dict[str, ComponentSpec]
    component_values: dict[str, dict[str, Any]]
    manifests: dict[str, dict[str, str]]
    overlays: dict[str, Overlay]
    registry_file: str


def default_catalogue_dir() -> Path:
    """The catalogue shipped inside the ``recipes`` package (package data, found through importlib).

    A folder named ``recipes`` in the current directory can shadow the package under ``python -m``;
    it is then a namespace package, and the catalogue installed beside ``steps`` is used instead.
    """
    return shipped()


def _check_name(kind: str, name: str, where: str) -> None:
    if not _NAME.match(name):
        raise InputError(f"{where}: {kind} name {name!r} must be lowercase letters, digits and '-'")


def _index_lines(raw: Any) -> dict[str, int]:
    """Lines of the spec's interesting places, keyed by dotted path (componentRefs by component name)."""
    lines: dict[str, int] = {}
    if not isinstance(raw, LineDict):
        return lines
    lines[""] = raw.line
    spec = raw.get("spec")
    if not isinstance(spec, LineDict):
        return lines
    for key, line in spec.key_lines.items():
        lines[str(key)] = line
    criteria = spec.get("criteria")
    if isinstance(criteria, LineDict):
        for key, line in criteria.key_lines.items():
            lines[f"criteria.{key}"] = line
    refs = spec.get("componentRefs")
    if isinstance(refs, list):
        for index, ref in enumerate(refs):
            if isinstance(ref, LineDict):
                name = str(ref.get("name", index))
                lines[f"componentRefs.{name}"] = ref.line
                for key, line in ref.key_lines.items():
                    lines[f"componentRefs.{name}.{key}"] = line
    return lines


def _load_registry(root: Path, label: str) -> tuple[dict[str, ComponentSpec], str]:
    path = root / "registry.yaml"
    shown = f"{label}/registry.yaml"
    if not path.is_file():
        raise InputError(f"{shown}: missing: a catalogue needs a ComponentRegistry in registry.yaml")
    raw = load_yaml(path, shown)
    registry = validate(_Registry, raw, shown)
    for name, spec in registry.spec.components.items():
        where = f"{shown}:{line_of(raw, ('spec', 'components', name))}"
        _check_name("component", name, where)
        for dep in spec.dependsOn:
            if dep not in registry.spec.components:
                raise InputError(f"{where}: component {name}: dependsOn names unknown component {dep!r}")
    return dict(registry.spec.components), shown


def _load_overlay(path: Path, shown: str, components: dict[str, ComponentSpec]) -> Overlay:
    raw = load_yaml(path, shown)
    recipe = validate(_Recipe, raw, shown)
    lines = _index_lines(raw)

    def where(*parts: str) -> str:
        line = lines.get(".".join(parts)) or lines.get(parts[0] if parts else "") or lines.get("")
        return f"{shown}:{line}" if line else shown

    _check_name("overlay", recipe.metadata.name, where())
    criteria = parse_criteria(recipe.spec.criteria, f"{where('criteria')}: criteria.")
    seen: set[str] = set()
    for ref in recipe.spec.componentRefs:
        ref_where = where("componentRefs", ref.name)
        if ref.name not in components:
            raise InputError(
                f"{ref_where}: unknown component {ref.name!r}; "
                f"the registry has: {', '.join(sorted(components))}"
            )
        if ref.name in seen:
            raise InputError(f"{ref_where}: component {ref.name!r} listed twice in one overlay")
        seen.add(ref.name)
    return Overlay(
        name=recipe.metadata.name,
        file=shown,
        description=recipe.metadata.description,
        criteria=criteria,
        base=recipe.spec.base,
        abstract=recipe.spec.abstract,
        componentRefs=list(recipe.spec.componentRefs),
        constraints=recipe.spec.constraints,
        thresholds=recipe.spec.thresholds,
        scheduling=recipe.spec.scheduling,
        fabric=recipe.spec.fabric.model_dump(exclude_unset=True) if recipe.spec.fabric else {},
        lines=lines,
    )


def _load_components(
    root: Path, label: str, components: dict[str, ComponentSpec]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, str]]]:
    values: dict[str, dict[str, Any]] = {}
    manifests: dict[str, dict[str, str]] = {}
    folder = root / "components"
    if not folder.is_dir():
        return values, manifests
    for sub in sorted(folder.iterdir()):
        if not sub.is_dir():
            continue
        shown = f"{label}/components/{sub.name}"
        if sub.name not in components:
            raise InputError(f"{shown}: folder of unknown component {sub.name!r} (not in the registry)")
        values_file = sub / "values.yaml"
        if values_file.is_file():
            data = load_yaml(values_file, f"{shown}/values.yaml")
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise InputError(f"{shown}/values.yaml:1: expected a mapping of Helm values")
            values[sub.name] = data
        manifest_dir = sub / "manifests"
        if manifest_dir.is_dir():
            found: dict[str, str] = {}
            for item in sorted(manifest_dir.glob("*.yaml")):
                load_yaml(item, f"{shown}/manifests/{item.name}", documents=True)  # or an error with its line
                found[item.name] = item.read_text(encoding="utf-8")
            manifests[sub.name] = found
    return values, manifests


def load_catalogue(root: Path | None = None) -> Catalogue:
    """Load and check a catalogue folder (default: the packaged ``recipes/``).

    Raises:
        InputError: malformed YAML or schema (with file and line), an unknown component, a duplicate
            overlay name, an unknown base or a manifest a componentRef lists but the folder lacks.
    """
    if root is None:
        folder, label = default_catalogue_dir(), "recipes"
    else:
        folder, label = Path(root), str(root).rstrip("/") or "/"
    if not folder.is_dir():
        raise InputError(f"{label}: not a folder: --recipes must name a catalogue folder")
    components, registry_file = _load_registry(folder, label)
    values, manifests = _load_components(folder, label, components)
    overlays: dict[str, Overlay] = {}
    overlay_dir = folder / "overlays"
    paths = sorted(overlay_dir.glob("*.yaml")) if overlay_dir.is_dir() else []
    for path in paths:
        overlay = _load_overlay(path, f"{label}/overlays/{path.name}", components)
        if overlay.name in overlays:
            raise InputError(
                f"{overlay.file}: overlay name {overlay.name!r} "
                f"is already used by {overlays[overlay.name].file}"
            )
        overlays[overlay.name] = overlay
    for overlay in overlays.values():
        if overlay.base is not None and overlay.base not in overlays:
            raise InputError(f"{overlay.where('base')}: base names unknown overlay {overlay.base!r}")
        for ref in overlay.componentRefs:
            for manifest in ref.manifests or []:
                if manifest not in manifests.get(ref.name, {}):
                    raise InputError(
                        f"{overlay.where('componentRefs', ref.name, 'manifests')}: manifest {manifest!r} "
                        f"not found in {label}/components/{ref.name}/manifests/"
                    )
    return Catalogue(
        root=label,
        components=components,
        component_values=values,
        manifests=manifests,
        overlays=overlays,
        registry_file=registry_file,
    )

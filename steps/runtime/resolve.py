"""Recipe resolution: matching overlays, merged in order of specificity, into a RecipeResult.

1. Every overlay whose criteria match the query is selected; an absent or ``any`` field matches all.
   Abstract overlays (``abstract: true``) are never selected: they only serve as another's base.
2. Selected overlays are applied from the least to the most specific (ties by name); an overlay's
   ``base`` chain is applied just before it, root first, unless already applied (cycles are errors).
3. Two selected overlays of equal specificity that pin one component differently (version,
   namespace or an image) are a conflict, reported with both files, never resolved silently.
4. Values merge as described in :mod:`steps.runtime.merge`; every leaf records its overlay.
5. Dependencies are checked and ordered (:mod:`steps.runtime.graph`); the result carries a sha256
   digest of its canonical JSON form.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from steps.cluster import vocabulary as vocab
from steps.errors import InputError
from steps.runtime.catalogue import Catalogue, ComponentRef, Overlay
from steps.runtime.criteria import Criteria
from steps.runtime.graph import order
from steps.runtime.merge import Provenance, deep_merge, plain_copy, union
from steps.runtime.yamlio import canonical_json

__all__ = [
    "AppliedOverlay",
    "Manifest",
    "RecipeResult",
    "ResolvedComponent",
    "applied_overlays",
    "compute_digest",
    "resolve",
]


class AppliedOverlay(BaseModel):
    """An overlay that took part, in application order."""

    model_config = ConfigDict(extra="forbid")

    name: str
    file: str
    specificity: int
    criteria: dict[str, Any]


class Manifest(BaseModel):
    """An extra manifest shipped with a component (applied after its chart)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    content: str


class ResolvedComponent(BaseModel):
    """One component as it must be installed: chart, pinned version, values, place in the order."""

    model_config = ConfigDict(extra="forbid")

    name: str
    repository: str
    chart: str
    version: str
    namespace: str
    release: str
    tier: int
    dependsOn: list[str]
    images: dict[str, str]
    values: dict[str, Any]
    manifests: list[Manifest]
    nodeFacts: dict[str, str]

    @property
    def chart_ref(self) -> str:
        """What ``helm`` takes as the chart: ``oci://host/path/chart`` for OCI, else the chart name."""
        if self.repository.startswith("oci://"):
            return f"{self.repository.rstrip('/')}/{self.chart}"
        return self.chart

    @property
    def is_oci(self) -> bool:
        """Whether the chart lives in an OCI registry."""
        return self.repository.startswith("oci://")


class RecipeResult(BaseModel):
    """A resolved recipe (kind RecipeResult): what a cluster for these criteria should run."""

    model_config = ConfigDict(extra="forbid")

    apiVersion: vocab.ApiVersion = vocab.API_VERSION
    kind: Literal["RecipeResult"] = "RecipeResult"
    criteria: dict[str, Any]
    appliedOverlays: list[AppliedOverlay]
    components: list[ResolvedComponent]
    deploymentOrder: list[str]
    tiers: list[list[str]]
    constraints: dict[str, Any]
    thresholds: dict[str, Any]
    fabric: dict[str, Any] = Field(default_factory=dict)
    """How rank pods reach the fabric: ``rankPod`` (a rank pod profile) and ``sources`` (the documentation
    behind each setting); empty where the cluster has no fabric to ask for."""
    provenance: dict[str, str]
    digest: str = ""

    def component(self, name: str) -> ResolvedComponent:
        """The component called ``name``.

        Raises:
            InputError: the recipe has no such component.
        """
        for item in self.components:
            if item.name == name:
                return item
        raise InputError(f"recipe {self.digest[:19]}: no component {name!r}")

    def verify_digest(self, where: str) -> None:
        """Check the digest matches the content (a hand-edited recipe file is refused).

        Raises:
            InputError: the digest is missing or does not match.
        """
        expected = compute_digest(self)
        if self.digest != expected:
            raise InputError(
                f"{where}: digest {self.digest or '(none)'} does not match the content ({expected}); "
                "resolve the recipe again instead of editing it"
            )


def compute_digest(result: RecipeResult) -> str:
    """``sha256:<hex>`` of the canonical JSON of the result without its digest."""
    data = result.model_dump(mode="json", exclude={"digest"})
    return "sha256:" + hashlib.sha256(canonical_json(data, plain=True).encode("utf-8")).hexdigest()


@dataclass
class _State:
    enabled: bool
    version: str
    namespace: str
    images: dict[str, Any]
    depends_on: list[str]
    values: dict[str, Any]
    manifests: list[str] = field(default_factory=list)


def _base_chain(catalogue: Catalogue, overlay: Overlay) -> list[Overlay]:
    chain = [overlay]
    names = [overlay.name]
    current = overlay
    while current.base is not None:
        base = catalogue.overlays.get(current.base)
        if base is None:
            raise InputError(f"{current.where('base')}: base names unknown overlay {current.base!r}")
        if base.name in names:
            cycle = " -> ".join([*names[names.index(base.name) :], base.name])
            raise InputError(f"{current.where('base')}: base cycle: {cycle}")
        chain.append(base)
        names.append(base.name)
        current = base
    chain.reverse()
    return chain


def applied_overlays(catalogue: Catalogue, query: Criteria) -> list[Overlay]:
    """The overlays that apply to ``query``, in application order (bases before their children).

    Raises:
        InputError: a base cycle or a conflict between overlays of equal specificity.
    """
    matching = sorted(
        (o for o in catalogue.overlays.values() if not o.abstract and o.criteria.matches(query)),
        key=lambda o: (o.specificity, o.name),
    )
    chains = {o.name: _base_chain(catalogue, o) for o in matching}
    _check_conflicts(matching, chains)
    result: list[Overlay] = []
    seen: set[str] = set()
    for overlay in matching:
        for item in chains[overlay.name]:
            if item.name not in seen:
                seen.add(item.name)
                result.append(item)
    return result


def _pins(ref: ComponentRef) -> dict[str, Any]:
    pins: dict[str, Any] = {}
    if ref.version is not None:
        pins["version"] = ref.version
    if ref.namespace is not None:
        pins["namespace"] = ref.namespace
    for role, image in (ref.images or {}).items():
        pins[f"images.{role}"] = image
    return pins


def _check_conflicts(matching: list[Overlay], chains: dict[str, list[Overlay]]) -> None:
    by_specificity: dict[int, list[Overlay]] = {}
    for overlay in matching:
        by_specificity.setdefault(overlay.specificity, []).append(overlay)
    for level, group in sorted(by_specificity.items()):
        if len(group) < 2:
            continue
        pinned: dict[tuple[str, str], tuple[Any, Overlay]] = {}
        for overlay in group:
            ancestors = {o.name for o in chains[overlay.name]}
            for ref in overlay.componentRefs:
                for what, value in sorted(_pins(ref).items()):
                    key = (ref.name, what)
                    if key not in pinned:
                        pinned[key] = (value, overlay)
                        continue
                    other_value, other = pinned[key]
                    if other_value == value or other.name in ancestors:
                        continue
                    raise InputError(
                        f"conflict: overlays {other.name} ({other.where('componentRefs', ref.name)}) and "
                        f"{overlay.name} ({overlay.where('componentRefs', ref.name)}) both match with "
                        f"specificity {level} and pin {ref.name} {what} differently ({other_value!r} vs "
                        f"{value!r}); make one of them more specific or make them agree"
                    )


def _new_state(catalogue: Catalogue, name: str, provenance: Provenance) -> _State:
    spec = catalogue.components[name]
    state = _State(
        enabled=True,
        version=spec.defaultVersion,
        namespace=spec.namespace,
        images=dict(spec.images),
        depends_on=list(spec.dependsOn),
        values={},
    )
    registry = "registry.yaml"
    provenance[f"{name}.version"] = registry
    provenance[f"{name}.namespace"] = registry
    provenance[f"{name}.dependsOn"] = registry
    for role in spec.images:
        provenance[f"{name}.images.{role}"] = registry
    defaults = catalogue.component_values.get(name)
    if defaults:
        source = f"components/{name}/values.yaml"
        deep_merge(state.values, defaults, source, provenance, f"{name}.values")
    return state


def _apply_ref(state: _State, ref: ComponentRef, source: str, provenance: Provenance) -> None:
    name = ref.name
    if ref.enabled is not None:
        state.enabled = ref.enabled
        provenance[f"{name}.enabled"] = source
    if ref.version is not None:
        state.version = ref.version
        provenance[f"{name}.version"] = source
    if ref.namespace is not None:
        state.namespace = ref.namespace
        provenance[f"{name}.namespace"] = source
    if ref.images is not None:
        deep_merge(state.images, ref.images, source, provenance, f"{name}.images")
    if ref.dependsOn is not None:
        state.depends_on = list(ref.dependsOn)
        provenance[f"{name}.dependsOn"] = source
    if ref.values is not None:
        deep_merge(state.values, ref.values, source, provenance, f"{name}.values")
    if ref.manifests is not None:
        state.manifests = union(state.manifests, ref.manifests)
        provenance[f"{name}.manifests"] = source


def _get_path(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _apply_scheduling(
    catalogue: Catalogue,
    states: dict[str, _State],
    scheduling: dict[str, Any],
    provenance: Provenance,
    rank: dict[str, int],
) -> None:
    system = scheduling.get("system")
    if not isinstance(system, dict):
        return
    for kind in ("nodeSelector", "tolerations"):
        value = system.get(kind)
        if value in (None, {}, []):
            continue
        prefix = f"scheduling.system.{kind}"
        sources = [s for k, s in provenance.items() if k == prefix or k.startswith(prefix + ".")]
        source = max(sources, key=lambda s: rank.get(s, -1)) if sources else "scheduling"
        for name, state in states.items():
            if not state.enabled:
                continue
            for path in getattr(catalogue.components[name].nodeScheduling, kind):
                present, _ = _get_path(state.values, path)
                if present:
                    continue
                _set_path(state.values, path, plain_copy(value))
                provenance[f"{name}.values.{path}"] = f"{source} (scheduling.system.{kind})"


_SECTIONS = ("constraints", "thresholds", "scheduling", "fabric")
"""The sections every overlay may set, deep-merged in overlay order."""


def _merge_overlays(
    catalogue: Catalogue, overlays: list[Overlay], provenance: Provenance
) -> tuple[dict[str, _State], dict[str, dict[str, Any]]]:
    """Apply the overlays from the least to the most specific: each component's state, and the merged
    sections (constraints, thresholds, scheduling, fabric), recording who set what in ``provenance``."""
    states: dict[str, _State] = {}
    sections: dict[str, dict[str, Any]] = {section: {} for section in _SECTIONS}
    for overlay in overlays:
        for ref in overlay.componentRefs:
            state = states.get(ref.name)
            if state is None:
                state = _new_state(catalogue, ref.name, provenance)
                states[ref.name] = state
            _apply_ref(state, ref, overlay.name, provenance)
        given = (overlay.constraints, overlay.thresholds, overlay.scheduling, overlay.fabric)
        for section, value in zip(_SECTIONS, given, strict=True):
            deep_merge(sections[section], value, overlay.name, provenance, section)
    return states, sections


def _check_dependencies(
    enabled: dict[str, _State], states: dict[str, _State], overlays: list[Overlay], provenance: Provenance
) -> None:
    """Every dependsOn target of an enabled component is enabled too; else name the overlay that set it."""
    by_name = {o.name: o for o in overlays}
    for name in sorted(enabled):
        for dep in enabled[name].depends_on:
            if dep in enabled:
                continue
            source = provenance.get(f"{name}.dependsOn", "")
            where = by_name[source].where("componentRefs", name, "dependsOn") if source in by_name else source
            reason = "is disabled in this recipe" if dep in states else "is not in this recipe"
            raise InputError(f"{where}: component {name}: dependsOn target {dep!r} {reason}")


def _resolved_component(catalogue: Catalogue, name: str, state: _State, tier: int) -> ResolvedComponent:
    """One component as the recipe pins it: the catalogue's chart with the overlays' version, values,
    images and manifests."""
    spec = catalogue.components[name]
    images = {role: str(image) for role, image in sorted(state.images.items()) if image is not None}
    shipped = catalogue.manifests.get(name, {})
    return ResolvedComponent(
        name=name,
        repository=spec.repository,
        chart=spec.chart,
        version=state.version,
        namespace=state.namespace,
        release=spec.release or name,
        tier=tier,
        dependsOn=sorted(state.depends_on),
        images=images,
        values=state.values,
        manifests=[Manifest(name=m, content=shipped[m]) for m in state.manifests],
        nodeFacts=dict(spec.nodeFacts),
    )


def resolve(catalogue: Catalogue, query: Criteria) -> RecipeResult:
    """Resolve the recipe for ``query`` from ``catalogue``.

    Raises:
        InputError: a base cycle, a conflict, a dependsOn target that is not in the recipe (naming
            the overlay that set it), a dependency cycle, or no overlay matching at all.
    """
    overlays = applied_overlays(catalogue, query)
    if not overlays:
        raise InputError(
            f"{catalogue.root}: no overlay matches {query.pinned() or 'the empty query'}; "
            "add a base overlay without criteria"
        )
    rank = {o.name: index for index, o in enumerate(overlays)}
    provenance: Provenance = {}
    states, sections = _merge_overlays(catalogue, overlays, provenance)
    _apply_scheduling(catalogue, states, sections["scheduling"], provenance, rank)

    enabled = {name: state for name, state in states.items() if state.enabled}
    _check_dependencies(enabled, states, overlays, provenance)
    deployment_order, tiers = order({name: state.depends_on for name, state in enabled.items()})
    tier_of = {name: index for index, level in enumerate(tiers) for name in level}
    kept = {*enabled, *_SECTIONS}
    result = RecipeResult(
        criteria=query.as_dict(),
        appliedOverlays=[
            AppliedOverlay(
                name=o.name,
                file=o.file.removeprefix(catalogue.root + "/"),
                specificity=o.specificity,
                criteria=o.criteria.pinned(),
            )
            for o in overlays
        ],
        components=[_resolved_component(catalogue, n, enabled[n], tier_of[n]) for n in deployment_order],
        deploymentOrder=deployment_order,
        tiers=tiers,
        constraints=sections["constraints"],
        thresholds=sections["thresholds"],
        fabric=sections["fabric"],
        provenance={k: v for k, v in sorted(provenance.items()) if k.split(".", 1)[0] in kept},
    )
    result.digest = compute_digest(result)
    return result

"""Drift: the live cluster (a snapshot) against the recipe, per node and per component.

Per node (every node): OS family and version, kernel, kubelet and container runtime against the
recipe's minimums. Per GPU node: GPU product, GPU count and driver version against the recipe. Per
component: the Helm release exists, is deployed, runs the recipe's chart at the pinned version, and its
workloads run the pinned images. Node checks run column-wise with pandas, each distinct reported value
judged once, so that ten thousand nodes take well under two seconds.

Severity: ``critical`` when the cluster is below the recipe (an older driver or kernel, a missing
component, a wrong GPU); ``warning`` when it differs without being below (a newer chart or driver, an
image that differs).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from steps.cluster import vocabulary as vocab
from steps.models import Strict
from steps.runtime.names import PARTS, SCOPES
from steps.runtime.resolve import RecipeResult, ResolvedComponent
from steps.runtime.snapshot import ReleaseSnapshot, Snapshot

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "PARTS",
    "SCOPES",
    "SEVERITIES",
    "DriftReport",
    "Finding",
    "compare",
    "expected_node_facts",
    "version_key",
]

Severity = Literal["critical", "warning"]
SEVERITIES: tuple[Severity, ...] = ("warning", "critical")
"""Severities from the mildest to the worst."""


_VERSION = re.compile(r"\d+(?:\.\d+)*")


class Finding(Strict):
    """One difference between the recipe and the cluster."""

    scope: Literal["cluster", "node", "component"]
    subject: str
    field: str
    expected: str
    actual: str
    severity: Severity
    message: str


class DriftReport(Strict):
    """The result of ``dsx drift`` (kind DriftReport)."""

    apiVersion: vocab.ApiVersion = vocab.API_VERSION
    kind: Literal["DriftReport"] = "DriftReport"
    cluster: str
    recipeDigest: str
    criteria: dict[str, Any]
    checked: dict[str, int]
    drifted: bool
    summary: dict[str, int]
    driftedNodes: list[str] = Field(default_factory=list)
    driftedComponents: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)

    def fails(self, threshold: Severity = "warning") -> bool:
        """Whether a finding reaches ``threshold`` (``warning`` counts every finding)."""
        level = SEVERITIES.index(threshold)
        return any(SEVERITIES.index(f.severity) >= level for f in self.findings)


def version_key(text: str) -> tuple[int, ...] | None:
    """The first dotted number in ``text`` as a tuple (``v1.31.4`` -> ``(1, 31, 4)``), or None."""
    match = _VERSION.search(text or "")
    return tuple(int(part) for part in match.group(0).split(".")) if match else None


def _get(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def expected_node_facts(recipe: RecipeResult) -> dict[str, str]:
    """Node facts the recipe decides: components' ``nodeFacts`` read from their values, then overrides
    from ``constraints.gpu`` (for example ``driverVersion`` when the driver is preinstalled)."""
    facts: dict[str, str] = {}
    for component in recipe.components:
        for fact, path in sorted(component.nodeFacts.items()):
            value = _get(component.values, path)
            if value is not None:
                facts[fact] = str(value)
    gpu = recipe.constraints.get("gpu") or {}
    if isinstance(gpu, dict) and gpu.get("driverVersion"):
        facts["driverVersion"] = str(gpu["driverVersion"])
    return facts


def _os_family(image: str) -> str:
    text = image.lower()
    if "ubuntu" in text:
        return "ubuntu"
    if "red hat enterprise linux" in text or text.startswith("rhel"):
        return "rhel"
    return text.split(" ")[0] if text else ""


def _product_matches(product: str, wanted: str) -> bool:
    tokens = {t for t in re.split(r"[-_ ]+", product.upper()) if t}
    return wanted.upper() in tokens


# Node checks ------------------------------------------------------------------------------------------

_Judge = Callable[[str], tuple[Severity | None, str]]
"""Judges one reported value: (severity or None when fine, message)."""


def _minimum(label: str, minimum: str) -> _Judge:
    wanted = version_key(minimum)

    def judge(actual: str) -> tuple[Severity | None, str]:
        have = version_key(actual)
        if not actual or have is None:
            return "critical", f"{label} not reported (recipe needs {minimum} or later)"
        if wanted is not None and have < wanted:
            return "critical", f"{label} {actual} is older than the recipe's minimum {minimum}"
        return None, ""

    return judge


def _exact_version(label: str, expected: str) -> _Judge:
    wanted = version_key(expected)

    def judge(actual: str) -> tuple[Severity | None, str]:
        if not actual:
            return "critical", f"{label} not reported (recipe pins {expected})"
        if actual == expected:
            return None, ""
        have = version_key(actual)
        if wanted is not None and have is not None and have > wanted:
            return "warning", f"{label} {actual} is newer than the recipe's {expected}"
        if wanted is not None and have is not None and have < wanted:
            return "critical", f"{label} {actual} is older than the recipe's {expected}"
        return "critical", f"{label} {actual} differs from the recipe's {expected}"

    return judge


def _os_judge(family: str | None, minimum: str | None) -> _Judge:
    wanted = version_key(minimum) if minimum else None

    def judge(actual: str) -> tuple[Severity | None, str]:
        if family and _os_family(actual) != family:
            return "critical", f"OS {actual or '(not reported)'} is not {family}"
        if wanted is not None:
            have = version_key(actual)
            if have is None or have < wanted:
                return "warning", f"OS {actual} is older than the recipe's {family or ''} {minimum}".replace(
                    "  ", " "
                )
        return None, ""

    return judge


def _product_judge(product: str) -> _Judge:
    def judge(actual: str) -> tuple[Severity | None, str]:
        if _product_matches(actual, product):
            return None, ""
        return "critical", f"GPU {actual or '(not reported)'} is not {product}"

    return judge


def _count_judge(count: int) -> _Judge:
    def judge(actual: str) -> tuple[Severity | None, str]:
        have = int(actual) if actual.isdigit() else 0
        if have == count:
            return None, ""
        if have < count:
            return "critical", f"{have} GPUs reported, the recipe expects {count}"
        return "warning", f"{have} GPUs reported, the recipe expects {count}"

    return judge


def _node_checks(recipe: RecipeResult) -> list[tuple[str, str, str, _Judge, bool]]:
    """(field, snapshot column, expected text, judge, GPU nodes only)."""
    constraints = recipe.constraints
    checks: list[tuple[str, str, str, _Judge, bool]] = []

    def minimum(name: str) -> str | None:
        entry = constraints.get(name)
        value = entry.get("minVersion") if isinstance(entry, dict) else None
        return str(value) if value is not None else None

    os_entry = constraints.get("os") if isinstance(constraints.get("os"), dict) else {}
    family = os_entry.get("family") if os_entry else None
    os_min = minimum("os")
    if family or os_min:
        expected = " ".join(x for x in (str(family or ""), f">= {os_min}" if os_min else "") if x)
        checks.append(("os", "osImage", expected, _os_judge(family, os_min), False))
    for name, column, label in (
        ("kernel", "kernelVersion", "kernel"),
        ("kubernetes", "kubeletVersion", "kubelet"),
        ("containerd", "containerRuntimeVersion", "container runtime"),
    ):
        value = minimum(name)
        if value:
            checks.append((name, column, f">= {value}", _minimum(label, value), False))
    gpu = constraints.get("gpu") if isinstance(constraints.get("gpu"), dict) else None
    if gpu:
        if gpu.get("product"):
            product = str(gpu["product"])
            checks.append(("gpuProduct", "gpuProduct", product, _product_judge(product), True))
        if gpu.get("countPerNode"):
            count = int(gpu["countPerNode"])
            checks.append(("gpuCount", "gpuCount", str(count), _count_judge(count), True))
        driver = expected_node_facts(recipe).get("driverVersion")
        if driver:
            checks.append(("driverVersion", "driverVersion", driver, _exact_version("driver", driver), True))
    return checks


def _node_findings(snapshot: Snapshot, recipe: RecipeResult) -> tuple[list[Finding], int]:
    import pandas as pd

    nodes = snapshot.nodes
    columns = (
        "name",
        "osImage",
        "kernelVersion",
        "kubeletVersion",
        "containerRuntimeVersion",
        "gpuProduct",
        "gpuCount",
        "driverVersion",
    )
    frame = pd.DataFrame({c: [getattr(n, c) for n in nodes] for c in columns})
    frame["gpuCount"] = frame["gpuCount"].astype(str)
    gpu_node = (frame["gpuProduct"] != "") | (frame["gpuCount"] != "0")
    gpu_nodes = int(gpu_node.sum())
    parts: list[pd.DataFrame] = []
    for field, column, expected, judge, gpu_only in _node_checks(recipe):
        verdicts = {value: judge(value) for value in frame[column].unique()}
        severity = frame[column].map({k: v[0] for k, v in verdicts.items()})
        bad = severity.notna()
        if gpu_only:
            bad &= gpu_node
        if not bad.any():
            continue
        rows = frame.loc[bad, ["name", column]]
        parts.append(
            pd.DataFrame(
                {
                    "subject": rows["name"],
                    "field": field,
                    "expected": expected,
                    "actual": rows[column],
                    "severity": severity[bad],
                    "message": rows[column].map({k: v[1] for k, v in verdicts.items()}),
                }
            )
        )
    findings: list[Finding] = []
    if parts:
        table = pd.concat(parts, ignore_index=True).sort_values(["subject", "field"], kind="stable")
        findings = [
            Finding.model_construct(scope="node", **record)  # fields are all strings built above
            for record in table.to_dict("records")
        ]
    return findings, gpu_nodes


# Component checks -------------------------------------------------------------------------------------


def _split_image(reference: str) -> tuple[str, str]:
    """``repo[:tag][@digest]`` -> (repository, tag or digest)."""
    name, _, digest = reference.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        repository, tag = name[:colon], name[colon + 1 :]
    else:
        repository, tag = name, "latest"
    return repository, digest or tag


def _component_finding(
    component: ResolvedComponent, field: str, expected: str, actual: str, severity: Severity, message: str
) -> Finding:
    return Finding(
        scope="component",
        subject=component.name,
        field=field,
        expected=expected,
        actual=actual,
        severity=severity,
        message=message,
    )


def _version_finding(component: ResolvedComponent, actual: str) -> Finding | None:
    expected = component.version
    if actual.lstrip("v") == expected.lstrip("v"):
        return None
    have, wanted = version_key(actual), version_key(expected)
    newer = have is not None and wanted is not None and have > wanted
    return _component_finding(
        component,
        "chartVersion",
        expected,
        actual,
        "warning" if newer else "critical",
        f"{component.chart} {actual} is {'newer than' if newer else 'not'} the pinned {expected}",
    )


def _find_release(
    component: ResolvedComponent, snapshot: Snapshot
) -> tuple[ReleaseSnapshot | None, list[Finding]]:
    """The component's Helm release: the one in the recipe's namespace, else one of its name elsewhere
    (a warning), else none (critical)."""
    candidates = [r for r in snapshot.releases if r.name == component.release]
    release = next((r for r in candidates if r.namespace == component.namespace), None)
    if release is not None:
        return release, []
    if candidates:
        moved = candidates[0]
        message = (
            f"release {moved.name} runs in {moved.namespace}, the recipe puts it in {component.namespace}"
        )
        return moved, [
            _component_finding(
                component, "namespace", component.namespace, moved.namespace, "warning", message
            )
        ]
    expected = f"{component.chart} {component.version} in {component.namespace}"
    message = f"no Helm release {component.release} in {component.namespace}"
    return None, [_component_finding(component, "release", expected, "(absent)", "critical", message)]


def _release_findings(component: ResolvedComponent, release: ReleaseSnapshot) -> list[Finding]:
    """The release's chart, version and status against the recipe's pin."""
    findings: list[Finding] = []
    if release.chart and release.chart != component.chart:
        message = f"release {release.name} runs chart {release.chart}, not {component.chart}"
        findings.append(
            _component_finding(component, "chart", component.chart, release.chart, "critical", message)
        )
    version = _version_finding(component, release.version)
    if version is not None:
        findings.append(version)
    if release.status and release.status != "deployed":
        message = f"release {release.name} is {release.status}"
        findings.append(
            _component_finding(component, "status", "deployed", release.status, "critical", message)
        )
    return findings


def _image_findings(
    component: ResolvedComponent, release: ReleaseSnapshot, snapshot: Snapshot
) -> list[Finding]:
    """Each image the recipe pins against the tags that workloads in the release's namespace run."""
    running: dict[str, set[str]] = {}
    for image in snapshot.images:
        if image.namespace == release.namespace:
            repository, tag = _split_image(image.image)
            running.setdefault(repository, set()).add(tag)
    findings: list[Finding] = []
    for role, reference in sorted(component.images.items()):
        repository, tag = _split_image(reference)
        tags = running.get(repository)
        if tags is None:
            actual, message = "(not running)", f"no workload in {release.namespace} runs {repository}"
        elif tags != {tag}:
            actual = ", ".join(f"{repository}:{t}" for t in sorted(tags))
            message = f"{role} image runs {', '.join(sorted(tags))}, the recipe pins {tag}"
        else:
            continue
        findings.append(_component_finding(component, f"image.{role}", reference, actual, "warning", message))
    return findings


def _component_findings(snapshot: Snapshot, recipe: RecipeResult) -> list[Finding]:
    findings: list[Finding] = []
    for component in recipe.components:
        release, found = _find_release(component, snapshot)
        findings += found
        if release is not None:
            findings += _release_findings(component, release)
            findings += _image_findings(component, release, snapshot)
    return findings


def compare(snapshot: Snapshot, recipe: RecipeResult, scopes: Sequence[str] = PARTS) -> DriftReport:
    """Compare a snapshot with a recipe.

    Args:
        snapshot: what the cluster runs.
        recipe: what it should run.
        scopes: the parts to compare (:data:`PARTS`: ``nodes``, ``components`` or both).
    """
    findings: list[Finding] = []
    gpu_nodes = 0
    if "nodes" in scopes:
        node_findings, gpu_nodes = _node_findings(snapshot, recipe)
        if isinstance(recipe.constraints.get("gpu"), dict) and snapshot.nodes and gpu_nodes == 0:
            product = str(recipe.constraints["gpu"].get("product", "GPU"))
            findings.append(
                Finding(
                    scope="cluster",
                    subject=snapshot.cluster or "cluster",
                    field="gpuNodes",
                    expected=f">= 1 {product} node",
                    actual="0",
                    severity="critical",
                    message="no node reports a GPU (GPU Feature Discovery labels missing?)",
                )
            )
        findings.extend(node_findings)
    if "components" in scopes:
        findings.extend(_component_findings(snapshot, recipe))
    summary = {severity: 0 for severity in SEVERITIES}
    for finding in findings:
        summary[finding.severity] += 1
    return DriftReport(
        cluster=snapshot.cluster,
        recipeDigest=recipe.digest,
        criteria=recipe.criteria,
        checked={
            "nodes": len(snapshot.nodes) if "nodes" in scopes else 0,
            "gpuNodes": gpu_nodes,
            "components": len(recipe.components) if "components" in scopes else 0,
        },
        drifted=bool(findings),
        summary=summary,
        driftedNodes=sorted({f.subject for f in findings if f.scope == "node"}),
        driftedComponents=sorted({f.subject for f in findings if f.scope == "component"}),
        findings=findings,
    )

"""Template lookup: the entry workflow's templates and those ``templateRef`` reaches in the library."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from steps.errors import InputError

__all__ = ["WORKFLOW_KINDS", "Library", "TemplateScope", "spec_of"]

WORKFLOW_KINDS = ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate")


def spec_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The workflow spec of a Workflow, WorkflowTemplate or ClusterWorkflowTemplate."""
    spec = doc.get("spec") or {}
    if not isinstance(spec, dict):
        raise InputError(f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}: spec is not a mapping")
    return spec


@dataclass(frozen=True)
class TemplateScope:
    """One document's templates: where a template name is looked up (Argo's template scope)."""

    kind: str
    name: str
    is_entry: bool
    templates: dict[str, dict[str, Any]] = field(hash=False, compare=False)
    positions: dict[str, int] = field(hash=False, compare=False)

    @property
    def label(self) -> str:
        """How problems name the document: ``WorkflowTemplate dsx-x``."""
        return f"{self.kind} {self.name}"

    def path(self, template: str) -> str:
        """The field path of a template in its document: ``spec.templates[2]``."""
        return f"spec.templates[{self.positions.get(template, '?')}]"


def _scope(doc: Mapping[str, Any], is_entry: bool) -> TemplateScope:
    metadata = doc.get("metadata") or {}
    name = str(metadata.get("name") or str(metadata.get("generateName") or "?").rstrip("-"))
    templates: dict[str, dict[str, Any]] = {}
    positions: dict[str, int] = {}
    for index, template in enumerate(spec_of(doc).get("templates") or []):
        if isinstance(template, dict) and isinstance(template.get("name"), str):
            templates[template["name"]] = template
            positions[template["name"]] = index
    return TemplateScope(str(doc.get("kind")), name, is_entry, templates, positions)


class Library:
    """The entry workflow and the WorkflowTemplates its ``templateRef`` fields may name."""

    def __init__(self, entry: Mapping[str, Any], library: Sequence[Mapping[str, Any]] = ()) -> None:
        if entry.get("kind") not in WORKFLOW_KINDS:
            raise InputError(f"the entry is a {entry.get('kind')!r}, not a Workflow or WorkflowTemplate")
        self.entry = dict(entry)
        self.entry_scope = _scope(entry, True)
        self.documents: dict[tuple[bool, str], TemplateScope] = {}
        for doc in library:
            if doc.get("kind") in ("WorkflowTemplate", "ClusterWorkflowTemplate"):
                scope = _scope(doc, False)
                self.documents[(doc.get("kind") == "ClusterWorkflowTemplate", scope.name)] = scope
        if entry.get("kind") != "Workflow":
            key = (entry.get("kind") == "ClusterWorkflowTemplate", self.entry_scope.name)
            self.documents.setdefault(key, self.entry_scope)

    def resolve(
        self, holder: Mapping[str, Any], scope: TemplateScope
    ) -> tuple[dict[str, Any], TemplateScope]:
        """The template a task, step or hook names, and the scope its own references resolve in.

        Raises:
            KeyError: with a message naming what is missing.
        """
        if "templateRef" in holder:
            ref = holder.get("templateRef") or {}
            key = (bool(ref.get("clusterScope")), str(ref.get("name")))
            target = self.documents.get(key)
            kind = "ClusterWorkflowTemplate" if key[0] else "WorkflowTemplate"
            if target is None:
                raise KeyError(f"templateRef names {kind} {key[1]!r}, which is not in the library")
            template = target.templates.get(str(ref.get("template")))
            if template is None:
                raise KeyError(f"{kind} {key[1]!r} has no template {ref.get('template')!r}")
            return template, target
        name = holder.get("template")
        template = scope.templates.get(str(name))
        if template is None:
            raise KeyError(f"template {name!r} does not exist in {scope.label}")
        return template, scope

    def references(self, template: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """Every holder in a template that names another template, with its field path."""
        for index, task in enumerate((template.get("dag") or {}).get("tasks") or []):
            yield f"dag.tasks[{index}]", task
            if task.get("onExit"):
                yield f"dag.tasks[{index}].onExit", {"template": task["onExit"]}
        for group_index, group in enumerate(template.get("steps") or []):
            for index, step in enumerate(group or []):
                yield f"steps[{group_index}][{index}]", step
                if step.get("onExit"):
                    yield f"steps[{group_index}][{index}].onExit", {"template": step["onExit"]}

    def reachable(self, entrypoint: str, on_exit: bool = True) -> list[tuple[TemplateScope, str]]:
        """Every (scope, template name) the run can reach from ``entrypoint`` and ``onExit``, in order.

        With ``on_exit=False``, only what the entrypoint reaches (task-level ``onExit`` included).
        """
        spec = spec_of(self.entry)
        roots = [entrypoint] + ([spec["onExit"]] if spec.get("onExit") and on_exit else [])
        seen: list[tuple[TemplateScope, str]] = []
        queue = [(self.entry_scope, name) for name in roots]
        while queue:
            scope, name = queue.pop(0)
            if (scope, name) in seen or name not in scope.templates:
                continue
            seen.append((scope, name))
            for _, holder in self.references(scope.templates[name]):
                try:
                    _, target = self.resolve(holder, scope)
                except KeyError:
                    continue
                target_name = (holder.get("templateRef") or {}).get("template") or holder.get("template")
                queue.append((target, str(target_name)))
        return seen

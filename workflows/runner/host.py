"""What a local run would start as processes of this machine, and what the user must allow first.

On a cluster a container or script template runs in its image, in a pod, as the workflow's service
account. On one machine the runner starts its command here, as the user running dsx, the image
ignored. For dsx's own steps (``python -m hera.workflows.runner -e steps...:fn`` as dsx's compiled
templates run them) that is what the runner is for: the same step functions, forked from a warm
process. Any other container or script template, such as those of a workflow file of one's own
(``--file``), is a host command: a run that reaches one is refused before it starts unless the user
allows it (``--allow-host-commands``), and then the user is warned once where a value reaches shell or
script text. Argo substitutes ``{{inputs.parameters.x}}`` into ``sh -c`` text as plain text too, so the
runner does the same (a value holding ``$(...)`` runs as a command, in the pod there, on this machine
here); it never builds a shell string of its own: commands are started from argument lists.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from workflows.runner.executor import hera_entrypoint
from workflows.runner.library import Library
from workflows.runner.model import TrustedSteps
from workflows.runner.templating import tags

__all__ = [
    "ALLOW_FLAG",
    "HostTemplate",
    "dsx_step",
    "host_templates",
    "host_warning",
    "refusal",
    "trusted_steps",
]

ALLOW_FLAG = "--allow-host-commands"
"""The ``dsx run`` flag that lets a local run start host commands."""

_INTERPRETERS = re.compile(
    r"(sh|bash|dash|zsh|ksh|mksh|ash|fish|busybox|env|xargs|python[0-9.]*|perl|ruby|node|php|lua|pwsh)"
)
"""Programs whose arguments can hold code: a value substituted there may run as a command."""
_VALUE_TAGS = ("inputs.", "workflow.parameters", "workflow.status", "workflow.failures", "item", "tasks.")
"""Tags whose value comes from outside the template: parameters, items, other steps' outputs."""


def trusted_steps(documents: Iterable[Mapping[str, Any]]) -> TrustedSteps:
    """dsx's own steps, read from its compiled templates (``dsx compile``'s documents): the
    ``module:function`` entries their script templates run and every env name they set.

    Only these count as dsx's steps: Hera's runner calls any function it is named with the inputs it
    is given, so a function of ``steps`` that no template runs (a launcher, say) is not one.
    """
    entries: set[str] = set()
    names: set[str] = set()
    for document in documents:
        for _, template in _templates(document):
            script = template.get("script")
            if not isinstance(script, dict):
                continue
            entry = hera_entrypoint(script.get("command") or [], script.get("args") or [])
            if entry is not None:
                entries.add(entry)
                names.update(str(e.get("name")) for e in script.get("env") or [] if isinstance(e, dict))
    return TrustedSteps(frozenset(entries), frozenset(names))


def _templates(document: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    spec = document.get("spec") or {}
    if document.get("kind") == "CronWorkflow":
        spec = spec.get("workflowSpec") or {}
    return [(str(t.get("name")), t) for t in spec.get("templates") or [] if isinstance(t, dict)]


def _why_not_dsx(template: Mapping[str, Any], trusted: TrustedSteps) -> str | None:
    """Why a container or script template is not one of dsx's steps (None when it is one)."""
    script = template.get("script")
    if not isinstance(script, dict):
        return ""
    entry = hera_entrypoint(script.get("command") or [], script.get("args") or [])
    if entry is None or not entry.startswith("steps."):
        return ""
    if entry not in trusted.entries:
        return f"{entry} is not a function dsx's templates run"
    extra = sorted(
        str(e.get("name"))
        for e in script.get("env") or []
        if isinstance(e, dict) and str(e.get("name")) not in trusted.env
    )
    if extra:
        return f"it sets {', '.join(extra)}, which dsx's steps never set"
    return None


def dsx_step(template: Mapping[str, Any], trusted: TrustedSteps) -> bool:
    """Whether a script template runs one of dsx's own steps as dsx's templates do."""
    return _why_not_dsx(template, trusted) is None


class HostTemplate:
    """A container or script template a local run would start as a process of this machine."""

    def __init__(self, label: str, template: Mapping[str, Any], trusted: TrustedSteps) -> None:
        self.label = label
        self.kind = "script" if "script" in template else "container"
        body = template.get(self.kind) or {}
        self.image = str(body.get("image") or "?")
        self.command = [str(c) for c in body.get("command") or []]
        self.args = [str(a) for a in body.get("args") or []]
        self.reason = _why_not_dsx(template, trusted) or ""
        hera = hera_entrypoint(self.command, self.args) is not None
        # Hera's runner reads its source as the step's inputs (JSON), not as code.
        self.source = str(body.get("source") or "") if self.kind == "script" and not hera else ""
        self.inline = self.kind == "script" and not hera

    def describe(self) -> str:
        """One phrase: the template, its kind and image, and what it runs."""
        runs = shlex.join([*self.command, *self.args]) or "its image's entrypoint"
        if len(runs) > 80:
            runs = runs[:77] + "..."
        if self.inline:
            runs += " with an inline script"
        because = f"; {self.reason}" if self.reason else ""
        return f"template '{self.label}' ({self.kind}, image {self.image}: {runs}{because})"

    def substituted(self) -> list[str]:
        """The outside values this template writes into shell or script text (tags, sorted)."""
        texts = [self.source]
        argv = [*self.command, *self.args]
        if argv and "{{" in argv[0]:
            texts.append(argv[0])  # a value picks the program itself
        if argv and _INTERPRETERS.fullmatch(argv[0].rsplit("/", 1)[-1]):
            texts.extend(argv[1:])
        found = {tag for text in texts for tag in tags(text) if tag.startswith(_VALUE_TAGS)}
        return sorted(found)


def host_templates(library: Library, entrypoint: str, trusted: TrustedSteps) -> list[HostTemplate]:
    """Every container and script template the run can reach that is not one of dsx's own steps."""
    found = []
    for scope, name in library.reachable(entrypoint):
        template = scope.templates[name]
        if not ({"container", "script"} & set(template)) or dsx_step(template, trusted):
            continue
        found.append(HostTemplate(name if scope.is_entry else f"{scope.name}/{name}", template, trusted))
    return found


def refusal(hosts: list[HostTemplate]) -> str:
    """Why a run that would start host commands is refused, naming each template."""
    many = len(hosts) > 1
    return (
        f"refused before starting: {'; '.join(h.describe() for h in hosts)}. A local run would start "
        f"{'these as processes' if many else 'this as a process'} of this machine, as this user, "
        f"{'their images' if many else 'the image'} ignored: pass {ALLOW_FLAG} to run "
        f"{'them' if many else 'it'} here anyway, or submit the workflow to Argo"
    )


def host_warning(hosts: list[HostTemplate]) -> str | None:
    """The one warning of a run allowed to start host commands (None when it starts none)."""
    if not hosts:
        return None
    names = ", ".join(h.label for h in hosts)
    text = (
        f"{ALLOW_FLAG}: template{'s' if len(hosts) > 1 else ''} {names} run{'' if len(hosts) > 1 else 's'} "
        "as processes of this machine, as this user, their images ignored"
    )
    shells = [(h.label, h.substituted()) for h in hosts if h.substituted()]
    if shells:
        listed = "; ".join(f"{label}: {', '.join('{{' + t + '}}' for t in found)}" for label, found in shells)
        text += (
            f"; values reach shell or script text as Argo substitutes them ({listed}): a value holding "
            "shell syntax ($(...), `...`, ;) runs here as a command"
        )
    return text

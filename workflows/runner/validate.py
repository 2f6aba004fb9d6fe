"""Checks a workflow before the local run: every construct must be one the runner carries out.

Fields with no meaning on one machine (images, resources, node selectors, security contexts...) are
ignored; fields that would change what the workflow does and that the runner does not implement
(volumes, input artifacts, artifact repositories, ``{{=...}}`` expressions, hooks, memoization...) are
rejected with the construct and where it is: document, template name and field path.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from steps.durations import parse_duration
from workflows.runner import fields
from workflows.runner.conditions import ConditionError, parse_condition
from workflows.runner.depends import DependsError, depends_logic, task_names
from workflows.runner.errors import UnsupportedConstruct
from workflows.runner.library import Library, TemplateScope, spec_of
from workflows.runner.paths import local_path, outside_message
from workflows.runner.templating import expression_tags, walk_strings
from workflows.runner.variables import expression_problem, variable_problems

__all__ = ["check", "validate"]


class _Checker:
    def __init__(self, library: Library) -> None:
        self.library = library
        self.problems: list[str] = []
        self.main: set[tuple[TemplateScope, str]] = set()
        spec = spec_of(library.entry)
        self.workflow_params = {
            str(p.get("name"))
            for p in (spec.get("arguments") or {}).get("parameters") or []
            if isinstance(p, dict)
        }

    def add(self, scope: TemplateScope, template: str | None, path: str, what: str, hint: str = "") -> None:
        where = f"{scope.label}"
        if template is not None:
            where += f", template '{template}'"
        suffix = f" ({hint})" if hint else ""
        self.problems.append(f"{what} at {where}, {path}{suffix}")

    def unsupported(
        self, scope: TemplateScope, template: str | None, path: str, key: str, hint: str = ""
    ) -> None:
        self.add(scope, template, path, f"unsupported construct '{key}'", hint or fields.HINTS.get(key, ""))

    def keys(
        self,
        node: Any,
        scope: TemplateScope,
        template: str | None,
        path: str,
        supported: Iterable[str],
        ignored: Iterable[str] = (),
    ) -> dict[str, Any]:
        if node is None:
            return {}
        if not isinstance(node, dict):
            self.add(scope, template, path, "expected a mapping")
            return {}
        allowed = set(supported) | set(ignored)
        for key in node:
            if key not in allowed:
                self.unsupported(scope, template, f"{path}.{key}" if path else key, str(key))
        return node

    # -- the workflow spec -------------------------------------------------------------------------

    def spec(self) -> None:
        scope = self.library.entry_scope
        spec = spec_of(self.library.entry)
        self.keys(spec, scope, None, "spec", fields.SPEC_SUPPORTED, fields.SPEC_IGNORED)
        arguments = self.keys(spec.get("arguments"), scope, None, "spec.arguments", {"parameters"})
        for index, param in enumerate(arguments.get("parameters") or []):
            self.keys(
                param,
                scope,
                None,
                f"spec.arguments.parameters[{index}]",
                {"name", "value", "default", "description", "enum"},
            )
        entry = spec.get("entrypoint")
        if not entry or entry not in scope.templates:
            self.add(
                scope, None, "spec.entrypoint", f"entrypoint {entry!r} is not a template of this workflow"
            )
        if spec.get("onExit") and spec["onExit"] not in scope.templates:
            self.add(
                scope, None, "spec.onExit", f"onExit {spec['onExit']!r} is not a template of this workflow"
            )
        self.positive_int(spec.get("parallelism"), scope, None, "spec.parallelism")
        self.synchronization(spec.get("synchronization"), scope, None, "spec.synchronization")
        self.keys(
            spec.get("artifactRepositoryRef"), scope, None, "spec.artifactRepositoryRef", {"configMap", "key"}
        )
        for path, text in walk_strings({k: v for k, v in spec.items() if k != "templates"}, "spec"):
            for expr in expression_tags(text):
                self.expression(scope, None, path, expr)

    def synchronization(self, value: Any, scope: TemplateScope, template: str | None, path: str) -> None:
        """Argo v4's ``synchronization``: the runner holds ``mutexes`` (name, namespace), nothing else."""
        sync = self.keys(value, scope, template, path, {"mutexes"})
        mutexes = sync.get("mutexes")
        if mutexes is not None and not isinstance(mutexes, list):
            self.add(scope, template, f"{path}.mutexes", "expected a list")
            return
        for index, mutex in enumerate(mutexes or []):
            where = f"{path}.mutexes[{index}]"
            found = self.keys(mutex, scope, template, where, {"name", "namespace"})
            if mutex is not None and not found.get("name"):
                self.add(scope, template, where, "a mutex needs a name")

    def expression(self, scope: TemplateScope, template: str | None, path: str, expr: str) -> None:
        self.add(scope, template, path, *expression_problem(expr))

    def positive_int(self, value: Any, scope: TemplateScope, template: str | None, path: str) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.add(scope, template, path, f"{value!r} is not a positive integer")

    def duration(self, value: Any, scope: TemplateScope, template: str, path: str) -> None:
        if value is None or (isinstance(value, str) and "{{" in value):
            return  # a templated duration is read when the template runs, as Argo does
        try:
            parse_duration(value)
        except ValueError as exc:
            self.add(scope, template, path, str(exc))

    # -- one template ------------------------------------------------------------------------------

    def template(self, scope: TemplateScope, name: str) -> None:
        tmpl = scope.templates[name]
        base = scope.path(name)
        self.keys(tmpl, scope, name, base, fields.TEMPLATE_SUPPORTED, fields.TEMPLATE_IGNORED)
        self.synchronization(tmpl.get("synchronization"), scope, name, f"{base}.synchronization")
        types = [t for t in fields.TEMPLATE_TYPES if t in tmpl]
        others = [t for t in ("containerSet", "http", "plugin", "data") if t in tmpl]
        if len(types) + len(others) != 1:
            if not others:
                self.add(
                    scope,
                    name,
                    base,
                    f"a template needs exactly one of {', '.join(fields.TEMPLATE_TYPES)}"
                    f" (found {', '.join(types) or 'none'})",
                )
            return
        if others:
            return
        kind = types[0]
        self.inputs(scope, name, base, tmpl)
        self.outputs(scope, name, base, tmpl, kind)
        self.retry(scope, name, base, tmpl.get("retryStrategy"))
        self.positive_int(tmpl.get("parallelism"), scope, name, f"{base}.parallelism")
        for field in ("timeout", "activeDeadlineSeconds"):
            if field in tmpl and kind in ("dag", "steps", "suspend"):
                self.add(
                    scope,
                    name,
                    f"{base}.{field}",
                    f"'{field}' on a {kind} template has no effect in Argo",
                    "set it on the templates that run pods",
                )
            if field == "timeout" and re.fullmatch(r"[-+]?\d+", str(tmpl.get(field, "")).strip()):
                self.add(
                    scope,
                    name,
                    f"{base}.timeout",
                    f"{name} has invalid duration format in timeout",
                    "Argo refuses a bare number: write a Go duration such as 60s",
                )
                continue
            self.duration(tmpl.get(field), scope, name, f"{base}.{field}")
        if kind in ("script", "container"):
            self.container(scope, name, f"{base}.{kind}", tmpl[kind], kind)
        elif kind == "resource":
            self.resource(scope, name, f"{base}.resource", tmpl["resource"])
        elif kind == "suspend":
            suspend = self.keys(tmpl["suspend"] or {}, scope, name, f"{base}.suspend", {"duration"})
            self.duration(suspend.get("duration"), scope, name, f"{base}.suspend.duration")
        elif kind == "dag":
            self.dag(scope, name, base, tmpl)
        else:
            self.steps(scope, name, base, tmpl)
        self.variables(scope, name, base, tmpl, kind)

    def inputs(self, scope: TemplateScope, name: str, base: str, tmpl: Mapping[str, Any]) -> None:
        inputs = self.keys(tmpl.get("inputs"), scope, name, f"{base}.inputs", {"parameters"})
        for index, param in enumerate(inputs.get("parameters") or []):
            self.keys(
                param,
                scope,
                name,
                f"{base}.inputs.parameters[{index}]",
                {"name", "value", "default", "description", "enum"},
            )

    def outputs(self, scope: TemplateScope, name: str, base: str, tmpl: Mapping[str, Any], kind: str) -> None:
        outputs = self.keys(tmpl.get("outputs"), scope, name, f"{base}.outputs", {"parameters", "artifacts"})
        for index, param in enumerate(outputs.get("parameters") or []):
            path = f"{base}.outputs.parameters[{index}]"
            param = self.keys(param, scope, name, path, {"name", "valueFrom", "description", "default"})
            value_from = self.keys(
                param.get("valueFrom"),
                scope,
                name,
                f"{path}.valueFrom",
                {"parameter", "default", "path", "jsonPath"},
            )
            if "path" in value_from:
                if kind not in ("script", "container"):
                    self.unsupported(
                        scope,
                        name,
                        f"{path}.valueFrom.path",
                        "valueFrom.path",
                        f"a {kind} template has no files",
                    )
                elif local_path(str(value_from["path"])) is None:
                    self.add(scope, name, f"{path}.valueFrom.path", outside_message(str(value_from["path"])))
            if "jsonPath" in value_from and kind != "resource":
                self.unsupported(
                    scope,
                    name,
                    f"{path}.valueFrom.jsonPath",
                    "valueFrom.jsonPath",
                    "jsonPath is for resource templates",
                )
            if "parameter" in value_from and kind not in ("dag", "steps"):
                self.unsupported(
                    scope,
                    name,
                    f"{path}.valueFrom.parameter",
                    "valueFrom.parameter",
                    "valueFrom.parameter is for dag and steps templates",
                )
            if not ({"path", "jsonPath", "parameter"} & set(value_from)) and "default" not in value_from:
                self.add(
                    scope,
                    name,
                    f"{path}.valueFrom",
                    "an output parameter needs valueFrom.path, valueFrom.parameter or valueFrom.jsonPath",
                )
        for index, artifact in enumerate(outputs.get("artifacts") or []):
            path = f"{base}.outputs.artifacts[{index}]"
            artifact = self.keys(artifact, scope, name, path, {"name", "path", "optional"}, {"archive"})
            if kind not in ("script", "container"):
                self.unsupported(scope, name, path, "outputs.artifacts", f"a {kind} template has no files")
            elif local_path(str(artifact.get("path", ""))) is None:
                self.add(
                    scope, name, f"{path}.path", outside_message(str(artifact.get("path", "")), "artifacts")
                )

    def retry(self, scope: TemplateScope, name: str, base: str, retry: Any) -> None:
        if retry is None:
            return
        path = f"{base}.retryStrategy"
        retry = self.keys(retry, scope, name, path, {"limit", "retryPolicy", "backoff"}, {"affinity"})
        limit = retry.get("limit")
        if limit is not None and not re.fullmatch(r"\d+", str(limit)):
            self.add(scope, name, f"{path}.limit", f"{limit!r} is not a number of retries")
        policy = retry.get("retryPolicy")
        if policy is not None and policy not in ("Always", "OnFailure", "OnError", "OnTransientError"):
            self.add(scope, name, f"{path}.retryPolicy", f"{policy!r} is not a valid RetryPolicy")
        backoff = self.keys(
            retry.get("backoff"), scope, name, f"{path}.backoff", {"duration", "factor", "maxDuration", "cap"}
        )
        for field in ("duration", "maxDuration", "cap"):
            self.duration(backoff.get(field), scope, name, f"{path}.backoff.{field}")
        if backoff and "duration" not in backoff:
            self.add(scope, name, f"{path}.backoff", "no base duration specified for retryStrategy")
        factor = backoff.get("factor")
        if factor is not None and not re.fullmatch(r"\d+", str(factor)):
            self.add(scope, name, f"{path}.backoff.factor", f"{factor!r} is not an integer factor")

    def container(self, scope: TemplateScope, name: str, path: str, body: Any, kind: str) -> None:
        supported = fields.CONTAINER_SUPPORTED
        if kind != "script":
            supported = supported - {"source"}
        body = self.keys(body, scope, name, path, supported, fields.CONTAINER_IGNORED)
        for index, env in enumerate(body.get("env") or []):
            self.keys(env, scope, name, f"{path}.env[{index}]", {"name", "value"})
        command = body.get("command") or []
        if not command:
            self.unsupported(
                scope,
                name,
                f"{path}.command",
                "image entrypoint",
                "give the template an explicit command to run it locally",
            )
            return
        program = str(command[0])
        if "{{" not in program and program not in ("python", "python3") and shutil.which(program) is None:
            self.add(
                scope, name, f"{path}.command[0]", f"command {program!r} is not available on this machine"
            )
        if kind == "script" and "source" not in body:
            self.add(scope, name, path, "a script template needs a source")

    def resource(self, scope: TemplateScope, name: str, path: str, body: Any) -> None:
        body = self.keys(
            body,
            scope,
            name,
            path,
            {"action", "manifest", "successCondition", "failureCondition", "mergeStrategy"},
            {"setOwnerReference"},
        )
        action = body.get("action")
        if action not in ("get", "create", "apply", "patch", "delete"):
            self.unsupported(
                scope,
                name,
                f"{path}.action",
                f"action {action!r}",
                "the local runner carries out get, create, apply, patch and delete",
            )
        if "manifest" not in body:
            self.add(scope, name, f"{path}.manifest", "a resource template needs a manifest")
        strategy = body.get("mergeStrategy")
        if strategy is not None and strategy not in ("strategic", "merge"):
            self.unsupported(
                scope, name, f"{path}.mergeStrategy", f"mergeStrategy {strategy!r}", "use merge or strategic"
            )
        for field in ("successCondition", "failureCondition"):
            if field in body:
                try:
                    parse_condition(str(body[field]))
                except ConditionError as exc:
                    self.add(scope, name, f"{path}.{field}", str(exc))

    def holder(
        self, scope: TemplateScope, name: str, path: str, holder: Mapping[str, Any], extra: set[str]
    ) -> None:
        self.keys(holder, scope, name, path, fields.TASK_KEYS | extra)
        if ("template" in holder) == ("templateRef" in holder):
            if "inline" not in holder:
                self.add(scope, name, path, "a task or step needs exactly one of template and templateRef")
            return
        if "templateRef" in holder:
            ref = self.keys(
                holder["templateRef"],
                scope,
                name,
                f"{path}.templateRef",
                {"name", "template", "clusterScope"},
            )
            if not ref.get("name") or not ref.get("template"):
                self.add(scope, name, f"{path}.templateRef", "templateRef needs name and template")
                return
        try:
            self.library.resolve(holder, scope)
        except KeyError as exc:
            self.add(scope, name, path, str(exc.args[0]))
        if holder.get("onExit"):
            try:
                self.library.resolve({"template": holder["onExit"]}, scope)
            except KeyError as exc:
                self.add(scope, name, f"{path}.onExit", str(exc.args[0]))
        arguments = self.keys(holder.get("arguments"), scope, name, f"{path}.arguments", {"parameters"})
        for index, param in enumerate(arguments.get("parameters") or []):
            self.keys(param, scope, name, f"{path}.arguments.parameters[{index}]", {"name", "value"})
            if isinstance(param, dict) and "value" not in param:
                self.add(
                    scope,
                    name,
                    f"{path}.arguments.parameters[{index}]",
                    f"argument {param.get('name')!r} has no value",
                )
        self.keys(holder.get("continueOn"), scope, name, f"{path}.continueOn", {"error", "failed"})
        if "withItems" in holder and not isinstance(holder["withItems"], list):
            self.add(scope, name, f"{path}.withItems", "withItems must be a list")
        if "withParam" in holder and not isinstance(holder["withParam"], str):
            self.add(scope, name, f"{path}.withParam", "withParam must be a string (a JSON list)")
        if "withItems" in holder and "withParam" in holder:
            self.add(scope, name, path, "only one of withItems and withParam may be set")

    def dag(self, scope: TemplateScope, name: str, base: str, tmpl: Mapping[str, Any]) -> None:
        dag = self.keys(tmpl["dag"], scope, name, f"{base}.dag", {"tasks", "target", "failFast"})
        tasks = [t for t in dag.get("tasks") or [] if isinstance(t, dict)]
        names = [str(t.get("name")) for t in tasks]
        for duplicate in sorted({n for n in names if names.count(n) > 1}):
            self.add(scope, name, f"{base}.dag.tasks", f"task name {duplicate!r} is not unique")
        continue_on = {str(t.get("name")): t.get("continueOn") or {} for t in tasks}
        if any("depends" in t for t in tasks) and any("dependencies" in t for t in tasks):
            self.add(scope, name, f"{base}.dag.tasks", "cannot use both depends and dependencies in one DAG")
        if any("depends" in t for t in tasks):
            # Argo refuses it (validate.go, validateDAG; the CRD's rule on each task): with depends, a
            # dependent says which phases it accepts (task.Failed, task.Errored).
            for index, task in enumerate(tasks):
                if task.get("continueOn") is not None:
                    self.add(
                        scope, name, f"{base}.dag.tasks[{index}].continueOn",
                        "cannot use continueOn when using depends: use task.Failed / task.Errored in the "
                        "dependent's depends instead",
                    )  # fmt: skip
        graph: dict[str, list[str]] = {}
        for index, task in enumerate(tasks):
            path = f"{base}.dag.tasks[{index}]"
            self.holder(scope, name, path, task, {"dependencies", "depends"})
            if "depends" in task and "dependencies" in task:
                self.add(scope, name, path, "use either depends or dependencies, not both")
            try:
                deps = task_names(depends_logic(task, continue_on))
            except DependsError as exc:
                self.add(scope, name, f"{path}.depends", str(exc))
                deps = []
            for dep in deps:
                if dep not in names:
                    self.add(scope, name, f"{path}.depends", f"depends on unknown task {dep!r}")
            graph[str(task.get("name"))] = [d for d in deps if d in names]
        for target in str(dag.get("target") or "").split():
            if target not in names:
                self.add(scope, name, f"{base}.dag.target", f"target {target!r} is not a task of this dag")
        cycle = _find_cycle(graph)
        if cycle:
            self.add(scope, name, f"{base}.dag.tasks", "dependency cycle: " + " -> ".join(cycle))

    def steps(self, scope: TemplateScope, name: str, base: str, tmpl: Mapping[str, Any]) -> None:
        groups = tmpl.get("steps")
        if not isinstance(groups, list):
            self.add(scope, name, f"{base}.steps", "steps must be a list of lists")
            return
        seen: set[str] = set()
        for group_index, group in enumerate(groups):
            if not isinstance(group, list):
                self.add(scope, name, f"{base}.steps[{group_index}]", "a step group must be a list")
                continue
            for index, step in enumerate(group):
                path = f"{base}.steps[{group_index}][{index}]"
                if not isinstance(step, dict):
                    self.add(scope, name, path, "a step must be a mapping")
                    continue
                self.holder(scope, name, path, step, set())
                if step.get("name") in seen:
                    self.add(scope, name, path, f"step name {step.get('name')!r} is not unique")
                seen.add(str(step.get("name")))

    def variables(
        self, scope: TemplateScope, name: str, base: str, tmpl: Mapping[str, Any], kind: str
    ) -> None:
        before_exit = (scope, name) in self.main
        for path, what, hint in variable_problems(tmpl, base, kind, self.workflow_params, before_exit):
            self.add(scope, name, path, what, hint)

    def run(self, entrypoint: str | None) -> None:
        spec = spec_of(self.library.entry)
        start = entrypoint or spec.get("entrypoint")
        if start in self.library.entry_scope.templates:
            # Argo validates these before the exit handler, without {{workflow.failures}} in scope.
            self.main = set(self.library.reachable(str(start), on_exit=False))
        self.spec()
        scope = self.library.entry_scope
        checked: set[tuple[TemplateScope, str]] = set()
        for name in scope.templates:
            self.template(scope, name)
            checked.add((scope, name))
        if entrypoint and entrypoint not in scope.templates:
            self.add(scope, None, "entrypoint", f"template {entrypoint!r} does not exist in {scope.label}")
        if start in scope.templates:
            for target_scope, name in self.library.reachable(str(start)):
                if (target_scope, name) not in checked and not target_scope.is_entry:
                    self.template(target_scope, name)
                    checked.add((target_scope, name))


def _find_cycle(graph: Mapping[str, list[str]]) -> list[str]:
    state: dict[str, int] = {}
    trail: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        trail.append(node)
        for dep in graph.get(node, []):
            if state.get(dep) == 1:
                return [*trail[trail.index(dep) :], dep]
            if state.get(dep) is None and (found := visit(dep)):
                return found
        trail.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if state.get(node) is None and (found := visit(node)):
            return found
    return []


def check(
    entry: Mapping[str, Any], library: Sequence[Mapping[str, Any]] = (), entrypoint: str | None = None
) -> list[str]:
    """Every problem that keeps the local runner from running ``entry`` (empty when it can run)."""
    checker = _Checker(Library(entry, library))
    checker.run(entrypoint)
    return checker.problems


def validate(
    entry: Mapping[str, Any], library: Sequence[Mapping[str, Any]] = (), entrypoint: str | None = None
) -> None:
    """Raise :class:`UnsupportedConstruct` naming every construct the runner cannot carry out, and where."""
    problems = check(entry, library, entrypoint)
    if problems:
        raise UnsupportedConstruct(problems)

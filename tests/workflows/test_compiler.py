"""The compiler: one YAML file per object, deterministic, checked, linted for the Argo UI."""

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from hera.workflows import DAG

from steps.durations import parse_duration
from steps.errors import InputError
from tests import yamltext
from tests.cli import dsx_here
from tests.paths import CHART, REPO, shared_path
from tests.workflows.fixtures.demo_steps import greet
from workflows import compiler
from workflows.templates._base import STARTUP_ALLOWANCE, step, workflow_template

DEMO = "tests.workflows.fixtures.demo_templates"


def test_every_dsx_workflow_compiles_to_its_committed_yaml() -> None:
    files = compiler.compile_objects()
    assert compiler.check(files, CHART / "files") == []


def test_compiled_files_pass_validate_manifests() -> None:
    tool = shared_path("tools", "validate-manifests")
    files = sorted((CHART / "files").glob("*.yaml"))
    assert files, "no compiled dsx workflow: run dsx compile"
    result = subprocess.run(
        [sys.executable, str(tool), *map(str, files)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compile_writes_one_kebab_case_file_per_object_byte_identical(tmp_path: Path) -> None:
    files = compiler.compile_objects([DEMO])
    compiler.write(files, tmp_path)
    first = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert list(first) == ["workflow-template-dsx-demo.yaml"]
    assert compiler.write(compiler.compile_objects([DEMO]), tmp_path) == []
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == first


def _fresh() -> tuple[tuple[str, dict[str, Any]], ...]:
    return tuple((f.filename, f.manifest) for f in compiler.compile_objects())


def test_a_process_reads_the_documents_an_earlier_one_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = _fresh()
    assert compiler.cached_compile(tmp_path) == fresh
    (kept,) = tmp_path.glob("*.json")
    assert kept.stem == compiler.source_digest()

    def compile_again(*_: Any) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(compiler, "compile_objects", compile_again)
    again = compiler.cached_compile(tmp_path)
    assert again == fresh
    assert json.dumps(again) == json.dumps(fresh)  # every mapping's keys in the same order


@pytest.mark.parametrize("text", ["{", "", "[]", "{}", '[["a.yaml"]]', '[["a.yaml", {}], [1, {}]]'])
def test_a_kept_compilation_that_is_not_one_is_compiled_again_and_replaced(tmp_path: Path, text: str) -> None:
    fresh = _fresh()
    kept = tmp_path / f"{compiler.source_digest()}.json"
    kept.write_text(text)
    assert compiler.cached_compile(tmp_path) == fresh
    assert [name for name, _ in json.loads(kept.read_text())] == [name for name, _ in fresh]


def test_the_cache_key_follows_every_module_and_the_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("X = 1\n")
    first = compiler.source_digest([package])
    assert compiler.source_digest([package]) == first
    (package / "a.py").write_text("X = 2\n")
    second = compiler.source_digest([package])
    (package / "sub" / "b.py").write_text("")
    third = compiler.source_digest([package])
    (package / "sub" / "b.py").rename(package / "sub" / "c.py")
    fourth = compiler.source_digest([package])
    (package / "notes.txt").write_text("not a module")
    assert len({first, second, third, fourth}) == 4
    assert compiler.source_digest([package]) == fourth
    assert compiler.source_digest() != fourth  # dsx's own packages
    versions = {"hera": metadata.version("hera"), "pydantic": metadata.version("pydantic")}
    for name in versions:
        monkeypatch.setattr(
            metadata, "version", lambda n, bumped=name: versions[n] + ("1" if n == bumped else "")
        )
        assert compiler.source_digest([package]) != fourth, name


def test_the_cache_keeps_the_newest_compilations_and_a_folder_it_cannot_write_only_costs_time(
    tmp_path: Path,
) -> None:
    fresh = _fresh()
    for number in range(12):
        old = tmp_path / f"old-{number:02d}.json"
        old.write_text("[]")
        os.utime(old, (1_000_000 + number, 1_000_000 + number))
    assert compiler.cached_compile(tmp_path) == fresh
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(
        [f"{compiler.source_digest()}.json", *(f"old-{n:02d}.json" for n in range(5, 12))]
    )
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert compiler.cached_compile(blocked / "compiled") == fresh
    assert compiler.cached_compile(None) == fresh


def test_without_the_versions_to_key_on_the_workflows_are_compiled_and_nothing_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert compiler.cached_compile(tmp_path) == _fresh()
    assert list(tmp_path.iterdir()) == []


_OPENED = """
import builtins, io, json, os, sys
opened = []
def spy(open_):
    def wrapped(file, *args, **kwargs):
        opened.append(os.fspath(file) if not isinstance(file, int) else "")
        return open_(file, *args, **kwargs)
    return wrapped
io.open = builtins.open = spy(io.open)
from workflows.compiler import compile_objects
compile_objects()
print(json.dumps(opened))
"""


@pytest.mark.story
def test_compiling_reads_no_file_but_modules_so_the_cache_key_covers_all_it_reads() -> None:
    """The cache's key is the modules of ``steps`` and ``workflows`` (:func:`compiler.source_digest`): a
    template that read a data file of the checkout (a recipe's YAML, say) as it compiles would need the
    key to cover it, or a kept compilation would outlive a change to that file. Every file a new process
    opens while it imports the templates and compiles them is a module or package metadata."""
    result = subprocess.run(
        [sys.executable, "-c", _OPENED], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert result.returncode == 0, result.stderr
    opened = [Path(p).resolve() for p in json.loads(result.stdout.splitlines()[-1]) if p]
    installed = Path(sys.prefix).resolve()  # the environment's packages (a checkout may hold its venv)
    read = [
        p
        for p in opened
        if p.is_file()
        and p.is_relative_to(REPO)
        and not p.is_relative_to(installed)
        and p.suffix not in (".py", ".pyc")
    ]
    assert [p for p in read if not p.parent.name.endswith(".egg-info")] == []  # but dsx's own metadata


@pytest.mark.story
def test_a_run_of_dsx_workflows_compiles_them_in_the_first_process_only(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "workflows.cli", "run", "certify", "--dry-run", "-o", "json"]
    first = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert first.returncode == 0, first.stderr
    (kept,) = (tmp_path / "dsx" / "compiled").glob("*.json")
    said = "Label selector of the nodes to certify"
    assert said in kept.read_text()
    kept.write_text(kept.read_text().replace(said, "As kept: the nodes to certify"))
    second = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    # the second process read the kept compilation (the change made there shows) and wrote nothing new
    assert second.returncode == 0, second.stderr

    def described(out: str) -> str:
        return str(next(p["description"] for p in json.loads(out)["parameters"] if p["name"] == "nodes"))

    assert described(first.stdout).startswith(said)
    assert described(second.stdout).startswith("As kept: the nodes to certify")
    assert len(list((tmp_path / "dsx" / "compiled").glob("*.json"))) == 1


def test_script_steps_run_through_heras_runner_with_the_default_image(tmp_path: Path) -> None:
    (compiled,) = compiler.compile_objects([DEMO])
    doc = yamltext.load(compiled.text)
    greet = next(t for t in doc["spec"]["templates"] if t["name"] == "greet")
    assert greet["script"]["args"] == [
        "-m",
        "hera.workflows.runner",
        "-e",
        "tests.workflows.fixtures.demo_steps:greet",
    ]
    assert greet["script"]["source"] == "{{inputs.parameters}}"
    assert doc["metadata"]["annotations"]["workflows.argoproj.io/description"]
    word = next(p for p in doc["spec"]["arguments"]["parameters"] if p["name"] == "word")
    assert word["enum"] == ["hello", "goodbye"]


def test_check_names_missing_stale_and_undeclared_files(tmp_path: Path) -> None:
    files = compiler.compile_objects([DEMO])
    assert compiler.check(files, tmp_path) == [
        f"{tmp_path}/workflow-template-dsx-demo.yaml: missing (declared in {DEMO})"
    ]
    compiler.write(files, tmp_path)
    target = tmp_path / "workflow-template-dsx-demo.yaml"
    target.write_text(target.read_text().replace("hello", "hi"))
    (tmp_path / "workflow-template-old.yaml").write_text("kind: WorkflowTemplate\n")
    problems = compiler.check(files, tmp_path)
    assert any("workflow-template-dsx-demo.yaml: stale" in p for p in problems)
    assert any("workflow-template-old.yaml: not declared" in p for p in problems)
    compiler.write(files, tmp_path)
    assert compiler.check(files, tmp_path) == []
    assert not (tmp_path / "workflow-template-old.yaml").exists()


def test_lint_rejects_templates_the_argo_ui_cannot_explain() -> None:
    with pytest.raises(InputError) as info:
        compiler.compile_objects(["tests.workflows.fixtures.bad_templates"])
    message = str(info.value)
    assert "dsx-bad: missing the workflows.argoproj.io/description annotation" in message
    assert "parameter 'nodes' has no description" in message
    assert "expression tag '{{=' at spec.templates[0].dag.tasks[0].arguments.parameters[0].value" in message


def test_a_misspelt_workflow_parameter_fails_the_compile_naming_it() -> None:
    """A typo such as ``group-lable`` fails ``dsx compile`` (exit 2), whether written by hand or asked of
    Hera, instead of reaching Argo as a tag it cannot resolve."""
    with pytest.raises(InputError) as by_hand:
        compiler.compile_objects(["tests.workflows.fixtures.misnamed_templates"])
    assert (
        "dsx-misnamed: {{workflow.parameters.group-lable}} at spec.templates[0].dag.tasks[0].arguments"
        ".parameters[1].value names no parameter of the workflow (group-label)"
    ) in str(by_hand.value)
    with pytest.raises(InputError) as by_accessor:
        compiler.compile_objects(["tests.workflows.fixtures.misnamed_accessor_templates"])
    assert str(by_accessor.value) == (
        "tests.workflows.fixtures.misnamed_accessor_templates: "
        "`group-lable` is not a valid workflow parameter"
    )


def test_a_parameter_whose_default_is_not_in_its_enum_is_refused() -> None:
    manifest = {
        "kind": "WorkflowTemplate",
        "metadata": {"name": "dsx-x", "annotations": {"workflows.argoproj.io/description": "x"}},
        "spec": {
            "arguments": {
                "parameters": [{"name": "scope", "description": "x", "value": "al", "enum": ["all", "nodes"]}]
            },
            "templates": [],
        },
    }
    assert compiler.lint(manifest, "mod") == [
        "mod: WorkflowTemplate dsx-x: parameter 'scope' defaults to 'al', not one of its enum (all, nodes)"
    ]


def test_a_parameter_without_a_default_has_no_value_so_argo_asks_for_one() -> None:
    """Hera writes a value of None as the text 'null': a submission without -p node would remediate a
    node named "null". Without a value, Argo refuses the submission until one is given."""
    remediate = yamltext.load((CHART / "files" / "workflow-template-dsx-remediate.yaml").read_text())
    node = next(p for p in remediate["spec"]["arguments"]["parameters"] if p["name"] == "node")
    assert "value" not in node
    for path in sorted((CHART / "files").glob("*.yaml")):
        assert "'null'" not in path.read_text(), path.name


def test_step_modules_with_postponed_annotations_are_refused() -> None:
    namespace: dict[str, object] = {}
    exec("from __future__ import annotations\ndef f(x: int) -> int:\n    return x\n", namespace)
    with pytest.raises(InputError, match="from __future__ import annotations"):
        step(namespace["f"])  # type: ignore[arg-type]


@pytest.mark.story
def test_compile_check_cli_exits_1_naming_the_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "files"
    code, _, err = dsx_here(capsys, "compile", "--out", str(out))
    assert code == 0, err
    assert dsx_here(capsys, "compile", "--out", str(out), "--check")[0] == 0
    victims = sorted(out.glob("*.yaml"))
    if not victims:
        (out / "workflow-template-dsx-stray.yaml").write_text("kind: WorkflowTemplate\n")
        expected = "workflow-template-dsx-stray.yaml"
    else:
        victims[0].write_text(victims[0].read_text() + "# edited by hand\n")
        expected = victims[0].name
    code, _, err = dsx_here(capsys, "compile", "--out", str(out), "--check")
    assert code == 1 and expected in err, err


def test_every_step_template_and_task_is_named_after_its_step_function() -> None:
    """What the Argo UI and ``argo get`` show is the step function's own name; a template called twice in
    one DAG (the group check, on the whole set) names its second task for what it checks; a template
    calling itself names its tasks for what they take."""
    for compiled in compiler.compile_objects():
        if compiled.manifest["kind"] in ("EventSource", "Sensor"):
            continue  # Argo Events objects: no templates
        spec = compiled.manifest["spec"].get("workflowSpec", compiled.manifest["spec"])
        for template in spec["templates"]:
            if "script" in template:
                function = template["script"]["args"][-1].split(":")[1]
                assert template["name"] == function.replace("_", "-"), compiled.filename
            called: set[str] = set()
            for task in template.get("dag", {}).get("tasks", []):
                called_name = task.get("template")
                if called_name is None or called_name == template["name"]:
                    continue  # a templateRef names another workflow's; a recursive call names its half
                if called_name not in called:
                    assert task["name"] == called_name, f"{compiled.filename}: {task['name']}"
                called.add(called_name)


def test_lint_rejects_two_templates_with_one_name() -> None:
    manifest = {
        "kind": "WorkflowTemplate",
        "metadata": {"name": "dsx-x", "annotations": {"workflows.argoproj.io/description": "x"}},
        "spec": {"templates": [{"name": "greet", "dag": {"tasks": []}}, {"name": "greet", "script": {}}]},
    }
    assert compiler.lint(manifest, "mod") == [
        "mod: WorkflowTemplate dsx-x: two templates are named 'greet' (a task would call the wrong one)"
    ]


def _template_of(obj: Any, name: str) -> dict[str, Any]:
    manifest = compiler.render(obj, "tests").manifest
    spec = manifest["spec"].get("workflowSpec", manifest["spec"])
    return next(t for t in spec["templates"] if t["name"] == name)


def _wrapped(script: Any) -> Any:
    with workflow_template("dsx-demo", "A demo.", "main") as wt, DAG(name="main"):
        script(name="s")
    return wt


def test_a_steps_timeout_bounds_its_work_not_its_wait_for_a_node() -> None:
    template = _template_of(_wrapped(step(greet, timeout="1m")), "greet")
    # The kubelet counts activeDeadlineSeconds once the pod is on a node; Argo's `timeout` would also
    # count the wait for a node and (set together) replace the pod's own deadline.
    assert "timeout" not in template
    assert template["activeDeadlineSeconds"] == 60 + parse_duration(STARTUP_ALLOWANCE)

    bounded = _template_of(_wrapped(step(greet, timeout="1m", pending="30m")), "greet")
    assert bounded["timeout"] == f"{31 + int(parse_duration(STARTUP_ALLOWANCE)) // 60}m"
    assert "activeDeadlineSeconds" not in bounded
    with pytest.raises(InputError, match="step greet: 'pending'"):
        step(greet, pending="30m")
    with pytest.raises(InputError, match="step greet: timeout: invalid duration"):
        step(greet, timeout="soon")


def test_steps_retry_infrastructure_errors_with_a_backoff_and_never_a_failure() -> None:
    template = _template_of(_wrapped(step(greet, retries=3)), "greet")
    strategy = template["retryStrategy"]
    assert strategy["limit"] == 3 and strategy["retryPolicy"] == "OnError"
    assert parse_duration(strategy["backoff"]["duration"]) > 0 and int(strategy["backoff"]["factor"]) > 1
    assert "retryStrategy" not in _template_of(_wrapped(step(greet)), "greet")


def test_workflows_run_as_their_own_account_with_restricted_pods_and_collected() -> None:
    spec = compiler.render(_wrapped(step(greet)), "tests").manifest["spec"]
    assert spec["serviceAccountName"] == "dsx-demo"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["podGC"] == {"strategy": "OnPodSuccess", "deleteDelayDuration": "10m"}
    assert spec["ttlStrategy"]["secondsAfterFailure"] >= spec["ttlStrategy"]["secondsAfterSuccess"] > 0
    container = spec["templates"][1]["script"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert container["resources"]["limits"] == {"memory": "1Gi"}


def test_a_template_reached_through_template_ref_reads_only_parameters_its_caller_declares() -> None:
    """Under a templateRef, ``{{workflow.parameters.X}}`` is the calling Workflow's parameter: dsx-remediate
    runs dsx-certify's ``certify`` DAG, so it must declare every parameter that DAG (and what it calls)
    reads. Taking one away from dsx-remediate fails the check, naming it."""
    manifests = [(f.manifest, f.source) for f in compiler.compile_objects()]
    assert compiler.lint_references(manifests) == []
    remediate = next(
        m for m, _ in manifests if (m["kind"], m["metadata"]["name"]) == ("WorkflowTemplate", "dsx-remediate")
    )
    declared = remediate["spec"]["arguments"]["parameters"]
    remediate["spec"]["arguments"]["parameters"] = [p for p in declared if p["name"] != "p-min"]
    assert compiler.lint_references(manifests) == [
        "workflows.templates.remediate: WorkflowTemplate dsx-remediate: templateRef dsx-certify/certify "
        "reads {{workflow.parameters.p-min}}, which this workflow does not declare (under a templateRef "
        "they are the caller's)"
    ]

"""DAG semantics: recursion, depends logic, when and skipped outputs, fan-out, templateRef."""

import json

from tests.workflows.runner.conftest import RunFixture, by_name, printed, shell, workflow
from workflows.runner import Phase, check
from workflows.runner.engine import DEPTH_MESSAGE, node_id


def test_recursive_dag_bisects_a_list_down_to_single_items(run_fixture: RunFixture) -> None:
    result = run_fixture("bisect.yaml", "dsx-fixture-bisect", {"items": '["n0", "n1", "n2", "n3", "n4"]'})
    assert result.phase is Phase.Succeeded
    leaves = [n for n in result.nodes.values() if n.template_name == "leaf" and n.phase is Phase.Succeeded]
    assert sorted(printed(result, n) for n in leaves) == ["n0", "n1", "n2", "n3", "n4"]
    # each leaf kept its artifact in the run folder
    for leaf in leaves:
        (artifact,) = leaf.outputs["artifacts"]
        assert (result.run_dir / artifact["path"]).read_text() == printed(result, leaf)
    assert {printed(result, n): n.name for n in leaves} == {
        "n0": "wf.left.left.leaf",
        "n1": "wf.left.right.leaf",
        "n2": "wf.right.left.leaf",
        "n3": "wf.right.right.left.leaf",
        "n4": "wf.right.right.right.leaf",
    }
    skipped = [n for n in result.nodes.values() if n.phase is Phase.Skipped]
    assert all(n.message.startswith("when '") and n.message.endswith("' evaluated false") for n in skipped)


def test_node_ids_and_pod_names_follow_argo(run_fixture: RunFixture) -> None:
    result = run_fixture("bisect.yaml", "dsx-fixture-bisect", {"items": '["a"]'})
    split = result.node("split")
    assert split.id == node_id("wf", "wf.split") and split.id.startswith("wf-")
    assert split.pod_name is not None and split.pod_name.startswith("wf-split-")
    assert result.root_id == "wf"


def test_depends_runs_error_handlers_and_omits_the_rest(run_fixture: RunFixture) -> None:
    result = run_fixture("depends.yaml", "dsx-fixture-depends")
    phases = {n.display_name: n.phase for n in result.nodes.values() if n.id != result.root_id}
    assert phases == {
        "A": Phase.Failed,  # fails
        "B": Phase.Succeeded,  # depends: A.Failed
        "C": Phase.Omitted,  # depends: A (A.Succeeded || A.Skipped || A.Daemoned)
        "D": Phase.Succeeded,  # (B.Succeeded || C.Succeeded) && !C.Succeeded
    }
    assert result.node("C").message == "omitted: depends condition not met"
    assert printed(result, result.node("D")) == "B Succeeded, C Omitted"  # {{tasks.X.status}}
    # A's failure is handled by B: the DAG succeeds, as in Argo
    assert result.phase is Phase.Succeeded


def test_continue_on_lets_dependencies_run_and_the_dag_succeed(run_fixture: RunFixture) -> None:
    result = run_fixture("depends.yaml", "dsx-fixture-depends", entrypoint="continue-on")
    phases = {n.display_name: n.phase for n in result.nodes.values() if n.id != result.root_id}
    assert phases == {
        "E": Phase.Failed,  # continueOn: failed
        "F": Phase.Succeeded,  # dependencies: [E], allowed by E's continueOn
        "errs-allowed": Phase.Error,  # continueOn: error
        "after-allowed-error": Phase.Succeeded,
    }
    assert result.phase is Phase.Succeeded


def test_an_omitted_leaf_inherits_the_failure_of_its_branch(run_fixture: RunFixture) -> None:
    result = run_fixture("depends.yaml", "dsx-fixture-depends", entrypoint="unhandled")
    assert result.node("B").phase is Phase.Omitted
    assert result.node("C").phase is Phase.Succeeded
    assert result.phase is Phase.Failed
    assert result.message == f"child '{result.node('A').id}' failed"


def test_when_skips_a_branch_and_later_tasks_read_its_output_defaults(run_fixture: RunFixture) -> None:
    result = run_fixture("when-default.yaml", "dsx-fixture-when", {"side": "heads"})
    assert result.phase is Phase.Succeeded
    assert result.node("heads").phase is Phase.Succeeded
    tails = result.node("tails")
    assert tails.phase is Phase.Skipped
    assert tails.message == "when 'heads == tails' evaluated false"
    # the skipped task's output parameter resolves to its valueFrom.default ...
    assert printed(result, result.node("report-tails")) == "tails said nobody"
    # ... and an argument that is only a reference to one without a default is an absent optional:
    # the consumer's input default applies
    assert printed(result, result.node("report-default")) == "no result"


def test_fan_out_with_items_and_param_aggregates_results(run_fixture: RunFixture) -> None:
    result = run_fixture("items.yaml", "dsx-fixture-items", {"count": "3"})
    assert result.phase is Phase.Succeeded
    words = result.node("words")
    assert words.type == "TaskGroup"
    assert [result.nodes[c].display_name for c in words.children] == [
        "words(0:alpha)",
        "words(1:beta)",
        "words(2:gamma)",
    ]
    assert printed(result, by_name(result, "maps(1:name:b,size:2)")[0]) == "b=2"
    squares = result.node("squares")
    assert len(squares.children) == 3
    total = printed(result, result.node("total"))
    squares_json, words_json = total.split(" ")
    assert json.loads(squares_json) == [{"index": i, "square": i * i} for i in range(3)]
    assert json.loads(words_json) == ["alpha", "beta", "gamma"]
    none = result.node("none")
    assert (none.phase, none.message) == (Phase.Skipped, "Skipped, empty params")


def test_template_ref_reaches_templates_of_the_library(run_fixture: RunFixture) -> None:
    result = run_fixture("templateref.yaml", "dsx-fixture-templateref")
    assert result.phase is Phase.Succeeded
    shout = result.node("shout")
    assert shout.template_ref == {"name": "dsx-fixture-library", "template": "shout"}
    assert shout.outputs["parameters"] == [{"name": "said", "value": "hello!"}]
    assert printed(result, result.node("echo-back")) == "hello!"


def test_recursion_stops_at_argos_depth_limit(run_fixture: RunFixture) -> None:
    result = run_fixture("recursion.yaml", "dsx-fixture-recursion")
    assert result.phase is Phase.Error
    errors = [n for n in result.nodes.values() if n.message == DEPTH_MESSAGE]
    assert len(errors) == 1
    assert "maximum recursion depth exceeded" in errors[0].message.lower()
    assert errors[0].name.count(".again") == 99  # the root is depth 1: its 99th nested call is depth 100


def test_depends_results_for_errors_skips_omissions_and_fan_outs(run_fixture: RunFixture) -> None:
    result = run_fixture("depends.yaml", "dsx-fixture-depends", entrypoint="results")
    phases = {n.display_name: n.phase for n in result.nodes.values() if n.type != "Pod" or "(" not in n.name}
    assert result.node("errs").message == (
        "wait: Error (exit code 64): "
        "open /var/run/argo/outputs/parameters/tmp/dsx-out/never-written: no such file or directory"
    )
    assert {name: phases[name] for name in sorted(phases) if name != "wf"} == {
        "after-error": Phase.Omitted,  # a plain name is Succeeded || Skipped || Daemoned
        "after-skipped": Phase.Succeeded,
        "all-bad": Phase.Failed,
        "all-failed": Phase.Succeeded,  # all-bad.AllFailed
        "any-ok": Phase.Succeeded,  # mixed.AnySucceeded
        "errs": Phase.Error,
        "mixed": Phase.Failed,  # a fan-out with one failure fails
        "none-ok": Phase.Omitted,
        "not-all-failed": Phase.Omitted,
        "on-error": Phase.Succeeded,  # errs.Errored
        "saw-omission": Phase.Succeeded,  # after-error.Omitted
        "skipped": Phase.Skipped,
    }


def test_depends_knows_only_argos_task_results() -> None:
    tasks = [{"name": "a", "template": "ok"}, {"name": "b", "template": "ok", "depends": "a.Completed"}]
    assert check(workflow([{"name": "main", "dag": {"tasks": tasks}}, shell("ok", "true")])) == [
        "task result 'Completed' for task 'a' is invalid at WorkflowTemplate dsx-inline, template 'main', "
        "spec.templates[0].dag.tasks[1].depends"
    ]

"""The small languages inside workflows: when, depends, resource conditions, durations, variables."""

import pytest

from steps.durations import parse_duration
from workflows.runner.conditions import json_path, matches, parse_condition
from workflows.runner.depends import TaskResults, depends_logic, evaluate_depends, task_names
from workflows.runner.templating import Unresolved, render
from workflows.runner.when import WhenError, evaluate_when


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        ("heads == heads", True),  # bare words are strings
        ("heads != tails", True),
        ("'a b' == \"a b\"", True),
        ("10 > 9", True),  # numbers compare as numbers, not as text
        ("10 > 9.5 && 2 <= 2", True),
        ("1.0 == 1", True),
        ("1 == one", False),
        ("!(3 < 2) || false", True),
        ("true && !false", True),
        ("node-7 =~ '^node-[0-9]+$'".replace("node-7", "'node-7'"), True),
        ("abc !~ 'z'", True),
        ("(1 > 2 || 3 > 2) && ok == ok", True),
        ("-1 < 0", True),
        ("", True),
    ],
)
def test_when_follows_govaluate(when: str, expected: bool) -> None:
    assert evaluate_when(when) is expected


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ("node-01 == node-01", "try wrapping the affected expression in quotes"),
        ("ready", "Expected boolean evaluation for 'ready'. Got ready"),
        ("1 < abc", "Value 'abc' cannot be used with the comparator '<', it is not a number"),
        ("(true", "Invalid 'when' expression '(true'"),
        ("1 && true", "it is not a bool"),
    ],
)
def test_when_errors_are_argos(when: str, message: str) -> None:
    with pytest.raises(WhenError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        evaluate_when(when)


def test_depends_expands_plain_names_like_argo() -> None:
    logic = depends_logic({"depends": "A && (B.Failed || !C.Succeeded)"}, {"A": {"failed": True}})
    assert logic.startswith("(A.Succeeded || A.Skipped || A.Daemoned || A.Failed) &&")
    assert task_names(logic) == ["A", "B", "C"]
    results = {
        "A": TaskResults(Failed=True),
        "B": TaskResults(Succeeded=True),
        "C": TaskResults(Omitted=True),
    }
    assert evaluate_depends(logic, results) is True
    assert depends_logic({"dependencies": ["x-1", "y"]}, {}) == (
        "(x-1.Succeeded || x-1.Skipped || x-1.Daemoned) && (y.Succeeded || y.Skipped || y.Daemoned)"
    )
    assert evaluate_depends("a.AnySucceeded && !a.AllFailed", {"a": TaskResults(AnySucceeded=True)})


def test_resource_conditions() -> None:
    obj = {"status": {"phase": "Running", "succeeded": 2, "items": [1, 2]}, "metadata": {"name": "job"}}
    assert matches(obj, parse_condition("status.phase == Running, status.succeeded > 1"))
    assert matches(obj, parse_condition("status.phase in (Pending, Running)"))
    assert matches(obj, parse_condition("status.items.# >= 2, !status.failed, metadata.name"))
    assert not matches(obj, parse_condition("status.phase notin (Running)"))
    assert not matches(obj, parse_condition("status.succeeded < 1"))
    assert json_path(obj, "{.metadata.name}") == "job"
    assert json_path(obj, "{.status.items[*]}") == "1 2"


@pytest.mark.parametrize(
    ("text", "seconds"), [("30", 30), ("1m30s", 90), ("500ms", 0.5), ("1h", 3600), (5, 5)]
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_variables_render_or_fail_like_argo() -> None:
    scope = {"inputs.parameters.x": "1", "item": "a"}
    assert render("{{ inputs.parameters.x }}-{{item}}", scope) == "1-a"
    assert render("{{tasks.a.outputs.result}}", scope, defer=lambda t: t.startswith("tasks.")) == (
        "{{tasks.a.outputs.result}}"
    )
    with pytest.raises(Unresolved, match=r"failed to resolve \{\{inputs.parameters.y\}\}"):
        render("{{inputs.parameters.y}}", scope)

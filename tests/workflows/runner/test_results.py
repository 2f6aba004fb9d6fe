"""``outputs.result``: kept only when the step's DAG or steps template references it, cut to 256 kB."""

from pathlib import Path

from tests.workflows.runner.conftest import by_name, printed, shell, workflow
from workflows.runner import Phase, RunOptions, run
from workflows.runner.engine import MAX_RESULT_BYTES, step_or_task_name


def _x(value: str) -> dict[str, object]:
    return {"parameters": [{"name": "x", "value": value}]}


def _show() -> dict[str, object]:
    return shell("show", "echo {{inputs.parameters.x}}", inputs={"parameters": [{"name": "x"}]})


def test_a_dag_keeps_the_results_its_template_references_and_no_others(tmp_path: Path) -> None:
    tasks = [
        {"name": "said", "template": "say"},  # read by an argument
        {"name": "quiet", "template": "say"},  # read by nobody
        {"name": "judged", "template": "say"},  # read by a when only
        {"name": "fan", "template": "say", "withItems": ["a", "b"]},  # read aggregated
        {"name": "retried", "template": "say-retried"},  # read through its retry node
        {
            "name": "use",
            "template": "show",
            "depends": "said && quiet && judged && fan && retried",
            "when": "{{tasks.judged.outputs.result}} == hi",  # the quotes make a string literal
            "arguments": {
                "parameters": [
                    {
                        "name": "x",
                        "value": "{{tasks.said.outputs.result}} {{tasks.fan.outputs.result}}"
                        " {{tasks.retried.outputs.result}}",
                    }
                ]
            },
        },
    ]
    doc = workflow(
        [
            {"name": "main", "dag": {"tasks": tasks}},
            shell("say", """echo '"hi"'"""),
            shell("say-retried", """echo '"hi"'""", retryStrategy={"limit": 1}),
            _show(),
        ],
        onExit="bye",
    )
    doc["spec"]["templates"].append(shell("bye", "echo bye"))
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    assert result.phase is Phase.Succeeded
    kept = {n.display_name: n.outputs.get("result") for n in result.nodes.values() if n.type == "Pod"}
    assert kept == {
        "said": '"hi"',
        "quiet": None,
        "judged": '"hi"',
        "fan(0:a)": '"hi"',
        "fan(1:b)": '"hi"',
        "retried(0)": '"hi"',
        "use": None,  # printed, but nothing reads it
        "wf.onExit": None,  # an exit handler has no DAG around it
    }
    assert result.node("retried").outputs["result"] == '"hi"'  # the retry node takes its last attempt's
    assert result.node("use").inputs["parameters"][0]["value"] == '"hi" ["hi","hi"] "hi"'
    assert printed(result, result.node("quiet")) == '"hi"'


def test_a_fan_out_whose_kept_results_are_not_json_errors_every_task_after_it(tmp_path: Path) -> None:
    tasks = [
        {"name": "fan", "template": "say", "withItems": ["a", "b"]},
        {
            "name": "reads",
            "template": "show",
            "depends": "fan",
            "arguments": _x("{{tasks.fan.outputs.result}}"),
        },
        {"name": "follows", "template": "show", "depends": "fan", "arguments": _x("no reference")},
        {"name": "later", "template": "show", "depends": "follows", "arguments": _x("never")},
    ]
    doc = workflow([{"name": "main", "dag": {"tasks": tasks}}, shell("say", "echo hi"), _show()])
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    assert result.phase is Phase.Error
    for name in ("reads", "follows"):  # Argo gathers the outputs of every fan-out among a task's ancestors
        node = result.node(name)
        assert (node.phase, node.message) == (
            Phase.Error,
            "invalid character 'h' looking for beginning of value",
        )
    assert result.node("later").phase is Phase.Omitted


def test_a_steps_template_keeps_what_its_output_parameters_read(tmp_path: Path) -> None:
    steps = [[{"name": "first", "template": "say"}, {"name": "second", "template": "say"}]]
    outputs = {"parameters": [{"name": "said", "valueFrom": {"parameter": "{{steps.first.outputs.result}}"}}]}
    doc = workflow([{"name": "main", "steps": steps, "outputs": outputs}, shell("say", "echo hi")])
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    assert result.nodes[result.root_id].outputs["parameters"] == [{"name": "said", "value": "hi"}]
    assert result.node("first").outputs["result"] == "hi"
    assert "result" not in result.node("second").outputs


def test_a_leaf_entrypoint_keeps_no_result(tmp_path: Path) -> None:
    result = run(
        workflow([shell("main", "echo hi")]),
        [],
        {},
        RunOptions(allow_host_commands=True, out_dir=tmp_path / "run"),
    )
    root = result.nodes[result.root_id]
    assert result.phase is Phase.Succeeded and "result" not in root.outputs
    assert printed(result, root) == "hi"


def test_a_result_keeps_its_last_256_kb_cut_at_a_byte(tmp_path: Path) -> None:
    # 200000 two-byte characters and a 'z': the last 256 kB begin inside a character
    big = {
        "name": "big",
        "container": {
            "image": "python",
            "command": ["python3", "-c", "import sys; sys.stdout.write('é' * 200000 + 'z' + chr(10))"],
        },
    }
    tasks = [
        {"name": "big", "template": "big"},
        {
            "name": "size",
            "template": "count",
            "depends": "big",
            "arguments": {"parameters": [{"name": "x", "value": "{{tasks.big.outputs.result}}"}]},
        },
    ]
    count = shell("count", "true", inputs={"parameters": [{"name": "x"}]})
    doc = workflow([{"name": "main", "dag": {"tasks": tasks}}, big, count])
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    assert result.phase is Phase.Succeeded
    kept = result.node("big").outputs["result"]
    assert kept == "\ufffd" + "é" * ((MAX_RESULT_BYTES - 2) // 2) + "z"
    (size,) = by_name(result, "size")
    assert size.inputs["parameters"][0]["value"] == kept


def test_node_names_map_to_their_task_or_step_like_argo() -> None:
    assert step_or_task_name("wf.fan(0:a)(1)") == "fan"
    assert step_or_task_name("wf[0].flip") == "flip"
    assert step_or_task_name("wf.works.onExit") == "onExit"


def test_fan_out_parameters_are_parsed_only_when_all_are_json_lists_or_objects(tmp_path: Path) -> None:
    outputs = {"parameters": [{"name": "n", "valueFrom": {"path": "/tmp/dsx-out/n"}}]}
    write = shell(
        "write",
        "printf '%s' '{{inputs.parameters.v}}' > '/tmp/dsx-out/n'",
        inputs={"parameters": [{"name": "v"}]},
    )
    write["outputs"] = outputs
    reads = "{{tasks.numbers.outputs.parameters.n}} {{tasks.objects.outputs.parameters.n}}"
    tasks = [
        {"name": "numbers", "template": "write", "withItems": ["1", "2"], "arguments": _x("{{item}}")},
        {"name": "objects", "template": "write", "withItems": ['{"b":1,"a":2}'], "arguments": _x("{{item}}")},
        {"name": "use", "template": "show", "depends": "numbers && objects", "arguments": _x(reads)},
    ]
    for task in tasks[:2]:
        task["arguments"] = {"parameters": [{"name": "v", "value": "{{item}}"}]}
    doc = workflow([{"name": "main", "dag": {"tasks": tasks}}, write, _show()])
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    assert result.phase is Phase.Succeeded, result.message
    assert result.node("use").inputs["parameters"][0]["value"] == '["1","2"] [{"a":2,"b":1}]'

"""``dsx-bisect``: the recursive WorkflowTemplate, run by the local runner on a simulated fleet."""

import json
import re
from pathlib import Path

import pytest

from steps.cluster import connect
from steps.cluster import vocabulary as vocab
from tests import yamltext
from tests.cli import dsx_here
from tests.paths import REPO

FILES = REPO / "charts/dsx/files"


def _templates(name: str) -> dict[str, dict[str, object]]:
    doc = yamltext.load((FILES / f"workflow-template-{name}.yaml").read_text())
    return {t["name"]: t for t in doc["spec"]["templates"]}


def test_bisect_runs_one_search_step_per_group_and_defaults_what_a_skipped_one_leaves() -> None:
    templates = _templates("dsx-bisect")
    search = templates["search-group"]
    assert search["outputs"]["parameters"][0]["valueFrom"]["default"] == "[]"  # type: ignore[index]
    (group,) = templates["bisect-groups"]["dag"]["tasks"]  # type: ignore[index]
    assert (group["name"], group["template"]) == ("search-group", "search-group")
    assert "left" not in templates and "confirm-members" not in templates
    entry = {t["name"]: t["template"] for t in templates["bisect"]["dag"]["tasks"]}  # type: ignore[index]
    assert entry == {"prepare": "prepare", "search-group": "search-group", "finish": "finish"}


def test_certify_calls_bisect_for_failed_groups_through_a_template_ref() -> None:
    tasks = {t["name"]: t for t in _templates("dsx-certify")["certify"]["dag"]["tasks"]}  # type: ignore[index]
    for stage, targets, after in (
        ("groups", "bisect-targets", "whole-check"),
        ("whole", "bisect-whole-targets", "smoke-check"),
    ):
        bisect = tasks[f"bisect-{stage}"]
        assert bisect["templateRef"] == {"name": "dsx-bisect", "template": "bisect-groups"}
        assert bisect["when"] == f"{{{{tasks.{targets}.outputs.parameters.count}}}} > 0"
        assert f"bisect-{stage}.Omitted" in tasks[after]["depends"]
    groups = _templates("dsx-bisect")["bisect-groups"]
    assert groups["parallelism"] == 8


@pytest.mark.story
def test_a_local_bisection_recurses_and_labels_the_slow_node_failed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``dsx run bisect --local``, in this process (its steps and ranks forked from this process's fork
    server, torch imported there once for the tests of this worker)."""
    out = tmp_path / "run"
    spec = "sim:nodes=4,gpu=h100,racks=2,faults=node-02:slow-nic,certified=none"
    args = ["run", "bisect", "--local", "--cluster", spec, "-p", "p-min=0.9"]  # 2 screening passes, not 21
    code, stdout, stderr = dsx_here(capsys, *args, "--out", str(out), "-o", "json")
    assert code == 1, stdout[-3000:] + stderr[-3000:]
    nodes = json.loads((out / "workflow.json").read_text())["status"]["nodes"].values()
    phases = {n["name"].split(".", 1)[-1]: n["phase"] for n in nodes}
    # one search step: it names node-02 and screens the others
    assert phases["search-group"] == "Succeeded" and phases["finish"] == "Failed"
    port = connect(f"state:{out / 'fleet.json'}")
    labels = {n.name: n.labels.get(vocab.LABEL_CERTIFICATION) for n in port.list_nodes()}
    assert labels == {f"node-{i:02d}": ("failed" if i == 2 else None) for i in range(4)}
    reason = port.get_node("node-02").annotations[vocab.ANNOTATION_CERTIFICATION_REASON]
    assert reason.startswith("node-02: slow in multi-node tests:")
    probability = re.search(r"probability (\d\.\d+)", reason)
    assert probability is not None and float(probability.group(1)) >= 0.99, reason

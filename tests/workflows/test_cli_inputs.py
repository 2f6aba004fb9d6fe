"""Inputs that used to be taken silently or wrongly: each is now refused (exit 2, one line) or read right.

``--recipe`` beside criteria flags, ``--approve`` naming no step, retry settings that are not finite,
repeated keys in a simulated fleet, YAML alias bombs, and several kubeconfig files in ``KUBECONFIG``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from steps.cluster import load_fleet
from tests.cli import dsx_here as _dsx
from tests.emulator.apiserver import Emulator, write_kubeconfig
from tests.paths import REPO

CRITERIA = ["--service", "eks", "--accelerator", "h100", "--os", "ubuntu", "--intent", "training"]


def _error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def recipe_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Path:
    code, out, err = _dsx(capsys, "recipe", "resolve", *CRITERIA, "-o", "json")
    assert code == 0, err
    path = tmp_path / "recipe.json"
    path.write_text(out)
    return path


# --recipe with criteria flags ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["bundle", "-f", "helm", "--out", "{tmp}/b"], ["drift", "--snapshot", "{tmp}/none.json"]],
)
def test_recipe_with_criteria_flags_is_a_usage_error_naming_both(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, recipe_file: Path, command: list[str]
) -> None:
    args = [a.format(tmp=tmp_path) for a in command]
    code, _, err = _dsx(capsys, *args, "--recipe", str(recipe_file), "--accelerator", "b200")
    assert code == 2
    line = _error(err)
    assert f"--recipe {recipe_file}" in line and "--accelerator b200" in line
    code, _, err = _dsx(capsys, *args, "--recipe", str(recipe_file), "--recipes", str(REPO / "recipes"))
    assert code == 2 and "--recipes" in _error(err)
    assert not (tmp_path / "b").exists()


def test_recipe_alone_still_renders(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, recipe_file: Path
) -> None:
    code, _, err = _dsx(
        capsys, "bundle", "-f", "helm", "--out", str(tmp_path / "b"), "--recipe", str(recipe_file)
    )
    assert code == 0, err
    assert (tmp_path / "b" / "install.sh").is_file()


# --approve naming no step ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [["--local", "--dry-run"], []])
def test_approve_naming_no_suspend_step_is_refused_in_every_mode(
    capsys: pytest.CaptureFixture[str], mode: list[str]
) -> None:
    code, out, err = _dsx(capsys, "run", "certify", *mode, "--approve", "drain-nodes")
    assert code == 2 and out == ""
    assert _error(err) == (
        "error: --approve drain-nodes: the workflow has no suspend step or template of that name "
        "(suspend steps: none)"
    )


def test_approve_naming_a_suspend_step_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    fixture = REPO / "tests" / "workflows" / "runner" / "fixtures" / "suspend.yaml"
    code, out, err = _dsx(
        capsys,
        "run",
        "dsx-fixture-suspend",
        "--local",
        "--dry-run",
        "-f",
        str(fixture),
        "--approve",
        "approve-drain",
    )
    assert code == 0, err
    assert "approve-drain" in out


# Retry settings -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DSX_RETRY_BASE_DELAY", "nan"),
        ("DSX_RETRY_BASE_DELAY", "inf"),
        ("DSX_RETRY_BASE_DELAY", "-1"),
        ("DSX_RETRY_BASE_DELAY", "1e9"),
        ("DSX_RETRY_BASE_DELAY", "soon"),
        ("DSX_RETRY_ATTEMPTS", "0"),
        ("DSX_RETRY_ATTEMPTS", "2.5"),
        ("DSX_RETRY_ATTEMPTS", "100000"),
    ],
)
def test_retry_settings_must_be_finite_and_in_range(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value)
    code, _, err = _dsx(capsys, "cluster", "nodes", "--cluster", "sim:nodes=2")
    assert code == 2
    assert _error(err).startswith(f"error: {name}={value!r}: expected ")
    code, _, err = _dsx(capsys, "run", "certify", "--local", "--out", "never")
    assert code == 2 and name in _error(err)
    assert list(tmp_path.iterdir()) == []  # refused before a run folder was made


def test_retry_settings_in_range_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    from steps.cluster.retry import RetryPolicy

    monkeypatch.setenv("DSX_RETRY_BASE_DELAY", "0")
    monkeypatch.setenv("DSX_RETRY_ATTEMPTS", "3")
    assert (RetryPolicy.from_env().base_delay, RetryPolicy.from_env().attempts) == (0.0, 3)


# Simulated fleets: a key given twice --------------------------------------------------------------------


def test_a_key_repeated_in_a_short_sim_spec_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _dsx(capsys, "cluster", "nodes", "--cluster", "sim:nodes=4,gpu=h100,nodes=8")
    assert code == 2 and "key 'nodes' is given twice" in _error(err)
    code, _, err = _dsx(capsys, "cluster", "nodes", "--cluster", "sim:api-errors=1,api_errors=2")
    assert code == 2 and "key 'api-errors' is given twice" in _error(err)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: 4\ngpu: h100\nnodes: 8\n", "fleet.yaml:3: duplicate key 'nodes'"),
        (
            "nodes: 4\napi-errors: 1\napi_errors: 2\n",
            "fleet.yaml:3: key 'api_errors' is given twice (also on line 2)",
        ),
    ],
)
def test_a_key_repeated_in_a_fleet_file_is_named_with_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(text)
    code, _, err = _dsx(capsys, "cluster", "nodes", "--cluster", f"sim:{fleet}")
    assert code == 2 and message in _error(err)


# YAML alias bombs --------------------------------------------------------------------------------------

_BOMB = "".join(
    f"{name}: &{name} [{', '.join(['*' + prev] * 10)}]\n"
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
)


def test_an_alias_bomb_in_a_catalogue_is_refused_with_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    catalogue = tmp_path / "cat"
    shutil.copytree(REPO / "recipes", catalogue, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    values = catalogue / "components" / "gpu-operator" / "values.yaml"
    values.write_text(
        values.read_text() + "bomb:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    )
    with values.open("a") as handle:
        for line in _BOMB.splitlines():
            handle.write(f"  {line}\n")
    started = time.monotonic()
    code, _, err = _dsx(capsys, "recipe", "resolve", "--recipes", str(catalogue), *CRITERIA)
    assert code == 2
    line = _error(err)
    assert line.startswith(f"error: {catalogue}/components/gpu-operator/values.yaml:")
    assert "aliases expand the document by more than 100000 nodes" in line
    assert time.monotonic() - started < 60  # refused on reading, never walked (10**9 nodes)


def test_a_few_aliases_are_still_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes: &n 3\nracks: *n\n")
    code, out, err = _dsx(capsys, "cluster", "nodes", "--cluster", f"sim:{fleet}", "-o", "json")
    assert code == 0, err
    assert len(json.loads(out)) == 3


def test_a_recursive_alias_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    workflow = tmp_path / "wf.yaml"
    workflow.write_text("kind: Workflow\nmetadata: &m\n  name: loop\n  labels: *m\n")
    code, _, err = _dsx(capsys, "run", "loop", "--local", "--dry-run", "-f", str(workflow))
    assert code == 2 and "a recursive alias" in _error(err) and f"{workflow}:" in err


# KUBECONFIG with several files --------------------------------------------------------------------------


def _split_kubeconfig(tmp_path: Path, server: str) -> list[Path]:
    """The parts of one kubeconfig spread over files: contexts first, then cluster and user."""
    whole = json.loads(write_kubeconfig(tmp_path / "whole", server, context="lab").read_text())
    dead = json.loads(write_kubeconfig(tmp_path / "dead", "http://127.0.0.1:9", context="other").read_text())
    first = tmp_path / "contexts.yaml"
    first.write_text(yaml.safe_dump({"contexts": whole["contexts"], "current-context": "lab"}))
    second = tmp_path / "clusters.yaml"
    second.write_text(
        yaml.safe_dump(
            {
                "clusters": [*whole["clusters"], *dead["clusters"]],
                "users": [*whole["users"], *dead["users"]],
                "contexts": dead["contexts"],
                "current-context": "other",  # the first file's current context wins, as in kubectl
            }
        )
    )
    return [first, second]


def test_kubeconfig_lists_several_files_merged_as_kubectl_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Emulator() as emulator:
        emulator.seed(load_fleet("sim:nodes=2,gpu=h100").manifests())
        first, second = _split_kubeconfig(tmp_path, emulator.url)
        missing = tmp_path / "not-there"
        monkeypatch.setenv("KUBECONFIG", f"{missing}:{first}:{second}")
        monkeypatch.setenv("DSX_RETRY_ATTEMPTS", "1")
        monkeypatch.delenv("DSX_CLUSTER", raising=False)
        code, out, err = _dsx(capsys, "cluster", "nodes", "--cluster", "kube", "-o", "json")
        assert code == 0, err
        assert [n["name"] for n in json.loads(out)] == ["node-00", "node-01"]
        code, out, err = _dsx(
            capsys, "cluster", "nodes", "--cluster", "kube", "--context", "lab", "-o", "json"
        )
        assert code == 0, err
        monkeypatch.setenv("KUBECONFIG", f"{missing}:{tmp_path / 'gone'}")
        code, _, err = _dsx(capsys, "cluster", "nodes", "--cluster", "kube")
        assert code == 2 and "does not exist" in _error(err) and str(missing) in err


@pytest.mark.parametrize("name", ["repair/suspend", "..", "../elsewhere"])
def test_resume_refuses_a_node_name_that_is_a_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    code, _, err = _dsx(capsys, "resume", str(tmp_path), "--node", name)
    assert code == 2 and f"--node {name!r}: a step or template name, not a path" in _error(err)
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent / "elsewhere").exists()

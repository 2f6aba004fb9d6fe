"""The shared helpers every part writes files and validates input with, and the names the CLI spells
again (it must start without loading steps.cluster) kept equal to the vocabulary's."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from steps.errors import InputError
from steps.files import write_bytes, write_text
from steps.models import Camel, Frozen, Strict, read_model


def test_write_leaves_a_readable_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.json"
    write_text(target, "{}\n")
    write_text(target, '{"a": 1}\n')
    assert target.read_text() == '{"a": 1}\n'
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # not mkstemp's 0600
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    write_bytes(target, b"old")
    with pytest.raises(TypeError):
        write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


class _Node(Camel):
    gpu_count: int


class _Doc(Strict):
    nodes: list[_Node]


class _Fixed(Frozen):
    name: str


def test_a_model_error_names_file_line_and_place(tmp_path: Path) -> None:
    doc = tmp_path / "doc.yaml"
    doc.write_text("nodes:\n  - gpuCount: 8\n  - gpuCount: many\n")
    with pytest.raises(InputError) as caught:
        read_model(doc, _Doc, "doc.yaml", what="Fleet")
    assert str(caught.value).startswith("doc.yaml:3: not a Fleet: nodes[1].gpuCount: ")


def test_unknown_fields_are_refused_and_frozen_models_do_not_change(tmp_path: Path) -> None:
    doc = tmp_path / "doc.yaml"
    doc.write_text("nodes: []\nnode: typo\n")
    with pytest.raises(InputError, match=r"^doc.yaml:2: node: Extra inputs are not permitted"):
        read_model(doc, _Doc, "doc.yaml")
    fixed = _Fixed(name="a")
    with pytest.raises(ValueError, match="frozen"):
        fixed.name = "b"
    assert _Node(gpu_count=1) == _Node.model_validate({"gpuCount": 1})


def test_the_cli_reads_the_debug_variable_the_vocabulary_names() -> None:
    from steps.cluster import vocabulary as vocab
    from workflows.cli import main

    assert main._DEBUG_ENV == vocab.ENV_DEBUG


def test_the_cli_default_taint_is_the_vocabulary_taint() -> None:
    from steps.cluster import vocabulary as vocab
    from workflows.cli import cluster

    assert f"{vocab.TAINT_UNHEALTHY}:{vocab.TAINT_UNHEALTHY_EFFECT}" == cluster.DEFAULT_TAINT


def test_every_dsx_variable_is_named_once_in_the_vocabulary() -> None:
    """No ``DSX_*`` name is spelled as a string anywhere in ``steps`` or ``workflows`` but the vocabulary
    (and the command line's debug switch, read before anything of ``steps`` loads; checked above)."""
    import ast

    from steps.cluster import vocabulary as vocab
    from tests.paths import REPO

    spelled: list[str] = []
    for path in sorted([*(REPO / "steps").rglob("*.py"), *(REPO / "workflows").rglob("*.py")]):
        if path == REPO / "steps" / "cluster" / "vocabulary.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("DSX_")
            ):
                if (node.value == vocab.ENV_DEBUG and path.name == "main.py") or node.value == "DSX_":
                    continue
                spelled.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value}")
    assert spelled == []

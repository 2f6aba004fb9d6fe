"""A step's output parameters: what a step writes is what its template reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from steps.errors import InputError
from steps.outputs import OUTPUT_ENV, output_dir, runner_dir, write_params
from workflows.templates._base import OUTPUT_DIR, param_outputs


def test_a_parameter_a_step_writes_is_the_file_its_template_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OUTPUT_ENV, str(tmp_path))
    write_params(proceed="true", partner="node-03")
    for parameter in param_outputs("proceed", "partner", default=""):
        assert parameter.value_from is not None and parameter.value_from.path is not None
        relative = Path(parameter.value_from.path).relative_to(OUTPUT_DIR)
        assert (tmp_path / relative).read_text() == {"proceed": "true", "partner": "node-03"}[parameter.name]
    assert [p.value_from.default for p in param_outputs("run") if p.value_from] == [None]


def test_outside_a_runner_a_step_gives_no_parameter_and_evidence_needs_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(OUTPUT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert runner_dir() is None
    write_params(proceed="true")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InputError, match=f"no folder for the evidence: set {OUTPUT_ENV}"):
        output_dir(None)
    assert output_dir(tmp_path / "given") == tmp_path / "given" and (tmp_path / "given").is_dir()
    monkeypatch.setenv(OUTPUT_ENV, str(tmp_path / "runner"))
    assert output_dir(tmp_path / "given") == tmp_path / "runner"


def test_an_evidence_folder_that_cannot_be_made_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="cannot create the evidence folder"):
        output_dir(tmp_path / "file" / "below")

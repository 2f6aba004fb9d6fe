"""Output artifacts need an artifact repository: the run folder stands for one, or none is played."""

from pathlib import Path

from tests.workflows.runner.conftest import RunFixture, load, shell, workflow
from workflows.runner import Phase, RunOptions, run, warnings
from workflows.runner.engine import ARTIFACT_REPOSITORY_MESSAGE

NO_REPOSITORY = f"wait: Error (exit code 64): {ARTIFACT_REPOSITORY_MESSAGE}; "


def test_without_a_repository_a_step_that_saves_an_artifact_ends_error(run_fixture: RunFixture) -> None:
    result = run_fixture("artifacts.yaml", "dsx-fixture-artifacts", artifact_repository="none")
    assert result.phase is Phase.Error
    # the default retry policy (OnFailure) does not retry an Error
    keep = result.node("keep")
    assert (keep.type, keep.phase, keep.message) == ("Retry", Phase.Error, NO_REPOSITORY)
    assert len(keep.children) == 1
    assert "artifacts" not in keep.outputs
    # OnError retries it, to no avail
    retried = result.node("saved-on-retry")
    assert (retried.phase, retried.message) == (Phase.Error, "No more retries left")
    assert [result.nodes[c].message for c in retried.children] == [NO_REPOSITORY] * 3
    # an optional artifact that was not written needs no repository
    maybe = result.node("maybe")
    assert (maybe.phase, maybe.message) == (Phase.Succeeded, "")


def test_the_run_folder_stands_for_a_repository_by_default(run_fixture: RunFixture) -> None:
    result = run_fixture("artifacts.yaml", "dsx-fixture-artifacts")
    assert result.phase is Phase.Succeeded
    (artifact,) = result.node("keep").outputs["artifacts"]
    assert (result.run_dir / artifact["path"]).read_text() == "kept\n"
    assert result.warnings == [
        "templates keep, maybe, saved-on-retry declare output artifacts and the workflow declares no "
        "artifactRepositoryRef: here they are kept in the run folder, but on a cluster they need an artifact "
        "repository (a default Argo install has none, and there these steps end Error); rehearse that with "
        "--artifact-repository none"
    ]


def test_a_declared_repository_silences_the_warning_but_must_exist(tmp_path: Path) -> None:
    entry, library = load("artifacts.yaml", "dsx-fixture-artifacts")
    entry["spec"]["artifactRepositoryRef"] = {"configMap": "artifact-repositories", "key": "s3"}
    assert warnings(entry, library) == []
    local = run(entry, library, {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "local"))
    assert (local.phase, local.warnings) == (Phase.Succeeded, [])
    # on a cluster without the ConfigMap it names, Argo errors the workflow before any step runs
    none = run(
        entry,
        library,
        {},
        RunOptions(allow_host_commands=True, out_dir=tmp_path / "none", artifact_repository="none"),
    )
    assert none.phase is Phase.Error
    assert none.message == (
        "failed to resolve artifact repository: failed to find any artifact repository for artifact "
        'repository ref "artifact-repositories#s3"'
    )
    assert none.nodes == {}


def test_a_missing_artifact_fails_where_argos_emissary_would_have_staged_it(tmp_path: Path) -> None:
    outputs = {"artifacts": [{"name": "report", "path": "/tmp/dsx-out/report/"}]}
    tasks = [{"name": "lost", "template": "lost"}]
    doc = workflow([{"name": "main", "dag": {"tasks": tasks}}, shell("lost", "true", outputs=outputs)])
    result = run(
        doc, [], {}, RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", workflow_name="wf")
    )
    lost = result.node("lost")
    assert (lost.phase, lost.message) == (
        Phase.Error,
        "wait: Error (exit code 64): open /var/run/argo/outputs/artifacts/tmp/dsx-out/report.tgz: "
        "no such file or directory; ",
    )


def test_a_failed_step_keeps_its_own_message_over_the_wait_containers(tmp_path: Path) -> None:
    outputs = {
        "parameters": [{"name": "p", "valueFrom": {"path": "/tmp/dsx-out/p"}}],
        "artifacts": [{"name": "a", "path": "/tmp/dsx-out/a"}],
    }
    doc = workflow([shell("main", "exit 3", outputs=outputs)])
    result = run(
        doc,
        [],
        {},
        RunOptions(allow_host_commands=True, out_dir=tmp_path / "run", artifact_repository="none"),
    )
    assert (result.phase, result.message) == (Phase.Failed, "main: Error (exit code 3)")

"""Bundles: checksums verify, Argo CD waves and Flux dependsOn follow the graph, bytes are stable."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from steps.errors import InputError
from steps.runtime.bundle import CHECKSUMS, render_bundle, write_bundle
from steps.runtime.catalogue import load_catalogue
from steps.runtime.criteria import parse_criteria
from steps.runtime.resolve import RecipeResult, resolve
from tests import yamltext
from tests.paths import REPO

REPO_URL = "https://git.example.org/platform/gitops.git"


@pytest.fixture(scope="module")
def result() -> RecipeResult:
    query = parse_criteria(
        {
            "service": "bare-metal",
            "accelerator": "gb200",
            "os": "ubuntu",
            "intent": "training",
            "platform": "kubeflow",
        }
    )
    return resolve(load_catalogue(), query)


def _write(result: RecipeResult, fmt: str, out: Path) -> Path:
    write_bundle(render_bundle(result, fmt, repo_url=REPO_URL), out)
    return out


def _verify_checksums(folder: Path) -> None:
    lines = (folder / CHECKSUMS).read_text().splitlines()
    listed = {line.split("  ", 1)[1] for line in lines}
    present = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - {CHECKSUMS}
    assert listed == present
    for line in lines:
        digest, name = line.split("  ", 1)
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    if shutil.which("sha256sum"):
        run = subprocess.run(["sha256sum", "-c", CHECKSUMS], cwd=folder, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("fmt", ["helm", "argocd", "flux"])
def test_bundles_verify_and_are_byte_identical(result: RecipeResult, fmt: str, tmp_path: Path) -> None:
    first = _write(result, fmt, tmp_path / "one")
    second = _write(result, fmt, tmp_path / "two")
    _verify_checksums(first)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    for name in files:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    recipe = yamltext.load((first / "recipe.yaml").read_text())
    assert recipe["kind"] == "RecipeResult" and recipe["digest"] == result.digest
    text = "\n".join((first / name).read_text() for name in files)
    for placeholder in ("<REPO", "TODO", "CHANGEME", "REPLACE", "example.com"):
        assert placeholder not in text


def test_helm_install_script_follows_the_order_with_pinned_versions(
    result: RecipeResult, tmp_path: Path
) -> None:
    folder = _write(result, "helm", tmp_path / "helm")
    script = (folder / "install.sh").read_text()
    positions = []
    for item in result.components:
        line = next(
            line
            for line in script.splitlines()
            if line.startswith(f'"$HELM" upgrade --install {item.release} ')
        )
        assert f"--version {item.version}" in line
        assert f"--values {item.name}/values.yaml" in line
        positions.append(script.index(line))
        assert yamltext.load((folder / item.name / "values.yaml").read_text()) == item.values
    assert positions == sorted(positions)
    assert (folder / "install.sh").stat().st_mode & 0o111
    assert "oci://ghcr.io/nvidia/kai-scheduler/kai-scheduler --version" in script
    run = subprocess.run(["bash", "-n", str(folder / "install.sh")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_argocd_sync_waves_exceed_those_of_dependencies(result: RecipeResult, tmp_path: Path) -> None:
    folder = _write(result, "argocd", tmp_path / "argocd")
    apps = {}
    for path in (folder / "applications").glob("*.yaml"):
        doc = yamltext.load(path.read_text())
        apps[doc["metadata"]["name"]] = doc
    assert set(apps) == set(result.deploymentOrder)
    wave = {
        name: int(doc["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"])
        for name, doc in apps.items()
    }
    for item in result.components:
        for dep in item.dependsOn:
            assert wave[item.name] > wave[dep], (item.name, dep)
        sources = apps[item.name]["spec"]["sources"]
        assert sources[0]["targetRevision"] == item.version
        assert sources[0]["helm"]["valueFiles"] == [f"$values/{item.name}/values.yaml"]
        assert sources[1] == {"repoURL": REPO_URL, "targetRevision": "main", "ref": "values"}
    root = yamltext.load((folder / "app-of-apps.yaml").read_text())
    assert root["spec"]["source"] == {"repoURL": REPO_URL, "targetRevision": "main", "path": "applications"}
    assert apps["kai-scheduler"]["spec"]["sources"][0]["repoURL"] == "ghcr.io/nvidia/kai-scheduler"
    with pytest.raises(InputError, match="--repo-url"):
        render_bundle(result, "argocd")


def test_flux_depends_on_mirrors_the_graph(result: RecipeResult, tmp_path: Path) -> None:
    folder = _write(result, "flux", tmp_path / "flux")
    releases = {}
    for path in (folder / "releases").glob("*.yaml"):
        doc = yamltext.load(path.read_text())
        releases[doc["metadata"]["name"]] = doc
    assert set(releases) == set(result.deploymentOrder)
    sources = {
        yamltext.load(p.read_text())["metadata"]["name"]: yamltext.load(p.read_text())
        for p in (folder / "sources").glob("*.yaml")
    }
    for item in result.components:
        spec = releases[item.name]["spec"]
        assert sorted(d["name"] for d in spec.get("dependsOn", [])) == item.dependsOn
        assert spec["chart"]["spec"]["version"] == item.version
        assert spec["values"] == item.values
        source = sources[spec["chart"]["spec"]["sourceRef"]["name"]]
        assert source["spec"]["url"] == item.repository
        assert source["spec"].get("type") == ("oci" if item.repository.startswith("oci://") else None)
    kustomization = yamltext.load((folder / "kustomization.yaml").read_text())
    for entry in kustomization["resources"]:
        assert (folder / entry).is_file()


def test_bundles_are_written_atomically(result: RecipeResult, tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not a dsx bundle"):
        write_bundle(render_bundle(result, "helm"), precious)
    assert [p.name for p in precious.iterdir()] == ["notes.txt"]

    out = _write(result, "helm", tmp_path / "bundle")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(InputError, match="leaves the bundle folder"):
        write_bundle({"../escape.txt": b"x", CHECKSUMS: b""}, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary folder left
    _verify_checksums(out)  # the previous bundle is intact
    write_bundle(render_bundle(result, "flux"), out)  # a bundle is replaced by a bundle
    assert (out / "kustomization.yaml").is_file() and not (out / "install.sh").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# Safe bundles: quoted shell, checked values, nobody else's folder replaced --------------------------------


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workflows.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_install_sh_hands_every_value_to_helm_intact(result: RecipeResult, tmp_path: Path) -> None:
    out = _write(result, "helm", tmp_path / "bundle")
    calls = tmp_path / "calls.txt"
    recorder = tmp_path / "record"
    recorder.write_text(
        f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done >> {calls}; echo --- >> {calls}\n'
    )
    recorder.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HELM": str(recorder), "KUBECTL": str(recorder)}
    run = subprocess.run(
        ["bash", str(out / "install.sh")], capture_output=True, text=True, env=env, check=False
    )
    assert run.returncode == 0, run.stderr
    recorded = [block.strip().splitlines() for block in calls.read_text().split("---\n") if block.strip()]
    helm = {args[2]: args for args in recorded if args[0] == "upgrade"}
    for component in result.components:
        args = helm[component.release]
        assert args[args.index("--version") + 1] == component.version
        assert args[args.index("--namespace") + 1] == component.namespace
    assert f"recipe {result.digest} installed" in run.stdout


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("defaultVersion", "$(touch pwned)"),
        ("defaultVersion", "1.0.0;id"),
        ("chart", "chart`id`"),
        ("repository", "https://charts.example.org/$(id)"),
        ("namespace", "ns name"),
        ("release", "rel'ease"),
    ],
)
def test_catalogue_values_that_could_reach_a_shell_are_refused_with_file_and_line(
    tmp_path: Path, field: str, value: str
) -> None:
    from tests.steps.runtime.kit import component, overlay, write_catalogue

    spec = component()
    spec[field] = value
    root = write_catalogue(
        tmp_path / "cat", {"app": spec}, [overlay("base", componentRefs=[{"name": "app"}])]
    )
    with pytest.raises(InputError, match=r"cat/registry\.yaml:\d+: spec\.components\.app\.") as caught:
        load_catalogue(root)
    assert repr(value) in str(caught.value)
    run = _cli("recipe", "resolve", "--recipes", str(root), cwd=tmp_path)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (tmp_path / "pwned").exists()


def test_an_overlay_version_with_a_command_is_refused_with_its_line(tmp_path: Path) -> None:
    from tests.steps.runtime.kit import component, overlay, write_catalogue

    ref = {"name": "app", "version": "2.0.0$(touch pwned)"}
    root = write_catalogue(tmp_path / "cat", {"app": component()}, [overlay("base", componentRefs=[ref])])
    with pytest.raises(
        InputError, match=r"overlays/base\.yaml:\d+: spec\.componentRefs\[0\]\.version: .*touch"
    ):
        load_catalogue(root)


def test_a_resolved_recipe_holding_a_command_is_refused_by_bundle(
    result: RecipeResult, tmp_path: Path
) -> None:
    from steps.runtime.resolve import compute_digest

    data = result.model_dump(mode="json")
    data["components"][0]["version"] = "$(touch pwned)"
    forged = RecipeResult.model_validate(data)
    forged = forged.model_copy(update={"digest": compute_digest(forged)})
    (tmp_path / "forged.json").write_text(forged.model_dump_json())
    run = _cli("bundle", "-f", "helm", "--out", "b", "--recipe", "forged.json", cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert "version '$(touch pwned)' is not a pinned chart version" in run.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "pwned").exists()


def test_a_folder_with_a_checksums_file_is_not_a_bundle_and_keeps_its_files(
    result: RecipeResult, tmp_path: Path
) -> None:
    folder = tmp_path / "release"
    folder.mkdir()
    (folder / CHECKSUMS).write_text("0" * 64 + "  tool.tar.gz\n")
    (folder / "tool.tar.gz").write_bytes(b"\x1f\x8b data")
    (folder / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    run = _cli("bundle", "-f", "helm", "--out", str(folder), "--service", "eks", cwd=tmp_path)
    assert run.returncode == 2 and "not a dsx bundle" in run.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    with pytest.raises(InputError, match="not a dsx bundle"):
        write_bundle(render_bundle(result, "helm"), folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_bundle_with_a_file_added_is_not_replaced(result: RecipeResult, tmp_path: Path) -> None:
    out = _write(result, "helm", tmp_path / "bundle")
    (out / "my-notes.md").write_text("added by hand")
    with pytest.raises(InputError, match="not a dsx bundle"):
        write_bundle(render_bundle(result, "flux"), out)
    assert (out / "my-notes.md").read_text() == "added by hand" and (out / "install.sh").is_file()
    (out / "my-notes.md").unlink()
    write_bundle(render_bundle(result, "flux"), out)  # exactly a bundle again: replaced
    assert not (out / "install.sh").exists() and (out / "kustomization.yaml").is_file()


def test_an_out_that_is_a_file_is_refused(result: RecipeResult, tmp_path: Path) -> None:
    file = tmp_path / "bundle"
    file.write_text("mine")
    with pytest.raises(InputError, match="is a file"):
        write_bundle(render_bundle(result, "helm"), file)
    assert file.read_text() == "mine"

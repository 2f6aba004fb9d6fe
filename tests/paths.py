"""Where the tests find the repository, ../shared and the tools CI fetches."""

import shutil
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

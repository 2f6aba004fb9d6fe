"""The fixture workflows are valid Argo: the runner is tested on what Argo would accept."""

import subprocess
import sys

from tests import yamltext
from tests.paths import shared_path
from tests.workflows.runner.conftest import FIXTURES


def test_every_fixture_passes_argo_validation() -> None:
    tool = shared_path("tools", "validate-manifests")
    files = sorted(str(p) for p in FIXTURES.glob("*.yaml"))
    result = subprocess.run([sys.executable, str(tool), *files], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    documents = sum(1 for f in FIXTURES.glob("*.yaml") for d in yamltext.load_all(f.read_text()) if d)
    assert f"{documents} Argo documents checked, 0 with errors" in result.stdout

"""A repair handed to the operator's WorkflowTemplate, judged by the real system: the Workflow dsx-remediate's
code creates (``steps.sentinel.repair.call_template``), as dsx-remediate's account, is admitted by the
chart's policy for that template alone, run by the real Argo controller (``dsx-repair-webhook``, the example
dsx ships, as its own account ``dsx-repair``), which POSTs the request to a service on the pods' bridge,
and ends in a phase the repair wait reads (``repair.workflow_phase``).

The e2e chart names ``dsx-repair-webhook`` as ``remediate.repairTemplate.name`` (``tests/e2e/cluster.py``);
the URL is given to the installed template here, where the test's service listens.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest

from steps.cluster import vocabulary as vocab
from steps.cluster.kube import KubeCluster, load_api_client
from steps.sentinel import repair
from steps.sentinel.repair import RepairGpu, RepairRequest
from tests.e2e.cluster import NAMESPACE, Cluster
from tests.e2e.conftest import ACCOUNTS, RealCluster
from tests.e2e.test_admission import _DENIED, _workflow_as

pytestmark = pytest.mark.e2e

NODE = "node-03"  # only read: the request is written for it, the node is not touched
TEMPLATE = vocab.WORKFLOW_REPAIR_WEBHOOK


class _Service(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.got.append((dict(self.headers), json.loads(body)))  # type: ignore[attr-defined]
        self.send_response(202)
        self.end_headers()
        self.wfile.write(b"ticket RMA-1")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def service(own_cluster: Cluster) -> Iterator[http.server.HTTPServer]:
    """A repair service on the pods' bridge (the gateway's address, which every pod routes to)."""
    server = http.server.HTTPServer((own_cluster.gateway, 0), _Service)
    server.got = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _ports(real_cluster: RealCluster) -> tuple[KubeCluster, KubeCluster]:
    """(the cluster's administrator, dsx-remediate's account impersonated) through the real client."""
    admin, _ = load_api_client(str(real_cluster.kubeconfig))
    remediate, _ = load_api_client(str(real_cluster.kubeconfig))
    remediate.set_default_header("Impersonate-User", f"{ACCOUNTS}dsx-remediate")
    return KubeCluster(admin, namespace=NAMESPACE), KubeCluster(remediate, namespace=NAMESPACE)


def _set_url(real_cluster: RealCluster, url: str) -> None:
    template = real_cluster.get("workflowtemplate", TEMPLATE, "-n", NAMESPACE)
    names = [p["name"] for p in template["spec"]["arguments"]["parameters"]]
    patch = [
        {"op": "replace", "path": f"/spec/arguments/parameters/{names.index('url')}/value", "value": url}
    ]
    real_cluster.kubectl(
        "patch", "workflowtemplate", TEMPLATE, "-n", NAMESPACE, "--type=json", "-p", json.dumps(patch)
    )


def _ended(admin: KubeCluster, name: str, within: float) -> tuple[str, str]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = repair.workflow_phase(admin, name)
        assert found is not None, f"Workflow {name} is gone"
        if found[0] in vocab.WORKFLOW_FINISHED_PHASES:
            return found
        time.sleep(2)
    raise AssertionError(
        f"Workflow {name} did not end within {within:g} s: {repair.workflow_phase(admin, name)}"
    )


def test_a_repair_handed_to_the_webhook_template_runs_on_argo_and_reaches_the_service(
    real_cluster: RealCluster, service: http.server.HTTPServer
) -> None:
    admin, as_remediate = _ports(real_cluster)
    url = f"http://{service.server_address[0]}:{service.server_address[1]}/repairs"
    _set_url(real_cluster, url)
    node = admin.get_node(NODE)
    at = "2026-12-06T10:00:00Z"
    gpu = RepairGpu(index=3, uuid="GPU-e2e-3", pci="0000:48:00")
    request = RepairRequest(
        node=NODE, check="xid", workflow="dsx-remediate-e2e", requested_at=at, action="replace", gpus=[gpu]
    )
    assert repair.write_request(admin, request) == f"dsx-repair-{NODE}"
    asked = node.model_copy(
        update={
            "labels": {**node.labels, vocab.LABEL_REPAIR: "replace"},
            "annotations": {
                **node.annotations,
                vocab.ANNOTATION_REPAIR_REQUESTED_AT: at,
                vocab.ANNOTATION_REPAIR_GPUS: gpu.uuid,
            },
        }
    )
    try:
        name = repair.call_template(as_remediate, asked, TEMPLATE, "dsx-remediate-e2e")
        phase, message = _ended(admin, name, 240)
        assert phase == "Succeeded", (message, real_cluster.debug())
        ((headers, body),) = service.got  # type: ignore[attr-defined]
        assert headers["X-Dsx-Workflow"] == "dsx-remediate-e2e"
        assert (body["kind"], body["node"], body["action"], body["gpus"]) == (
            "RepairRequest",
            NODE,
            "replace",
            [{"index": 3, "uuid": "GPU-e2e-3", "pci": "0000:48:00"}],
        )
        pods = real_cluster.get("pods", "-n", NAMESPACE, "-l", f"workflows.argoproj.io/workflow={name}")
        accounts: set[str] = {p["spec"]["serviceAccountName"] for p in pods["items"]}
        assert accounts == {"dsx-repair"}, pods
    finally:
        repair.clear_request(admin, NODE)


def test_dsx_remediates_account_creates_workflows_of_the_repair_template_only(
    real_cluster: RealCluster,
) -> None:
    arguments = {"parameters": [{"name": "node", "value": NODE}]}
    webhook = {"workflowTemplateRef": {"name": TEMPLATE}, "arguments": arguments}
    assert _workflow_as(real_cluster, "dsx-remediate", webhook) == "admitted"
    refused = {
        "another template": {"workflowTemplateRef": {"name": "dsx-certify"}, "arguments": arguments},
        "another account": {**webhook, "serviceAccountName": "dsx-remediate"},
        "inline templates": {
            "entrypoint": "main",
            "templates": [{"name": "main", "container": {"image": "busybox", "command": ["true"]}}],
        },
    }
    for what, spec in refused.items():
        answer = _workflow_as(real_cluster, "dsx-remediate", spec)
        assert answer.startswith("403: ") and _DENIED.format("dsx-dsx-repair-workflows") in answer, (
            what,
            answer,
        )
    # dsx-repair-webhook's own account may create no Workflow at all: the authorizer refuses it first
    assert _workflow_as(real_cluster, "dsx-repair", webhook).startswith("403: ")

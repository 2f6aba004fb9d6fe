"""No privilege to borrow, judged by the real API server: the chart's ValidatingAdmissionPolicies let the
accounts that create Jobs and Workflows create only what dsx itself creates.

Every request is a server-side dry run (admission runs, nothing is stored) made as the account itself
(impersonated, as ``kubectl --as`` does), so the authorizer allows it and only the policy can refuse it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from steps.cluster.kube import load_api_client
from tests.e2e.cluster import NAMESPACE
from tests.e2e.conftest import ACCOUNTS, RealCluster
from tests.pods import rank_job

pytestmark = pytest.mark.e2e

JOB_ACCOUNTS = ("dsx-certify", "dsx-bisect", "dsx-remediate")
#: How the API server words a policy's refusal (after "<resource> \"<name>\" is forbidden: ").
_DENIED = "ValidatingAdmissionPolicy '{0}' with binding '{0}' denied request: "
RANKS = "dsx-ranks"
#: The accounts that create Workflows: dsx-reconcile's CronWorkflow and the Sensor (the Events tier).
WORKFLOW_ACCOUNTS = ("dsx-reconcile", "dsx-remediate-sensor")


def _api(real_cluster: RealCluster, account: str | None) -> client.ApiClient:
    api, _ = load_api_client(str(real_cluster.kubeconfig))
    if account is not None:
        api.set_default_header("Impersonate-User", f"{ACCOUNTS}{account}")
    return api


def _answer(create: Callable[[], Any]) -> str:
    """``admitted``, or the server's refusal: its status code and message."""
    try:
        create()
    except ApiException as exc:
        return f"{exc.status}: {json.loads(exc.body).get('message', exc.body)}"
    return "admitted"


def _job_as(real_cluster: RealCluster, account: str | None, job: dict[str, Any]) -> str:
    batch = client.BatchV1Api(_api(real_cluster, account))
    return _answer(lambda: batch.create_namespaced_job(NAMESPACE, job, dry_run="All"))


def _changed(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    job = copy.deepcopy(rank_job(NAMESPACE, RANKS))
    change(job["spec"]["template"]["spec"])
    return job


def _container(spec: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = spec["containers"][0]
    return container


BORROWED: dict[str, Callable[[dict[str, Any]], None]] = {
    "another account": lambda spec: spec.update(serviceAccountName="default"),
    # (the API server itself refuses privileged with allowPrivilegeEscalation false: a privileged
    # container leaves it unset)
    "privileged": lambda spec: _container(spec).update(securityContext={"privileged": True}),
    "privilege escalation": lambda spec: _container(spec)["securityContext"].update(
        allowPrivilegeEscalation=True
    ),
    "root": lambda spec: _container(spec)["securityContext"].update(runAsUser=0),
    "SYS_ADMIN": lambda spec: _container(spec)["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
    "host network": lambda spec: spec.update(hostNetwork=True),
    "host PID": lambda spec: spec.update(hostPID=True),
    "host path": lambda spec: spec["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
}


@pytest.mark.parametrize("account", JOB_ACCOUNTS)
def test_the_accounts_that_create_jobs_create_only_rank_jobs(real_cluster: RealCluster, account: str) -> None:
    assert _job_as(real_cluster, account, rank_job(NAMESPACE, RANKS)) == "admitted"
    # a fabric profile's IPC_LOCK (RDMA) is what admission.rankCapabilities allows by default
    ipc_lock = _changed(
        lambda spec: _container(spec)["securityContext"]["capabilities"].update(add=["IPC_LOCK"])
    )
    assert _job_as(real_cluster, account, ipc_lock) == "admitted"
    refused = {what: _job_as(real_cluster, account, _changed(change)) for what, change in BORROWED.items()}
    for what, answer in refused.items():
        assert answer.startswith("403: ") and _DENIED.format("dsx-dsx-rank-jobs") in answer, (what, answer)
    assert "runs its pods as the ranks account dsx-ranks" in refused["another account"]
    assert "beyond admission.rankCapabilities" in refused["SYS_ADMIN"]
    assert "mounts no host path" in refused["host path"]


def test_the_policies_leave_everyone_else_alone(real_cluster: RealCluster) -> None:
    """The policy matches dsx's accounts by name: the cluster's administrator is judged by others."""
    assert _job_as(real_cluster, None, _changed(BORROWED["another account"])) == "admitted"


def _workflow(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "dsx-remediate-", "namespace": NAMESPACE},
        "spec": spec,
    }


def _workflow_as(real_cluster: RealCluster, account: str | None, spec: dict[str, Any]) -> str:
    custom = client.CustomObjectsApi(_api(real_cluster, account))
    return _answer(
        lambda: custom.create_namespaced_custom_object(
            "argoproj.io", "v1alpha1", NAMESPACE, "workflows", _workflow(spec), dry_run="All"
        )
    )


@pytest.mark.parametrize("account", WORKFLOW_ACCOUNTS)
def test_the_accounts_that_create_workflows_start_only_dsx_remediate(
    real_cluster: RealCluster, account: str
) -> None:
    exists = real_cluster.kubectl("get", "serviceaccount", account, "-n", NAMESPACE, check=False)
    if exists.returncode != 0:
        pytest.skip(f"no account {account}: the chart was installed without the Events tier")
    arguments = {"parameters": [{"name": "node", "value": "node-01"}, {"name": "check", "value": "xid"}]}
    remediate = {"workflowTemplateRef": {"name": "dsx-remediate"}, "arguments": arguments}
    assert _workflow_as(real_cluster, account, remediate) == "admitted"
    refused = {
        "another template": {"workflowTemplateRef": {"name": "dsx-certify"}, "arguments": arguments},
        "a cluster template": {"workflowTemplateRef": {"name": "dsx-remediate", "clusterScope": True}},
        "another account": {**remediate, "serviceAccountName": "default"},
        "a pod spec patch": {**remediate, "podSpecPatch": '{"hostNetwork": true}'},
        "inline templates": {
            "entrypoint": "main",
            "templates": [{"name": "main", "container": {"image": "busybox", "command": ["true"]}}],
        },
    }
    answers = {what: _workflow_as(real_cluster, account, spec) for what, spec in refused.items()}
    for what, answer in answers.items():
        denied = _DENIED.format("dsx-dsx-remediate-workflows")
        assert answer.startswith("403: ") and denied in answer, (what, answer)
    assert "not: serviceAccountName" in answers["another account"]
    assert "not: podSpecPatch" in answers["a pod spec patch"]
    assert _workflow_as(real_cluster, None, refused["another account"]) == "admitted"

"""The chart's RBAC judged by the real authorizer: every request dsx's accounts made during the e2e runs was
allowed, and what an account may do but never did is either explained below or should go.

Runs after the scenarios (``conftest.py`` orders it last): it reads the API server's audit log, which records
every request of the service accounts in ``gpu-ops`` with the authorizer's decision.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from kubernetes import client

from steps.cluster.kube import load_api_client
from tests.e2e.cluster import NAMESPACE, Cluster
from tests.e2e.conftest import ACCOUNTS, RealCluster, audit_events

pytestmark = [pytest.mark.e2e, pytest.mark.e2e_last]

PREFIX = ACCOUNTS
#: Permissions an account holds that the e2e scenarios do not use, each with the reason it stays.
#: (account, verb, "group/resource[/subresource]"): reason.
EXPLAINED: dict[tuple[str, str, str], str] = {
    ("dsx-certify", "delete", "/pods"): "the pods a killed run left are deleted before a group test's retry",
    ("dsx-certify", "patch", "/configmaps"): "a retried step's outcome or report, kept over its earlier try",
    ("dsx-remediate", "patch", "/configmaps"): "recertification runs dsx-certify's steps under this account "
    "(it is bound to dsx-certify's Role): a retried step's outcome or report",
    ("dsx-remediate", "delete", "/pods"): "the drain deletes a pod only where its policy says force or "
    "delete-after-timeout; the scenario's drain evicts",
    ("dsx-remediate", "get", "/pods"): "an eviction or a deletion refused with a conflict reads the pod "
    "again, to tell a pod replaced under the same name from one that changed",
    ("dsx-remediate", "create", "argoproj.io/workflows"): "a Workflow of remediate.repairTemplate for a "
    "request of its actions (replace); the scenario's fault asks for a reboot, and test_repair creates one "
    "impersonating the account, which the audit log records as the administrator's request",
    **{
        (
            "dsx-reconcile",
            verb,
            resource,
        ): "the not-ready check writes DsxNodeNotReady and the sentinel's taint "
        "only on a node that is down; test_not_ready does it impersonating the account, which the audit log "
        "records as the administrator's request"
        for verb, resource in (("get", "/nodes"), ("patch", "/nodes"), ("patch", "/nodes/status"))
    },
    ("dsx-remediate", "create", "coordination.k8s.io/leases"): "recertification takes the node's Lease, "
    "creating it when no certification ever held the node (the scenario's node was certified before)",
}


def _resource(ref: dict[str, Any]) -> str:
    text = f"{ref.get('apiGroup', '')}/{ref.get('resource', '')}"
    return f"{text}/{ref['subresource']}" if ref.get("subresource") else text


def _granted(real_cluster: RealCluster, account: str) -> set[tuple[str, str]]:
    """(verb, group/resource) the authorizer lets ``account`` do in the namespace: a SelfSubjectRulesReview
    made as the account (impersonated), what ``kubectl auth can-i --list --as`` shows."""
    api, _ = load_api_client(str(real_cluster.kubeconfig))
    api.set_default_header("Impersonate-User", f"{PREFIX}{account}")
    review = client.AuthorizationV1Api(api).create_self_subject_rules_review(
        {"spec": {"namespace": NAMESPACE}}
    )
    granted = set()
    for rule in review.status.resource_rules:
        for group in rule.api_groups or [""]:
            for resource in rule.resources or []:
                for verb in rule.verbs or []:
                    granted.add((verb, f"{group}/{resource}"))
    return granted


def test_every_request_of_dsx_accounts_was_allowed(real_cluster: RealCluster, own_cluster: Cluster) -> None:
    events = audit_events(own_cluster)
    assert events, "no request of a gpu-ops service account reached the audit log"
    refused = sorted(
        {
            (e["user"]["username"].removeprefix(PREFIX), e["verb"], _resource(e.get("objectRef") or {}))
            for e in events
            if e["annotations"].get("authorization.k8s.io/decision") != "allow"
        }
    )
    assert refused == [], f"requests the authorizer refused: {refused}"


def test_what_each_account_may_do_and_never_did_is_explained(
    real_cluster: RealCluster, own_cluster: Cluster
) -> None:
    used: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for e in audit_events(own_cluster):
        used[e["user"]["username"].removeprefix(PREFIX)].add((e["verb"], _resource(e.get("objectRef") or {})))
    unexplained = []
    for account in sorted(used):
        for verb, resource in sorted(_granted(real_cluster, account) - used[account]):
            if resource.startswith(
                ("authorization.k8s.io/", "authentication.k8s.io/", "certificates.k8s.io/")
            ):
                continue  # what every authenticated user may do (system:basic-user)
            if (account, verb, resource) not in EXPLAINED:
                unexplained.append(f"{account}: {verb} {resource}")
    print("accounts exercised:", ", ".join(sorted(used)))
    assert unexplained == [], "granted but never used (remove it, or explain it in EXPLAINED):\n" + "\n".join(
        unexplained
    )

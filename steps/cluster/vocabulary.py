"""The node vocabulary of dsx: every label, taint, annotation and condition name under ``dsx.dev/``.

This module is the one place these names are spelled. Readiness writes the certification label,
sentinel writes the state label, the taint and the cordon annotations, and both read the opt-out label.

Labels on a node:

- ``dsx.dev/certification``: ``passed``, ``failed`` or ``pending`` (the readiness verdict).
- ``dsx.dev/state``: ``quarantined``, ``draining``, ``awaiting-repair``, ``recertifying`` or
  ``escalated`` (where the node is in remediation; absent when the node is in service).
- ``dsx.dev/managed=false``: the operator opts the node out; dsx observes it but never acts on it.

Taint: ``dsx.dev/unhealthy`` with effect ``NoSchedule``, put on at once when a fatal fault is seen.

Annotations written by :meth:`steps.cluster.port.ClusterPort.cordon` (cordons have owners: dsx
uncordons only a cordon dsx made, and only for the owner who made it):

- ``dsx.dev/cordoned-by``: the owner of the cordon, the ``by`` of the call (``dsx``, ``sentinel``, a
  person's name). A cordon by another owner is refused, never written over, unless forced.
- ``dsx.dev/cordon-reason``: why, in one line.
- ``dsx.dev/cordoned-at``: when the owner cordoned the node (RFC 3339, UTC).
- ``dsx.dev/cordoned-before-dsx``: ``true`` when the node was already cordoned outside dsx (kubectl,
  another tool) and no dsx owner held it, so the owner's record sits on someone else's cordon and dsx
  never uncordons it; ``false`` when dsx made the cordon.

Every write of ``spec.unschedulable`` names the field manager ``dsx`` (:data:`FIELD_MANAGER`), so where the
API server keeps ``metadata.managedFields`` dsx also sees a cordon set again outside dsx (kubectl uncordon,
then kubectl cordon) after its own was lifted, and leaves that one alone too.

Remediation (``dsx-remediate``, :mod:`steps.sentinel.remediate`) writes, beside ``dsx.dev/state``:

- ``dsx.dev/state-since``: when the node entered its current state (RFC 3339, UTC), in the same patch
  as the label.
- ``dsx.dev/remediation``: the workflow that holds the node's remediation (its name).
- ``dsx.dev/repair-requested-at``: when remediation asked the repair system for a repair; the repair
  system (or the simulated fleet) answers by rebooting the node: a new ``status.nodeInfo.bootID``.
- ``dsx.dev/repair-boot-id``: the node's boot id when the repair was requested (a repair shows a new one).
- ``dsx.dev/recertify=true``: label on the one node ``dsx-certify`` recertifies for remediation now (its
  ``nodes`` selector), put on and taken off under the fleet-wide mutex ``dsx-recertify``.
- ``dsx.dev/replace=requested``: label on an escalated node that remediation could not bring back,
  asking for the machine to be replaced.

Topology labels set by the simulated fleet (and expected on real nodes where the operator labels racks):
``topology.dsx.dev/rack`` and ``topology.dsx.dev/block`` (a block is a group of racks under one
spine switch).

Outside the node: ``dsx.dev/v1alpha1`` is the ``apiVersion`` of dsx's own documents (recipes, resolved
recipes, snapshots, drift and certification reports), and a rendered bundle carries its recipe's digest in
``dsx.dev/recipe-digest``.

Environment variables: every ``DSX_*`` variable that the chart, the templates or the local runner set and
the steps read is named here (``ENV_*``), so the side that sets one and the side that reads it cannot
drift apart.

Node conditions are named after the problem the check looks for, and ``status=True`` means the problem
is present, as with node-problem-detector (``DsxGpuXid``, ``DsxGpuFailed``, ``DsxNicDegraded``...).
"""

from __future__ import annotations

import enum
from typing import Final, Literal

__all__ = [
    "ANNOTATION_CERTIFICATION_REASON",
    "ANNOTATION_CERTIFICATION_RECIPE",
    "ANNOTATION_CERTIFIED_AT",
    "ANNOTATION_CORDONED_AT",
    "ANNOTATION_CORDONED_BEFORE",
    "ANNOTATION_CORDONED_BY",
    "ANNOTATION_CORDON_REASON",
    "ANNOTATION_MEMBERS",
    "ANNOTATION_PAIR_TEST",
    "ANNOTATION_RECIPE_DIGEST",
    "ANNOTATION_REMEDIATION",
    "ANNOTATION_REMEDIATION_CHECK",
    "ANNOTATION_REPAIR_BOOTED_AT",
    "ANNOTATION_REPAIR_BOOT_ID",
    "ANNOTATION_REPAIR_GPUS",
    "ANNOTATION_REPAIR_OUTCOME",
    "ANNOTATION_REPAIR_REQUESTED_AT",
    "ANNOTATION_REPORT_CONTENTS",
    "ANNOTATION_STATE_SINCE",
    "ANNOTATION_SUBJECT",
    "ANNOTATION_WORKFLOW",
    "ANNOTATION_WORKFLOW_UID",
    "API_VERSION",
    "CONDITION_GPU_FAILED",
    "CONDITION_GPU_XID",
    "CONDITION_NIC_DEGRADED",
    "CONDITION_NOT_CERTIFIED",
    "CONDITION_SENTINEL",
    "CORDON_ANNOTATIONS",
    "ENV_API_OUTAGE_S",
    "ENV_CLUSTER",
    "ENV_DEBUG",
    "ENV_FAIL_FILE",
    "ENV_FAULT_HISTORY",
    "ENV_FAULT_OVERRIDES",
    "ENV_GPU_IMAGE",
    "ENV_HELM_NAMESPACES",
    "ENV_JOB_POLL_S",
    "ENV_KUBE_CONTEXT",
    "ENV_LEDGER_RETENTION_DAYS",
    "ENV_LOCAL_RUN",
    "ENV_NAMESPACE",
    "ENV_NODE_NAME",
    "ENV_OUTPUT_DIR",
    "ENV_PHASE_FILE",
    "ENV_RANK_POD",
    "ENV_RANK_SERVICE_ACCOUNT",
    "ENV_RENDEZVOUS_FILE",
    "ENV_REPORTS_KEPT",
    "ENV_RETRY_ATTEMPTS",
    "ENV_RETRY_BASE_DELAY",
    "ENV_SCHEDULE_BUDGET_S",
    "ENV_SENTINEL_KERNEL_LOG",
    "ENV_SENTINEL_OVERRIDES",
    "ENV_SENTINEL_STATE_DIR",
    "ENV_SENTINEL_SYSFS",
    "ENV_SHM_SIZE",
    "ENV_STALE_WAIT_S",
    "FIELD_MANAGER",
    "LABEL_BLOCK",
    "LABEL_CERTIFICATION",
    "LABEL_CERTIFICATION_REPORT",
    "LABEL_CERTIFICATION_RUN",
    "LABEL_DRIFT",
    "LABEL_GROUP_TEST",
    "LABEL_LEDGER",
    "LABEL_LEDGER_MONTH",
    "LABEL_LOCKED_NODE",
    "LABEL_MANAGED",
    "LABEL_NODE",
    "LABEL_OUTCOME_KIND",
    "LABEL_OUTCOME_TEST",
    "LABEL_RACK",
    "LABEL_RECERTIFY",
    "LABEL_REPAIR",
    "LABEL_REPLACE",
    "LABEL_STATE",
    "MANAGED_FALSE",
    "PREFIX",
    "REPLACE_REQUESTED",
    "SENTINEL_CHECKS",
    "TAINT_OUT_OF_SERVICE",
    "TAINT_UNHEALTHY",
    "TAINT_UNHEALTHY_EFFECT",
    "WORKFLOW_BISECT",
    "WORKFLOW_BUNDLE",
    "WORKFLOW_CERTIFY",
    "WORKFLOW_DRIFT",
    "WORKFLOW_FINISHED_PHASES",
    "WORKFLOW_GOODPUT",
    "WORKFLOW_RECIPE",
    "WORKFLOW_RECONCILE",
    "WORKFLOW_REMEDIATE",
    "WORKFLOW_REPAIR_WEBHOOK",
    "ApiVersion",
    "Certification",
    "NodeState",
    "SentinelComponent",
    "is_managed",
]

PREFIX: Final = "dsx.dev/"

ApiVersion = Literal["dsx.dev/v1alpha1"]
"""The type of the ``apiVersion`` field of dsx's own documents (a pydantic field refuses any other)."""
API_VERSION: Final[ApiVersion] = "dsx.dev/v1alpha1"
ANNOTATION_RECIPE_DIGEST: Final = "dsx.dev/recipe-digest"
"""On every object of a rendered bundle: the digest of the resolved recipe it was rendered from."""

LABEL_CERTIFICATION: Final = "dsx.dev/certification"
LABEL_STATE: Final = "dsx.dev/state"
LABEL_MANAGED: Final = "dsx.dev/managed"
MANAGED_FALSE: Final = "false"

LABEL_DRIFT: Final = "dsx.dev/drift"
LABEL_RACK: Final = "topology.dsx.dev/rack"
LABEL_BLOCK: Final = "topology.dsx.dev/block"

# On the ConfigMaps that carry a certification run's outcomes from step to step.
LABEL_CERTIFICATION_RUN: Final = "dsx.dev/certification-run"
LABEL_OUTCOME_KIND: Final = "dsx.dev/outcome"
LABEL_OUTCOME_TEST: Final = "dsx.dev/test"
"""On a stored check outcome (``dsx.dev/outcome=check``): the check's test (``allreduce-sweep``...)."""
LABEL_CERTIFICATION_REPORT: Final = "dsx.dev/certification-report"
ANNOTATION_WORKFLOW_UID: Final = "dsx.dev/workflow-uid"
ANNOTATION_REPORT_CONTENTS: Final = "dsx.dev/report-contents"
LABEL_LOCKED_NODE: Final = "dsx.dev/node"
"""On a node's Lease (``dsx-node-<node>``): the node it locks, so a run can find the Leases it holds."""
LABEL_NODE: Final = "dsx.dev/node"
"""On an object kept for one node (its remediation ledger's ConfigMaps): the node's name, or where it is
longer than a label value's 63 characters its first characters and a hash (:mod:`steps.sentinel.ledger`)."""
LABEL_LEDGER: Final = "dsx.dev/ledger"
"""``true`` on every ConfigMap of the remediation ledger, so one label selector lists them all."""
LABEL_LEDGER_MONTH: Final = "dsx.dev/ledger-month"
"""On a ledger ConfigMap: the month (``yyyy-mm``, UTC) its entries are from; retention deletes by it."""
ANNOTATION_SUBJECT: Final = "dsx.dev/subject"
ANNOTATION_WORKFLOW: Final = "dsx.dev/workflow"

# On the objects of a group test (Job, its pods, headless Service, state ConfigMap): the Job's name, which
# the Service selects the pods by; with LABEL_CERTIFICATION_RUN and ANNOTATION_WORKFLOW for the run, and
# the members the test runs on.
LABEL_GROUP_TEST: Final = "dsx.dev/group-test"
ANNOTATION_MEMBERS: Final = "dsx.dev/members"

ANNOTATION_STATE_SINCE: Final = "dsx.dev/state-since"
ANNOTATION_REMEDIATION: Final = "dsx.dev/remediation"
#: The sentinel check whose fault the node's remediation answers (its recertification's diagnostics
#: are chosen by it).
ANNOTATION_REMEDIATION_CHECK: Final = "dsx.dev/remediation-check"
ANNOTATION_REPAIR_REQUESTED_AT: Final = "dsx.dev/repair-requested-at"
ANNOTATION_REPAIR_BOOT_ID: Final = "dsx.dev/repair-boot-id"
#: The last time the repair wait read the node on its old boot id: the new boot, and the sentinel's
#: readings of it that clear the fault, came after.
ANNOTATION_REPAIR_BOOTED_AT: Final = "dsx.dev/repair-booted-at"
#: The GPUs the repair request names (their UUIDs, comma-separated): what a reset-gpu actuator resets.
ANNOTATION_REPAIR_GPUS: Final = "dsx.dev/repair-gpus"
#: What the repair's actuator did with the request (JSON, steps.sentinel.outcome.RepairOutcome): who acted,
#: Running, Succeeded or Failed, when, and what it says; about the request of dsx.dev/repair-requested-at.
ANNOTATION_REPAIR_OUTCOME: Final = "dsx.dev/repair-outcome"
LABEL_REPLACE: Final = "dsx.dev/replace"
#: dsx-remediate's repair request on the node: the action asked for (reset-gpu, reboot, replace,
#: contact-support); the request itself is the ConfigMap dsx-repair-<node> in dsx's namespace.
LABEL_REPAIR: Final = "dsx.dev/repair"
LABEL_RECERTIFY: Final = "dsx.dev/recertify"
# dsx-remediate's pair test: what it found (passed beside, failed beside, skipped and why), read by conclude.
ANNOTATION_PAIR_TEST: Final = "dsx.dev/pair-test"
REPLACE_REQUESTED: Final = "requested"

TAINT_UNHEALTHY: Final = "dsx.dev/unhealthy"
TAINT_UNHEALTHY_EFFECT: Final = "NoSchedule"
TAINT_OUT_OF_SERVICE: Final = "node.kubernetes.io/out-of-service"
"""Kubernetes' taint a person puts on a node they confirmed is shut down (non-graceful node shutdown): the
pod garbage collector then force-deletes the pods left terminating there, as no kubelet will confirm them."""
# The names of dsx's WorkflowTemplates and CronWorkflows, and so of the Workflows they make.
WORKFLOW_BISECT: Final = "dsx-bisect"
WORKFLOW_BUNDLE: Final = "dsx-bundle"
WORKFLOW_CERTIFY: Final = "dsx-certify"
WORKFLOW_DRIFT: Final = "dsx-drift"
WORKFLOW_GOODPUT: Final = "dsx-goodput"
WORKFLOW_RECIPE: Final = "dsx-recipe"
WORKFLOW_RECONCILE: Final = "dsx-reconcile"
WORKFLOW_REMEDIATE: Final = "dsx-remediate"
#: The example repair template dsx ships (remediate.repairTemplate.name): the request POSTed to a URL.
WORKFLOW_REPAIR_WEBHOOK: Final = "dsx-repair-webhook"
WORKFLOW_FINISHED_PHASES: Final = ("Succeeded", "Failed", "Error")
"""The phases of an Argo Workflow that has ended (``WorkflowSucceeded``, ``WorkflowFailed``,
``WorkflowError``): its steps run no more."""

ANNOTATION_CORDONED_BY: Final = "dsx.dev/cordoned-by"
ANNOTATION_CORDON_REASON: Final = "dsx.dev/cordon-reason"
ANNOTATION_CORDONED_AT: Final = "dsx.dev/cordoned-at"
ANNOTATION_CORDONED_BEFORE: Final = "dsx.dev/cordoned-before-dsx"
ANNOTATION_CERTIFIED_AT: Final = "dsx.dev/certified-at"
ANNOTATION_CERTIFICATION_RECIPE: Final = "dsx.dev/certification-recipe"
ANNOTATION_CERTIFICATION_REASON: Final = "dsx.dev/certification-reason"
CORDON_ANNOTATIONS: Final = (
    ANNOTATION_CORDONED_BY,
    ANNOTATION_CORDON_REASON,
    ANNOTATION_CORDONED_AT,
    ANNOTATION_CORDONED_BEFORE,
)

FIELD_MANAGER: Final = "dsx"
"""The field manager every dsx write names (``?fieldManager=dsx``), as ``managedFields`` records it."""

CONDITION_GPU_XID: Final = "DsxGpuXid"
CONDITION_GPU_FAILED: Final = "DsxGpuFailed"
CONDITION_NIC_DEGRADED: Final = "DsxNicDegraded"
CONDITION_NOT_CERTIFIED: Final = "DsxNotCertified"

SentinelComponent = Literal["gpu", "nvlink", "nic", "node"]
"""What a sentinel check is about: a GPU, its NVLink or NVSwitch fabric, a NIC, the node."""

SENTINEL_CHECKS: Final[dict[str, tuple[SentinelComponent, str]]] = {
    "gpu-missing": ("gpu", "DsxGpuMissing"),
    "xid": ("gpu", CONDITION_GPU_XID),
    "sxid": ("nvlink", "DsxNvswitchSxid"),
    "ecc": ("gpu", "DsxGpuEcc"),
    "remap": ("gpu", "DsxGpuMemoryRemap"),
    "thermal": ("gpu", "DsxGpuThermal"),
    "pcie": ("gpu", "DsxGpuPcieDegraded"),
    "nvlink": ("nvlink", "DsxNvlinkDegraded"),
    "reset-required": ("gpu", "DsxGpuResetRequired"),
    "nic": ("nic", CONDITION_NIC_DEGRADED),
    "nvml": ("node", "DsxNvmlUnavailable"),
    "probe": ("node", "DsxSentinelProbeFailed"),
    "node-problem": ("node", "DsxNodeProblem"),
    "not-ready": ("node", "DsxNodeNotReady"),
}
"""Every check the sentinel's probes run, by name: the component it is about, and the node condition it
sets (``status=True``: the problem is present). The one table of checks; the views below read it."""

CONDITION_SENTINEL: Final[dict[str, str]] = {check: cond for check, (_, cond) in SENTINEL_CHECKS.items()}
"""The node condition each sentinel check sets, by check name (a view of :data:`SENTINEL_CHECKS`)."""


class Certification(enum.StrEnum):
    """Values of the ``dsx.dev/certification`` label."""

    passed = "passed"
    failed = "failed"
    pending = "pending"


class NodeState(enum.StrEnum):
    """Values of the ``dsx.dev/state`` label, in the order remediation moves through them."""

    quarantined = "quarantined"
    draining = "draining"
    awaiting_repair = "awaiting-repair"
    recertifying = "recertifying"
    escalated = "escalated"


def is_managed(labels: dict[str, str]) -> bool:
    """Whether dsx may act on a node with these labels (``dsx.dev/managed=false`` opts it out)."""
    return labels.get(LABEL_MANAGED, "").lower() != MANAGED_FALSE


# Environment variables. Where dsx runs: which cluster and namespace, and where a step's evidence goes.
ENV_CLUSTER: Final = "DSX_CLUSTER"
"""The cluster spec (``sim:...``, ``state:PATH``, ``kube``); :func:`steps.cluster.connect` reads it."""
ENV_NAMESPACE: Final = "DSX_NAMESPACE"
"""The namespace dsx works in (its Leases, ConfigMaps, Jobs); the workflow's namespace in a pod."""
ENV_KUBE_CONTEXT: Final = "DSX_KUBE_CONTEXT"
"""The kubeconfig context ``dsx run --context`` hands the local runner's steps."""
ENV_OUTPUT_DIR: Final = "DSX_OUTPUT_DIR"
"""The folder for a step's evidence and output parameters (set by the workflow and the runner)."""
ENV_DEBUG: Final = "DSX_DEBUG"
"""``1``: the ``dsx`` command prints the traceback of an error. ``workflows.cli.main`` spells it again,
since the command must start without loading this package; a test keeps the two equal."""
ENV_LOCAL_RUN: Final = "DSX_LOCAL_RUN"
"""Set by the local runner for every step: ``HOST:PID`` of the ``dsx run --local`` process, which a run's
holds on nodes name (a local run has no Workflow object to look up: its process is what lives)."""
ENV_RETRY_ATTEMPTS: Final = "DSX_RETRY_ATTEMPTS"
"""Attempts of one API call that fails transiently (see :mod:`steps.cluster.retry`)."""
ENV_RETRY_BASE_DELAY: Final = "DSX_RETRY_BASE_DELAY"
"""The first back-off delay between those attempts, in seconds."""

# Readiness: the group tests' Jobs and the ranks they run.
ENV_GPU_IMAGE: Final = "DSX_GPU_IMAGE"
"""The image of the rank pods (the chart value ``gpuImage``)."""
ENV_RANK_SERVICE_ACCOUNT: Final = "DSX_RANK_SERVICE_ACCOUNT"
"""The service account of the rank pods."""
ENV_RANK_POD: Final = "DSX_RANK_POD"
"""The operator's rank pod profile, JSON (the chart value ``rankPods``)."""
ENV_JOB_POLL_S: Final = "DSX_JOB_POLL_S"
"""Seconds between two looks at a group test's Job."""
ENV_API_OUTAGE_S: Final = "DSX_API_OUTAGE_S"
"""Seconds a group test's wait goes on looking while the API server cannot be reached (each look already
retried), before the step gives up with an error."""
ENV_SCHEDULE_BUDGET_S: Final = "DSX_SCHEDULE_BUDGET_S"
"""Seconds a group test's pods may take to be scheduled before the test fails."""
ENV_STALE_WAIT_S: Final = "DSX_STALE_WAIT_S"
"""Seconds to wait for a stale Job of an earlier attempt to go."""
ENV_SHM_SIZE: Final = "DSX_SHM_SIZE"
"""The size of the rank pods' ``/dev/shm``."""
ENV_NODE_NAME: Final = "DSX_NODE_NAME"
"""In a rank: the node it runs on (the pod's ``spec.nodeName``; the host name when unset)."""
ENV_PHASE_FILE: Final = "DSX_PHASE_FILE"
"""In a rank: the file it records its phase in, so that a hung rank can be told apart."""
ENV_FAIL_FILE: Final = "DSX_FAIL_FILE"
"""In a rank: the file a failing rank writes its error to."""
ENV_RENDEZVOUS_FILE: Final = "DSX_RENDEZVOUS_FILE"
"""In a local rank: the file where rank 0 writes the port its store listens on, for the other ranks
(set instead of ``MASTER_PORT``)."""
ENV_REPORTS_KEPT: Final = "DSX_REPORTS_KEPT"
"""How many certification reports are kept in the cluster."""

# Sentinel: remediation.
ENV_LEDGER_RETENTION_DAYS: Final = "DSX_LEDGER_RETENTION_DAYS"
"""Days the remediation ledger keeps (the chart value ``remediate.ledger.retentionDays``)."""

# Sentinel: the node agent.
ENV_SENTINEL_OVERRIDES: Final = "DSX_SENTINEL_OVERRIDES"
"""A fault catalogue overrides file (the cluster's own severities, actions and modes)."""
ENV_FAULT_HISTORY: Final = "DSX_FAULT_HISTORY"
"""The cluster's fault history rules (a FaultHistory as JSON or YAML, the chart's
``sentinel.overrides.history``) given to dsx-remediate's guard, whose lemon rule it applies; empty: the
overrides file of ``DSX_SENTINEL_OVERRIDES`` where there is one, else the shipped rules."""
ENV_FAULT_OVERRIDES: Final = "DSX_FAULT_OVERRIDES"
"""The cluster's whole fault catalogue overrides (a FaultOverrides body as JSON or YAML, the chart's
``sentinel.overrides``) given to dsx-reconcile, which judges the nodes whose agent may be down
(``not-ready``); empty: the overrides file of ``DSX_SENTINEL_OVERRIDES`` where there is one, else none."""
ENV_SENTINEL_SYSFS: Final = "DSX_SENTINEL_SYSFS"
"""Where the node's ``/sys`` is mounted in the agent's pod (default ``/sys``)."""
ENV_SENTINEL_KERNEL_LOG: Final = "DSX_SENTINEL_KERNEL_LOG"
"""The kernel log the agent reads: ``/dev/kmsg`` (default) or a file of ``dmesg``/``journalctl -k`` lines."""
ENV_SENTINEL_STATE_DIR: Final = "DSX_SENTINEL_STATE_DIR"
"""Where on the node the agent keeps its state across restarts in one boot (a host directory)."""

# Runtime.
ENV_HELM_NAMESPACES: Final = "DSX_HELM_NAMESPACES"
"""The namespaces a snapshot reads Helm releases from (the chart value ``drift.helmNamespaces``)."""

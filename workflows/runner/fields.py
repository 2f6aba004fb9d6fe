"""The fields of a workflow the local runner knows: those it carries out, those with no meaning on one
machine (ignored), and a hint for each it rejects (:mod:`workflows.runner.validate` checks them).

A field in none of the sets is rejected: the runner never silently skips something that would change
what the workflow does on Argo.
"""

from __future__ import annotations

__all__ = [
    "CONTAINER_IGNORED",
    "CONTAINER_SUPPORTED",
    "HINTS",
    "SPEC_IGNORED",
    "SPEC_SUPPORTED",
    "TASK_KEYS",
    "TEMPLATE_IGNORED",
    "TEMPLATE_SUPPORTED",
    "TEMPLATE_TYPES",
]

SPEC_SUPPORTED = {
    "entrypoint",
    "arguments",
    "templates",
    "onExit",
    "parallelism",
    "artifactRepositoryRef",
    "synchronization",
}
SPEC_IGNORED = {
    "serviceAccountName",
    "automountServiceAccountToken",
    "executor",
    "nodeSelector",
    "tolerations",
    "affinity",
    "imagePullSecrets",
    "securityContext",
    "podGC",
    "ttlStrategy",
    "podMetadata",
    "workflowMetadata",
    "priority",
    "podPriorityClassName",
    "podPriority",
    "schedulerName",
    "podDisruptionBudget",
    "hostNetwork",
    "dnsPolicy",
    "dnsConfig",
    "hostAliases",
    "metrics",
    "archiveLogs",
    "podSpecPatch",
}
TEMPLATE_SUPPORTED = {
    "name",
    "inputs",
    "outputs",
    "dag",
    "steps",
    "script",
    "container",
    "resource",
    "suspend",
    "retryStrategy",
    "timeout",
    "activeDeadlineSeconds",
    "parallelism",
    "synchronization",
}
TEMPLATE_IGNORED = {
    "metadata",
    "nodeSelector",
    "affinity",
    "tolerations",
    "serviceAccountName",
    "automountServiceAccountToken",
    "securityContext",
    "podSpecPatch",
    "priorityClassName",
    "priority",
    "schedulerName",
    "hostAliases",
    "metrics",
    "executor",
    "failFast",
}
TEMPLATE_TYPES = ("dag", "steps", "script", "container", "resource", "suspend")
CONTAINER_SUPPORTED = {"image", "command", "args", "source", "env", "name"}
CONTAINER_IGNORED = {
    "imagePullPolicy",
    "resources",
    "securityContext",
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "tty",
}
TASK_KEYS = {
    "name",
    "template",
    "templateRef",
    "arguments",
    "when",
    "withItems",
    "withParam",
    "onExit",
    "continueOn",
}
HINTS = {
    "volumes": "steps share files through $DSX_OUTPUT_DIR and output parameters",
    "volumeMounts": "steps share files through $DSX_OUTPUT_DIR and output parameters",
    "volumeClaimTemplates": "steps share files through $DSX_OUTPUT_DIR and output parameters",
    "artifacts": "artifacts other than outputs under /tmp/dsx-out are not kept locally",
    "hooks": "use onExit",
    "memoize": "every local run starts from scratch",
    "semaphores": "use mutexes (a local run has no ConfigMap of semaphore limits)",
    "withSequence": "use withItems",
    "inline": "name a template",
    "templateDefaults": "set the fields on each template",
    "retryStrategy": "set retryStrategy on each template",
    "workflowTemplateRef": "run the WorkflowTemplate by name",
    "valueFrom": "pass the value as a parameter",
}

"""The Helm chart: every compiled file installed with the chart's values applied, and the RBAC, pod security,
retries, garbage collection and artifacts a real cluster needs. Rendered with real helm."""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hera.workflows import DAG, Artifact, CronWorkflow

from steps.cluster import connect
from tests import yamltext
from tests.paths import CHART, helm_binary, shared_path
from tests.workflows.fixtures.demo_steps import greet
from workflows import compiler
from workflows.runner import RunOptions, run
from workflows.templates._base import (
    DEFAULT_IMAGE,
    OUTPUT_DIR,
    param,
    rank_env,
    step,
    workflow_spec,
    workflow_template,
)

WORKFLOW_KINDS = ("WorkflowTemplate", "CronWorkflow", "Workflow")
ACCOUNTS = {
    "dsx-bisect": "dsx-bisect",
    "dsx-certify": "dsx-certify",
    "dsx-recipe": "dsx-recipe",
    "dsx-bundle": "dsx-bundle",
    "dsx-drift": "dsx-drift",
    "dsx-remediate": "dsx-remediate",
    "dsx-goodput": "dsx-goodput",
    "dsx-reconcile": "dsx-reconcile",
    "dsx-repair-webhook": "dsx-repair",
}
SENTINEL_ACCOUNT = "dsx-sentinel"


def _run(cmd: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)


def _docs(rendered: str) -> list[dict[str, Any]]:
    return [d for d in yamltext.load_all(rendered) if d]


def _template(chart: Path, *values: str, release: str = "dsx", namespace: str = "gpu-ops") -> str:
    """``helm template`` of ``chart`` with ``--set`` ``values``; the rendered text."""
    cmd = [helm_binary(), "template", release, str(chart), "--namespace", namespace]
    for value in values:
        cmd += ["--set", value]
    rendered = _run(cmd)
    assert rendered.returncode == 0, rendered.stderr
    return rendered.stdout


def _render(chart: Path, *values: str, release: str = "dsx") -> list[dict[str, Any]]:
    return _docs(_template(chart, *values, release=release))


def _validate(rendered: str) -> None:
    tool = shared_path("tools", "validate-manifests")
    checked = _run([sys.executable, str(tool), "-"], stdin=rendered)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]
    return spec["workflowSpec"] if doc["kind"] == "CronWorkflow" else spec


def _workflows(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in WORKFLOW_KINDS}


def _pod_templates(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(template, container) of every template that runs a pod."""
    found = []
    for template in _spec(doc)["templates"]:
        for kind in ("script", "container"):
            if kind in template:
                found.append((template, template[kind]))
    return found


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def _of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _granted(docs: list[dict[str, Any]], account: str) -> list[tuple[str, str, str, str]]:
    """Every (namespace or '*', api group, resource, verb) the bindings give ``account``."""
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}
    grants = []
    for binding in _of(docs, "RoleBinding") + _of(docs, "ClusterRoleBinding"):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
            continue
        namespace = binding["metadata"].get("namespace", "*")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], "" if ref["kind"] == "ClusterRole" else namespace, ref["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        grants.append((namespace, group, resource, verb))
    return sorted(grants)


# ------------------------------------------------------------------ a chart with fixture workflows


def _fixture_objects() -> list[Any]:
    """A WorkflowTemplate whose step launches rank pods, and a dsx-drift CronWorkflow, built like dsx's."""
    launch = step(
        greet,
        timeout="1m",
        retries=2,
        env={"DSX_IMAGE": DEFAULT_IMAGE, **rank_env()},
        outputs=[Artifact(name="evidence", path=OUTPUT_DIR)],
    )
    with (
        workflow_template(
            "dsx-certify", "Fixture.", "main", [param("nodes", "Nodes.", '["n"]'), param("word", "W.", "hi")]
        ) as wt,
        DAG(name="main"),
    ):
        launch(arguments={"nodes": wt.get_parameter("nodes"), "word": wt.get_parameter("word")})
    drift = step(greet, env={"DSX_HELM_NAMESPACES": ""})
    with (
        CronWorkflow(
            name="dsx-drift",
            schedules=["0 6 * * *"],
            entrypoint="main",
            annotations={"workflows.argoproj.io/description": "Fixture."},
            arguments=[param("nodes", "Nodes.", '["n"]'), param("word", "W.", "hi")],
            **workflow_spec("dsx-drift"),
        ) as cron,
        DAG(name="main"),
    ):
        drift(arguments={"nodes": cron.get_parameter("nodes"), "word": cron.get_parameter("word")})
    return [wt, cron]


@pytest.fixture
def fixture_chart(tmp_path: Path) -> Path:
    """A copy of the chart whose files/ holds the fixture workflows only."""
    chart = tmp_path / "dsx"
    shutil.copytree(CHART, chart)
    for old in (chart / "files").glob("*.yaml"):
        old.unlink()
    compiler.write([compiler.render(obj, "tests.test_chart") for obj in _fixture_objects()], chart / "files")
    return chart


# ------------------------------------------------------------------ lint and schema


def test_helm_lint_passes_on_the_chart() -> None:
    for values in ([], ["drift.helmNamespaces={gpu-operator}", "artifacts.enabled=true"]):
        sets = [a for v in values for a in ("--set", v)]
        result = _run([helm_binary(), "lint", str(CHART), *sets])
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["artifacts.enabled=true", "artifacts.repositoryRef.configMap=artifacts", "imagePullSecrets={reg}"],
        ["drift.allNamespaces=true", "rankPods.hostNetwork=true", "rankPods.capabilities={IPC_LOCK}"],
    ],
    ids=["defaults", "artifacts-and-pull-secrets", "all-namespaces"],
)
def test_helm_template_of_the_chart_passes_validate_manifests(values: list[str]) -> None:
    _validate(_template(CHART, *values))


# ------------------------------------------------------------------ service accounts and RBAC


def test_each_workflow_runs_as_its_own_service_account() -> None:
    docs = _render(CHART)
    workflows = _workflows(docs)
    assert {name: _spec(doc)["serviceAccountName"] for name, doc in workflows.items()} == ACCOUNTS
    assert sorted(d["metadata"]["name"] for d in _of(docs, "ServiceAccount")) == sorted(
        [*ACCOUNTS.values(), "dsx-ranks", SENTINEL_ACCOUNT]
    )
    renamed = _render(CHART, "serviceAccounts.names.certify=certifier", "serviceAccounts.names.ranks=ranker")
    assert _spec(_workflows(renamed)["dsx-certify"])["serviceAccountName"] == "certifier"
    assert _granted(renamed, "certifier") == _granted(docs, "dsx-certify")
    assert _granted(renamed, "ranker") == _granted(docs, "dsx-ranks")
    assert "ServiceAccount" not in {d["kind"] for d in _render(CHART, "serviceAccounts.create=false")}


def test_every_account_gets_only_what_its_steps_call() -> None:
    docs = _render(CHART)
    executor = ("gpu-ops", "argoproj.io", "workflowtaskresults")
    for account in ACCOUNTS.values():
        assert {g[3] for g in _granted(docs, account) if g[:3] == executor} == {"create", "patch"}
    assert [g for g in _granted(docs, "dsx-recipe") if g[:3] != executor] == []
    assert [g for g in _granted(docs, "dsx-bundle") if g[:3] != executor] == []
    assert _granted(docs, "dsx-ranks") == [  # rank 0 patches the state ConfigMap the step made
        ("gpu-ops", "", "configmaps", "patch"),
    ]
    certify = _granted(docs, "dsx-certify")
    assert {(g[0], g[2], g[3]) for g in certify if g[2] == "nodes"} == {
        ("*", "nodes", "get"),
        ("*", "nodes", "list"),
        ("*", "nodes", "patch"),
    }
    # Node Events are accepted only in namespace default; nothing else of certify's is there.
    assert [g for g in certify if g[0] == "default"] == [("default", "", "events", "create")]
    assert ("gpu-ops", "argoproj.io", "workflows", "get") in certify
    assert {g[2] for g in certify if g[0] == "gpu-ops" and g[3] == "create"} >= {
        "jobs",
        "services",
        "configmaps",
    }
    assert not [g for g in certify if g[0] == "*" and g[2] != "nodes"]
    everything = [g for account in [*ACCOUNTS.values(), "dsx-ranks"] for g in _granted(docs, account)]
    assert not [g for g in everything if "*" in g[1:]]


def test_the_goodput_account_reads_nodes_ledger_and_events_and_keeps_its_report() -> None:
    docs = _render(CHART)
    assert _granted(docs, "dsx-goodput") == [
        ("*", "", "nodes", "list"),
        ("default", "", "events", "list"),
        ("gpu-ops", "", "configmaps", "create"),
        ("gpu-ops", "", "configmaps", "get"),
        ("gpu-ops", "", "configmaps", "list"),  # the ledger: a ConfigMap per node and month, by label
        ("gpu-ops", "", "configmaps", "patch"),
        ("gpu-ops", "argoproj.io", "workflowtaskresults", "create"),
        ("gpu-ops", "argoproj.io", "workflowtaskresults", "patch"),
    ]


def test_no_account_may_read_secrets_unless_a_value_asks() -> None:
    docs = _render(CHART)
    for account in [*ACCOUNTS.values(), "dsx-ranks"]:
        assert not [g for g in _granted(docs, account) if g[2] == "secrets"], account
    drift = _workflows(docs)["dsx-drift"]
    assert drift["spec"]["suspend"] is True  # it could read no Helm release
    (launch,) = [c for t, c in _pod_templates(drift) if t["name"] == "detect-drift"]
    assert _env(launch)["DSX_HELM_NAMESPACES"] == ""

    listed = _render(CHART, "drift.helmNamespaces={nvidia-network-operator,gpu-operator}")
    secrets = [g for g in _granted(listed, "dsx-drift") if g[2] == "secrets"]
    assert secrets == [
        ("gpu-operator", "", "secrets", "list"),
        ("nvidia-network-operator", "", "secrets", "list"),
    ]
    workloads = {(g[0], g[2]) for g in _granted(listed, "dsx-drift") if g[1] == "apps"}
    assert workloads == {
        (ns, kind) for ns, _, _, _ in secrets for kind in ("daemonsets", "deployments", "statefulsets")
    }
    assert not [d for d in _of(listed, "ClusterRole") if any("secrets" in r["resources"] for r in d["rules"])]
    drift = _workflows(listed)["dsx-drift"]
    assert "suspend" not in drift["spec"]
    (launch,) = [c for t, c in _pod_templates(drift) if t["name"] == "detect-drift"]
    assert _env(launch)["DSX_HELM_NAMESPACES"] == "gpu-operator,nvidia-network-operator"

    everywhere = _render(CHART, "drift.allNamespaces=true")
    assert ("*", "", "secrets", "list") in _granted(everywhere, "dsx-drift")
    (launch,) = [
        c for t, c in _pod_templates(_workflows(everywhere)["dsx-drift"]) if t["name"] == "detect-drift"
    ]
    assert _env(launch)["DSX_HELM_NAMESPACES"] == ""


def test_rbac_names_are_scoped_to_the_release() -> None:
    for release in ("dsx", "lab"):
        docs = _render(CHART, "drift.helmNamespaces={gpu-operator}", release=release)
        kinds = ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
        names = [d["metadata"]["name"] for d in docs if d["kind"] in kinds]
        assert names and all(n.startswith(f"{release}-dsx-") for n in names), names


# ------------------------------------------------------------------ workflow pods


def test_every_workflow_pod_meets_pod_security_restricted() -> None:
    workflows = _workflows(_render(CHART))
    assert set(workflows) == set(ACCOUNTS)
    for name, doc in workflows.items():
        spec = _spec(doc)
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, name
        assert pod["runAsUser"] == pod["runAsGroup"] == pod["fsGroup"] == 65532, name
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", name
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC", "volumes")), name
        pods = _pod_templates(doc)
        assert pods, name
        for template, container in pods:
            where = f"{name}/{template['name']}"
            assert "securityContext" not in template and "podSpecPatch" not in template, where
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, where
            assert context.get("privileged") is not True, where
            assert "ALL" in context["capabilities"]["drop"], where
            assert set(context["capabilities"].get("add") or []) <= {"NET_BIND_SERVICE"}, where
            assert context.get("runAsUser", 65532) != 0 and context.get("runAsNonRoot", True), where
            assert container["resources"]["requests"].keys() >= {"cpu", "memory"}, where
            assert "memory" in container["resources"]["limits"], where


def test_every_workflow_collects_its_pods_and_itself() -> None:
    for name, doc in _workflows(_render(CHART)).items():
        spec = _spec(doc)
        assert spec["podGC"]["strategy"] in ("OnPodSuccess", "OnPodCompletion"), name
        assert spec["podGC"]["deleteDelayDuration"], name
        ttl = spec["ttlStrategy"]
        assert ttl.get("secondsAfterCompletion") or (
            ttl["secondsAfterSuccess"] and ttl["secondsAfterFailure"]
        )


def test_retried_steps_retry_infrastructure_errors_only() -> None:
    retried = 0
    for name, doc in _workflows(_render(CHART)).items():
        for template in _spec(doc)["templates"]:
            strategy = template.get("retryStrategy")
            if strategy is None:
                continue
            retried += 1
            where = f"{name}/{template['name']}"
            assert strategy["retryPolicy"] == "OnError", where
            assert strategy["backoff"]["duration"], where
    assert retried >= 3


def test_image_pull_secrets_reach_every_workflow_and_the_rank_pods(fixture_chart: Path) -> None:
    assert all("imagePullSecrets" not in _spec(d) for d in _workflows(_render(CHART)).values())
    docs = _render(CHART, "imagePullSecrets={reg,mirror}")
    for name, doc in _workflows(docs).items():
        assert _spec(doc)["imagePullSecrets"] == [{"name": "reg"}, {"name": "mirror"}], name
    fixture = _render(fixture_chart, "imagePullSecrets={reg}", "rankPods.imagePullSecrets={gpu-reg,reg}")
    (launch,) = [c for _, c in _pod_templates(_workflows(fixture)["dsx-certify"])]
    assert json.loads(_env(launch)["DSX_RANK_POD"])["imagePullSecrets"] == ["reg", "gpu-reg"]


# ------------------------------------------------------------------ artifacts


def test_output_artifacts_are_removed_without_an_artifact_repository() -> None:
    compiled = [yamltext.load(p.read_text()) for p in (CHART / "files").glob("*.yaml")]
    assert any(t.get("outputs", {}).get("artifacts") for d in compiled for t in _spec(d)["templates"])
    for name, doc in _workflows(_render(CHART)).items():
        spec = _spec(doc)
        assert "artifactRepositoryRef" not in spec, name
        assert not [t["name"] for t in spec["templates"] if "artifacts" in (t.get("outputs") or {})], name
        assert all(t.get("outputs") != {} for t in spec["templates"]), name


@pytest.mark.parametrize("value", ["", "suspend"])
def test_the_chart_chooses_how_remediation_waits_for_the_repair(value: str) -> None:
    docs = _render(CHART, *([f"remediate.repairWait={value}"] if value else []))
    spec = _spec(_workflows(docs)["dsx-remediate"])
    (wait,) = [p for p in spec["arguments"]["parameters"] if p["name"] == "repair-wait"]
    assert wait["value"] == (value or "node") and wait["value"] in wait["enum"]
    (suspend,) = [t for t in spec["templates"] if t["name"] == "repair-suspend"]
    assert suspend["suspend"]["duration"] == "{{workflow.parameters.repair-timeout}}"
    _validate(yaml.safe_dump_all(docs))


@pytest.mark.parametrize("value", ["", "30"])
def test_the_chart_sets_how_long_the_ledger_keeps_on_every_step_that_writes_it(value: str) -> None:
    docs = _render(CHART, *([f"remediate.ledger.retentionDays={value}"] if value else []))
    remediate = _workflows(docs)["dsx-remediate"]
    kept = {t["name"]: _env(c).get("DSX_LEDGER_RETENTION_DAYS") for t, c in _pod_templates(remediate)}
    writers = ("guard", "quarantine", "drain", "request-repair", "repair-wait", "repaired", "conclude")
    assert {kept[name] for name in (*writers, "record-outcome")} == {value or "400"}
    # Retention lists the ledger's ConfigMaps by label and deletes the months past it.
    ledger = {g[3] for g in _granted(docs, "dsx-remediate") if g[:3] == ("gpu-ops", "", "configmaps")}
    assert ledger >= {"get", "list", "create", "update", "delete"}
    _validate(yaml.safe_dump_all(docs))


@pytest.mark.parametrize("value", ["0", "1.5", "abc", "3661"])
def test_a_ledger_retention_that_is_no_whole_number_of_days_fails_the_install(value: str) -> None:
    cmd = [helm_binary(), "template", "dsx", str(CHART), "--set", f"remediate.ledger.retentionDays={value}"]
    rendered = _run(cmd)
    assert rendered.returncode != 0
    assert f"remediate.ledger.retentionDays: {value} is not a whole number of days" in rendered.stderr


def test_output_artifacts_are_kept_with_the_repository_named() -> None:
    docs = _render(CHART, "artifacts.enabled=true", "artifacts.repositoryRef.configMap=repos")
    for name, doc in _workflows(docs).items():
        assert _spec(doc)["artifactRepositoryRef"] == {"configMap": "repos"}, name
    kept = {
        (name, t["name"]): [a["name"] for a in t["outputs"]["artifacts"]]
        for name, doc in _workflows(docs).items()
        for t in _spec(doc)["templates"]
        if "artifacts" in (t.get("outputs") or {})
    }
    assert kept[("dsx-recipe", "resolve-recipe")] == ["recipe"]
    assert kept[("dsx-drift", "detect-drift")] == ["drift"]
    both = _render(CHART, "artifacts.enabled=true", "artifacts.repositoryRef.key=s3")
    assert _spec(_workflows(both)["dsx-drift"])["artifactRepositoryRef"] == {"key": "s3"}
    plain = _render(CHART, "artifacts.enabled=true")
    assert all("artifactRepositoryRef" not in _spec(d) for d in _workflows(plain).values())


@pytest.mark.story
def test_recipe_and_drift_give_their_results_without_artifacts(tmp_path: Path) -> None:
    """What the chart installs by default runs, and its user still gets the result, labels and gate."""
    workflows = _workflows(_render(CHART))
    criteria = {"service": "eks", "accelerator": "h100", "os": "ubuntu", "intent": "training"}
    recipe = run(
        workflows["dsx-recipe"],
        (),
        criteria,
        RunOptions(out_dir=tmp_path / "recipe", trusted=compiler.trusted_steps()),
    )
    assert recipe.phase == "Succeeded", recipe.message
    (output,) = recipe.outputs["parameters"]
    assert output["name"] == "recipe" and json.loads(output["value"])["digest"].startswith("sha256:")

    cron = workflows["dsx-drift"]
    workflow = {"apiVersion": cron["apiVersion"], "kind": "Workflow", "metadata": {"name": "drift-run"}}
    workflow["spec"] = cron["spec"]["workflowSpec"]
    fleet = "sim:nodes=2,gpu=h100,faults=node-01:driver=570.124.06"
    out = tmp_path / "drift"
    drift = run(
        workflow,
        (),
        {**criteria, "scope": "nodes"},
        RunOptions(out_dir=out, cluster=fleet, trusted=compiler.trusted_steps()),
    )
    assert drift.phase == "Failed"
    assert drift.node("gate").message.endswith("1 critical, 0 warning; nodes node-01")
    labels = {n.name: n.labels.get("dsx.dev/drift") for n in connect(f"state:{out}/fleet.json").list_nodes()}
    assert labels == {"node-00": None, "node-01": "true"}


# ------------------------------------------------------------------ values applied to the compiled files


def test_chart_applies_values_and_keeps_argo_expressions(fixture_chart: Path) -> None:
    docs = _render(
        fixture_chart,
        "image.repository=registry.example/dsx",
        "image.tag=1.2.3",
        "gpuImage.repository=registry.example/dsx-gpu",
        "gpuImage.tag=1.2.3-cuda",
        "serviceAccounts.names.ranks=fabric-ranks",
        "rankPods.resources.vpc\\.amazonaws\\.com/efa=32",
        "rankPods.capabilities={IPC_LOCK}",
        "rankPods.env[0].name=FI_PROVIDER",
        "rankPods.env[0].value=efa",
    )
    wt = _workflows(docs)["dsx-certify"]
    assert wt["metadata"]["namespace"] == "gpu-ops"
    ((launch_template, launch),) = _pod_templates(wt)
    assert launch["image"] == "registry.example/dsx:1.2.3"
    assert launch["source"] == "{{inputs.parameters}}"
    task = _spec(wt)["templates"][0]["dag"]["tasks"][0]
    assert task["arguments"]["parameters"][0]["value"] == "{{workflow.parameters.nodes}}"
    env = _env(launch)
    assert env["DSX_IMAGE"] == "registry.example/dsx:1.2.3"
    assert env["DSX_GPU_IMAGE"] == "registry.example/dsx-gpu:1.2.3-cuda"
    assert env["DSX_RANK_SERVICE_ACCOUNT"] == "fabric-ranks"
    profile = json.loads(env["DSX_RANK_POD"])
    assert profile["resources"] == {"vpc.amazonaws.com/efa": 32}
    assert profile["capabilities"] == ["IPC_LOCK"] and profile["env"] == [
        {"name": "FI_PROVIDER", "value": "efa"}
    ]
    assert profile["shmSize"] == "16Gi" and profile["hostNetwork"] is False
    assert launch_template["retryStrategy"]["retryPolicy"] == "OnError"
    _validate(yaml.safe_dump_all(docs))


def test_rank_pod_defaults_follow_the_chart_version(fixture_chart: Path) -> None:
    chart = yamltext.load((CHART / "Chart.yaml").read_text())
    ((_, launch),) = _pod_templates(_workflows(_render(fixture_chart))["dsx-certify"])
    env = _env(launch)
    assert env["DSX_GPU_IMAGE"] == f"ghcr.io/dsx-dev/dsx-gpu:{chart['appVersion']}"
    assert env["DSX_RANK_SERVICE_ACCOUNT"] == "dsx-ranks"
    assert json.loads(env["DSX_RANK_POD"]) == {
        "annotations": {},
        "capabilities": [],
        "env": [],
        "hostNetwork": False,
        "imagePullSecrets": [],
        "labels": {},
        "nodeSelector": {},
        "priorityClassName": "",
        "resources": {},
        "shmSize": "16Gi",
        "tolerations": [],
    }


# ------------------------------------------------------------------ the sentinel DaemonSet


def _sentinel_grants(dsx: str = "gpu-ops", sentinel: str = "dsx-sentinel") -> list[tuple[str, str, str, str]]:
    """What steps/sentinel/agent.py calls through the cluster port, and nothing else: its node's writes, node
    Events, the taint budget's ConfigMap in dsx's namespace, and its own DaemonSet (the GPU node count)."""
    return sorted(
        [
            ("*", "", "nodes", "get"),
            ("*", "", "nodes", "patch"),
            ("*", "", "nodes/status", "patch"),
            ("default", "", "events", "create"),
            (dsx, "", "configmaps", "create"),
            (dsx, "", "configmaps", "get"),
            (dsx, "", "configmaps", "update"),
            (sentinel, "apps", "daemonsets", "get"),
        ]
    )


SENTINEL_GRANTS = _sentinel_grants()


def _sentinel(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, container) of the sentinel DaemonSet."""
    (daemonset,) = [d for d in _of(docs, "DaemonSet") if d["metadata"]["name"] == "dsx-sentinel"]
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def _tolerates(tolerations: list[dict[str, Any]], key: str, effect: str) -> bool:
    """Whether a pod with ``tolerations`` tolerates the taint ``key`` (no value) with ``effect``, as
    Kubernetes' ``Toleration.ToleratesTaint`` decides."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != effect:
            continue
        if t.get("key", "") not in ("", key) or (not t.get("key") and t.get("operator") != "Exists"):
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value", "") == "":
            return True
    return False


def _strict(definition: str) -> Any:
    """A validator of one Kubernetes core/v1 definition (from the Argo schema), unknown fields refused."""
    import jsonschema

    schema = json.loads(shared_path("schemas", "argo-workflows.schema.json").read_text(encoding="utf-8"))
    for d in schema["definitions"].values():
        if "properties" in d:
            d.setdefault("additionalProperties", False)
    schema["definitions"]["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["integer", "string"]}
    schema["definitions"]["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": ["integer", "string"]}
    root = {"definitions": schema["definitions"], "$ref": f"#/definitions/io.k8s.api.core.v1.{definition}"}
    return jsonschema.Draft202012Validator(root)


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["sentinel.serviceMonitor.enabled=true", "sentinel.overrides.modes.thermal=observe"],
        ["sentinel.kernelLog=/var/log/kern.log", "sentinel.supplementalGroups={4}", "imagePullSecrets={reg}"],
        ["sentinel.kernelLog=", "sentinel.runtimeClassName=", "sentinel.namespace=dsx-system"],
    ],
    ids=["defaults", "monitor-and-overrides", "kernel-log-file", "no-kernel-log"],
)
def test_the_sentinel_lints_and_its_pod_is_valid_kubernetes(values: list[str]) -> None:
    sets = [a for v in values for a in ("--set", v)]
    linted = _run([helm_binary(), "lint", str(CHART), *sets])
    assert linted.returncode == 0, linted.stdout + linted.stderr
    docs = _render(CHART, *values)
    pod, container = _sentinel(docs)
    checks = [("Container", container), ("PodSecurityContext", pod["securityContext"])]
    checks += [("Volume", v) for v in pod["volumes"]] + [("Toleration", t) for t in pod["tolerations"]]
    for definition, obj in checks:
        errors = [e.message for e in _strict(definition).iter_errors(obj)]
        assert errors == [], (definition, errors)


def test_the_sentinel_runs_on_gpu_nodes_only_and_keeps_running_on_a_node_it_tainted() -> None:
    pod, container = _sentinel(_render(CHART))
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "affinity" not in pod
    assert _tolerates(pod["tolerations"], "dsx.dev/unhealthy", "NoSchedule")
    assert _tolerates(pod["tolerations"], "nvidia.com/gpu", "NoSchedule")
    assert not _tolerates(pod["tolerations"], "node.kubernetes.io/out-of-service", "NoExecute")
    # NVML from the host's driver through the NVIDIA runtime, every GPU visible, none taken from jobs.
    assert pod["runtimeClassName"] == "nvidia"
    assert _env(container)["NVIDIA_VISIBLE_DEVICES"] == "all"
    for kind in ("requests", "limits"):
        assert not [r for r in container["resources"][kind] if "gpu" in r], kind
    assert container["resources"]["requests"].keys() >= {"cpu", "memory"}
    assert container["resources"]["limits"].keys() >= {"cpu", "memory"}
    custom, _ = _sentinel(
        _render(
            CHART,
            "sentinel.runtimeClassName=nvidia-cdi",
            "sentinel.nodeSelector.pool=train",
            "sentinel.tolerations[0].key=dedicated",
            "sentinel.tolerations[0].operator=Exists",
        )
    )
    assert custom["runtimeClassName"] == "nvidia-cdi"
    assert custom["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "train"}
    assert _tolerates(custom["tolerations"], "dedicated", "NoSchedule")
    assert _tolerates(custom["tolerations"], "dsx.dev/unhealthy", "NoSchedule")
    off = _render(CHART, "sentinel.enabled=false")
    assert not _of(off, "DaemonSet") and not _granted(off, SENTINEL_ACCOUNT)


def test_the_sentinel_runs_the_agent_with_the_environment_it_reads() -> None:
    from steps.cluster import vocabulary as vocab

    pod, container = _sentinel(_render(CHART))
    assert container["image"] == DEFAULT_IMAGE
    assert container["command"] == ["dsx", "sentinel", "agent"]
    assert "--metrics-port=9400" in container["args"]
    (node,) = [e for e in container["env"] if e["name"] == vocab.ENV_NODE_NAME]
    assert node["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    env = _env(container)
    assert env[vocab.ENV_CLUSTER] == "kube"
    assert env[vocab.ENV_SENTINEL_KERNEL_LOG] == "/dev/kmsg"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert env[vocab.ENV_SENTINEL_SYSFS] in mounts
    named = {getattr(vocab, n) for n in dir(vocab) if n.startswith("ENV_")}
    assert {n for n in env if n.startswith("DSX_")} <= named
    assert pod["serviceAccountName"] == SENTINEL_ACCOUNT
    # every probe bounded; the GPU count from the node's capacity unless the values name one
    assert "--probe-timeout=10" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--expected-gpus")]
    _, counted = _sentinel(_render(CHART, "sentinel.expectedGpus=8", "sentinel.probeTimeout=30"))
    assert {"--expected-gpus=8", "--probe-timeout=30"} <= set(counted["args"])
    # the state kept across restarts lives in the mounted host directory
    state = mounts[env[vocab.ENV_SENTINEL_STATE_DIR]]
    assert state["mountPath"] == "/var/lib/dsx-sentinel" and not state.get("readOnly")
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", 9400)
    overridden = _render(CHART, "sentinel.overrides.modes.thermal=observe")
    _, container = _sentinel(overridden)
    path = _env(container)[vocab.ENV_SENTINEL_OVERRIDES]
    (config,) = [d for d in _of(overridden, "ConfigMap") if "overrides.yaml" in d.get("data", {})]
    assert path == "/etc/dsx/sentinel/overrides.yaml"
    from steps.sentinel.catalogue import FaultOverrides  # the file the agent loads, as it reads it

    overrides = FaultOverrides.model_validate(yamltext.load(config["data"]["overrides.yaml"]))
    assert overrides.modes == {"thermal": "observe"}


def test_the_sentinel_takes_its_taint_budget_and_fabric_nics_from_the_values() -> None:
    from steps.cluster import vocabulary as vocab
    from steps.sentinel.budget import parse_daemonset
    from steps.sentinel.probes import parse_fabric_nics

    _, container = _sentinel(_render(CHART))
    args = dict(a.split("=", 1) for a in container["args"])
    assert (args["--taint-budget"], args["--taint-budget-window"]) == ("0.1", "1h")
    # the DaemonSet itself, in the sentinel's own namespace
    assert parse_daemonset(args["--fleet-daemonset"]) == ("dsx-sentinel", "dsx-sentinel")
    assert "--fabric-nics" not in args  # the RDMA ports and the interfaces up at start
    assert _env(container)[vocab.ENV_NAMESPACE] == "gpu-ops"  # the budget beside the breaker
    _, custom = _sentinel(
        _render(
            CHART,
            "sentinel.taintBudget.maxShare=0.05",
            "sentinel.taintBudget.window=30m",
            "sentinel.fabricNics={mlx5_*,ib[0-3]}",
            "sentinel.namespace=dsx-system",
        )
    )
    args = dict(a.split("=", 1) for a in custom["args"])
    assert (args["--taint-budget"], args["--taint-budget-window"]) == ("0.05", "30m")
    assert parse_fabric_nics(args["--fabric-nics"]) == ("mlx5_*", "ib[0-3]")
    assert parse_daemonset(args["--fleet-daemonset"]) == ("dsx-system", "dsx-sentinel")
    assert _env(custom)[vocab.ENV_NAMESPACE] == "gpu-ops"


def test_the_sentinel_mounts_only_what_it_reads_and_only_read_only() -> None:
    state = "/var/lib/dsx-sentinel"
    for values, host_paths in [
        ([], {"/sys", "/dev/kmsg", state}),
        (["sentinel.kernelLog=/var/log/kern.log"], {"/sys", "/var/log/kern.log", state}),
        (["sentinel.kernelLog=", "sentinel.stateDir="], {"/sys"}),
    ]:
        pod, container = _sentinel(_render(CHART, *values))
        where = values or "defaults"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v} == host_paths, where
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if volume.get("hostPath", {}).get("path") == state:  # its state: the one path it writes
                assert volume["hostPath"]["type"] == "DirectoryOrCreate" and not mount.get("readOnly")
                assert _env(container)["DSX_SENTINEL_STATE_DIR"] == mount["mountPath"] == state
            elif "hostPath" in volume or "configMap" in volume:
                assert mount.get("readOnly") is True, (where, mount)
        if state not in host_paths:
            assert "DSX_SENTINEL_STATE_DIR" not in _env(container), where
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), where
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, where
        if "/dev/kmsg" in host_paths:
            # The only way to open /dev/kmsg: the device cgroup of an unprivileged container refuses it.
            assert context["privileged"] is True and pod["securityContext"]["runAsUser"] == 0
        else:
            assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert pod["securityContext"]["runAsNonRoot"] is True, where
            assert pod["securityContext"]["runAsUser"] == 65532, where
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
    pod, _ = _sentinel(
        _render(CHART, "sentinel.kernelLog=/var/log/kern.log", "sentinel.supplementalGroups={4}")
    )
    assert pod["securityContext"]["supplementalGroups"] == [4]


def test_the_sentinel_account_may_do_exactly_what_the_agent_calls() -> None:
    docs = _render(CHART)
    assert _granted(docs, SENTINEL_ACCOUNT) == SENTINEL_GRANTS
    moved = _render(CHART, "sentinel.namespace=dsx-system", "sentinel.serviceAccount=watcher")
    pod, _ = _sentinel(moved)
    assert pod["serviceAccountName"] == "watcher"
    (daemonset,) = _of(moved, "DaemonSet")
    assert daemonset["metadata"]["namespace"] == "dsx-system"
    bindings = [
        b
        for b in _of(moved, "RoleBinding") + _of(moved, "ClusterRoleBinding")
        if "sentinel" in b["metadata"]["name"]
    ]
    assert {(s["name"], s["namespace"]) for b in bindings for s in b["subjects"]} == {
        ("watcher", "dsx-system")
    }
    assert _granted(moved, "watcher") == _sentinel_grants(sentinel="dsx-system")
    # the budget's ConfigMap and the DaemonSet by name only (a create cannot name its object)
    rules = [r for d in _of(docs, "Role") if "sentinel" in d["metadata"]["name"] for r in d["rules"]]
    named = {
        (g, res, v): r.get("resourceNames")
        for r in rules
        for g in r["apiGroups"]
        for res in r["resources"]
        for v in r["verbs"]
    }
    assert named[("", "configmaps", "get")] == named[("", "configmaps", "update")] == ["dsx-taint-budget"]
    assert named[("apps", "daemonsets", "get")] == ["dsx-sentinel"]
    assert named[("", "configmaps", "create")] is None


def _api_grant(method: str, path: str) -> tuple[str, str, str, str]:
    """The RBAC (namespace or '*', group, resource, verb) a request needs (core/v1 or /apis/GROUP/VERSION)."""
    parts = path.split("?")[0].strip("/").split("/")
    if parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        assert parts[:2] == ["api", "v1"], path
        group, rest = "", parts[2:]
    namespace = "*"
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch"}.get(
        method, method.lower()
    )
    return namespace, group, resource, verb


def test_every_call_the_agent_makes_is_granted_and_every_grant_is_used(tmp_path: Path) -> None:
    """The agent as the DaemonSet runs it (NVML source, the kubernetes client, the namespace and DaemonSet
    the chart gives it) on a node that loses a GPU (fatal: the taint budget asked, taint), then gets it
    back (condition cleared), then restarts, while a second node's fatal fault finds the budget spent (it
    holds): each request they sent to the emulated API server needs a grant of the chart's sentinel
    account, and each grant was needed."""
    from steps.cluster import RetryPolicy, load_fleet
    from steps.cluster.kube import KubeCluster, load_api_client
    from steps.sentinel.budget import BUDGET_CONFIGMAP, parse_daemonset
    from steps.sentinel.catalogue import load_catalogue
    from steps.sentinel.node import build_sentinel
    from tests.emulator.apiserver import Emulator, write_kubeconfig
    from tests.steps.sentinel.fake_nvml import FakeNvml, gpus

    _, container = _sentinel(_render(CHART))
    args = dict(a.split("=", 1) for a in container["args"])
    namespace, daemonset = _env(container)["DSX_NAMESPACE"], parse_daemonset(args["--fleet-daemonset"])
    devices, others = gpus(8), gpus(8)
    devices[3].lost = others[5].lost = True
    with Emulator() as emulator:
        emulator.seed(load_fleet("sim:nodes=2,gpu=h100,workloads=false").manifests())
        emulator.seed(
            [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "metadata": {"name": daemonset[1], "namespace": daemonset[0]},
                    "spec": {"selector": {"matchLabels": {"app": "s"}}},
                    "status": {"desiredNumberScheduled": 2},
                }
            ]
        )
        api_client, _ = load_api_client(str(write_kubeconfig(tmp_path / "kubeconfig", emulator.url)))
        port = KubeCluster(
            api_client,
            namespace=namespace,
            retry=RetryPolicy(attempts=2, base_delay=0.0, max_delay=0.0, jitter=0.0),
        )

        def agent(node: str = "node-01", gpus: Any = devices) -> Any:  # as the DaemonSet runs it
            return build_sentinel(
                port,
                node,
                load_catalogue(),
                source="nvml",
                nvml_module=FakeNvml(gpus),
                sysfs="/nonexistent",
                state_dir=tmp_path / "state",
                fleet_daemonset=daemonset,
            )

        first = agent()
        assert first.run_once().queued == 0
        devices[3].lost = False
        assert first.run_once().queued == 0
        assert agent().run_once().queued == 0
        assert agent("node-00", others).run_once().withheld == 1
        node = port.get_node("node-01")
        assert node.has_taint("dsx.dev/unhealthy", "NoSchedule")
        assert node.condition("DsxGpuMissing").status == "False"
        assert not port.get_node("node-00").taints
        assert port.get_state(BUDGET_CONFIGMAP)["state"] == "held"
        used = sorted({_api_grant(r.method, r.path) for r in emulator.requests})
    assert used == SENTINEL_GRANTS


def test_the_service_monitor_is_rendered_only_when_asked() -> None:
    assert not _of(_render(CHART), "ServiceMonitor")
    docs = _render(
        CHART, "sentinel.serviceMonitor.enabled=true", "sentinel.serviceMonitor.labels.release=prom"
    )
    (monitor,) = _of(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    (service,) = [s for s in _of(docs, "Service") if s["metadata"]["name"] == "dsx-sentinel"]
    assert service["spec"]["clusterIP"] == "None"
    (daemonset,) = _of(docs, "DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert endpoint["path"] == "/metrics"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}


# ------------------------------------------------------------------ no privilege to borrow


def _policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The ValidatingAdmissionPolicies by name, each checked to have its Deny binding."""
    policies = {d["metadata"]["name"]: d for d in _of(docs, "ValidatingAdmissionPolicy")}
    bindings = {d["spec"]["policyName"]: d for d in _of(docs, "ValidatingAdmissionPolicyBinding")}
    assert set(bindings) == set(policies)
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings.values())
    return policies


def test_the_accounts_that_create_jobs_and_workflows_are_pinned_by_admission_policies() -> None:
    policies = _policies(_render(CHART))
    jobs, workflows = policies["dsx-dsx-rank-jobs"], policies["dsx-dsx-remediate-workflows"]
    users = "system:serviceaccount:gpu-ops:"
    (matched,) = jobs["spec"]["matchConditions"]
    assert matched["expression"] == (
        f'request.userInfo.username in ["{users}dsx-certify","{users}dsx-bisect","{users}dsx-remediate"]'
    )
    assert jobs["spec"]["failurePolicy"] == "Fail"
    rules = " ".join(v["expression"] for v in jobs["spec"]["validations"])
    assert 'variables.pod.serviceAccountName == "dsx-ranks"' in rules
    assert 'x in ["IPC_LOCK"]' in rules and "hostNetwork" in rules and "hostPath" in rules
    (matched,) = workflows["spec"]["matchConditions"]
    assert matched["expression"] == f'request.userInfo.username in ["{users}dsx-reconcile"]'

    widened = _policies(
        _render(
            CHART,
            "admission.rankCapabilities={IPC_LOCK,NET_RAW}",
            "admission.rankHostNetwork=true",
            "events.enabled=true",
            "serviceAccounts.names.ranks=ranks",
        )
    )
    rules = " ".join(v["expression"] for v in widened["dsx-dsx-rank-jobs"]["spec"]["validations"])
    assert 'x in ["IPC_LOCK","NET_RAW"]' in rules and "hostNetwork" not in rules
    assert 'variables.pod.serviceAccountName == "ranks"' in rules
    (matched,) = widened["dsx-dsx-remediate-workflows"]["spec"]["matchConditions"]
    assert f'"{users}dsx-remediate-sensor"' in matched["expression"]
    assert _policies(_render(CHART, "admission.enabled=false")) == {}


def test_the_sentinel_lives_in_a_privileged_namespace_of_its_own_by_default() -> None:
    docs = _render(CHART)
    (namespace,) = _of(docs, "Namespace")
    assert namespace["metadata"]["name"] == "dsx-sentinel"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    (daemonset,) = _of(docs, "DaemonSet")
    assert daemonset["metadata"]["namespace"] == "dsx-sentinel"
    assert _of(_render(CHART, "sentinel.createNamespace=false"), "Namespace") == []
    assert _of(_render(CHART, "sentinel.namespace="), "Namespace") == []  # the chart's own namespace


def _remediate_parameters(docs: list[dict[str, Any]]) -> dict[str, str]:
    spec = _spec(_workflows(docs)["dsx-remediate"])
    return {p["name"]: p.get("value", "") for p in spec["arguments"]["parameters"]}


def test_the_repairs_that_act_are_off_until_the_chart_turns_them_on() -> None:
    docs = _render(CHART)
    pod, container = _sentinel(docs)
    assert not [
        a for a in container["args"] if a.startswith(("--reset-gpus", "--kured-sentinel", "--reboot-command"))
    ]
    assert "kured" not in {v["name"] for v in pod["volumes"]} and "hostPID" not in pod
    parameters = _remediate_parameters(docs)
    assert (parameters["repair-template"], parameters["repair-template-actions"]) == ("", "replace")
    assert ("gpu-ops", "argoproj.io", "workflows", "create") not in _granted(docs, "dsx-remediate")
    assert ("default", "", "events", "list") in _granted(docs, "dsx-remediate")  # the request's evidence
    assert "dsx-dsx-repair-workflows" not in _policies(docs)


def test_the_agent_resets_gpus_privileged_and_asks_kured_through_its_hosts_sentinel_file() -> None:
    docs = _render(
        CHART, "sentinel.repair.resetGpus=true", "sentinel.repair.kuredSentinel=/var/run/reboot-required"
    )
    pod, container = _sentinel(docs)
    assert (
        "--reset-gpus" in container["args"]
        and "--kured-sentinel=/host/kured/reboot-required" in container["args"]
    )
    (volume,) = [v for v in pod["volumes"] if v["name"] == "kured"]
    assert volume["hostPath"] == {"path": "/var/run", "type": "Directory"}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "kured"]
    assert mount == {"name": "kured", "mountPath": "/host/kured"}
    assert pod["securityContext"]["runAsUser"] == 0 and container["securityContext"]["privileged"] is True
    # kured alone, with the kernel log a host file: root (the owner of the host's /run), unprivileged, no
    # capability
    pod, container = _sentinel(
        _render(CHART, "sentinel.kernelLog=/var/log/kern.log", "sentinel.repair.kuredSentinel=/run/reboot")
    )
    assert pod["securityContext"]["runAsUser"] == 0
    assert container["securityContext"]["privileged"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    pod, container = _sentinel(_render(CHART, "sentinel.kernelLog=/var/log/kern.log"))
    assert (
        pod["securityContext"]["runAsUser"] == 65532
        and "add" not in container["securityContext"]["capabilities"]
    )
    refused = _run(
        [helm_binary(), "template", "dsx", str(CHART), "--set", "sentinel.repair.kuredSentinel=run/x"]
    )
    assert refused.returncode != 0
    assert 'sentinel.repair.kuredSentinel: "run/x" is not an absolute path on the host' in refused.stderr


def test_the_agents_own_reboot_enters_the_hosts_init_from_a_privileged_root_container() -> None:
    pod, container = _sentinel(
        _render(CHART, "sentinel.kernelLog=/var/log/kern.log", "sentinel.repair.agentReboot=true")
    )
    assert "--reboot-command=nsenter -m/proc/1/ns/mnt -- /bin/systemctl reboot" in container["args"]
    assert pod["hostPID"] is True and pod["securityContext"]["runAsUser"] == 0
    assert container["securityContext"]["privileged"] is True
    both = [
        helm_binary(),
        "template",
        "dsx",
        str(CHART),
        "--set",
        "sentinel.repair.agentReboot=true",
        "--set",
        "sentinel.repair.kuredSentinel=/var/run/reboot-required",
    ]
    refused = _run(both)
    assert refused.returncode != 0
    assert "kuredSentinel and agentReboot both set" in refused.stderr
    refused = _run([*both[:6], "--set", "sentinel.repair.rebootCommand="])
    assert refused.returncode != 0 and "no sentinel.repair.rebootCommand" in refused.stderr


def test_the_operators_repair_template_is_the_only_workflow_dsx_remediates_account_may_create() -> None:
    docs = _render(
        CHART,
        "remediate.repairTemplate.name=site-replace",
        "remediate.repairTemplate.actions={replace,contact-support}",
    )
    parameters = _remediate_parameters(docs)
    assert (parameters["repair-template"], parameters["repair-template-actions"]) == (
        "site-replace",
        "replace,contact-support",
    )
    assert ("gpu-ops", "argoproj.io", "workflows", "create") in _granted(docs, "dsx-remediate")
    policy = _policies(docs)["dsx-dsx-repair-workflows"]
    (matched,) = policy["spec"]["matchConditions"]
    assert (
        matched["expression"]
        == 'request.userInfo.username in ["system:serviceaccount:gpu-ops:dsx-remediate"]'
    )
    rules = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert "object.spec.workflowTemplateRef.name == 'site-replace'" in rules
    webhook = [g for g in _granted(docs, "dsx-repair") if g[2] != "workflowtaskresults"]
    assert webhook == [("gpu-ops", "", "configmaps", "get")]  # dsx-repair-webhook reads the request
    # the Sensor's and the reconciler's policy is unchanged
    remediate = _policies(docs)["dsx-dsx-remediate-workflows"]
    assert "'dsx-remediate'" in " ".join(v["expression"] for v in remediate["spec"]["validations"])


def test_remediations_guard_applies_the_lemon_rule_of_the_sentinels_overrides() -> None:
    def history_env(docs: list[dict[str, Any]]) -> str:
        (guard,) = [t for t in _spec(_workflows(docs)["dsx-remediate"])["templates"] if t["name"] == "guard"]
        return str(_env(guard["script"])["DSX_FAULT_HISTORY"])

    assert history_env(_render(CHART)) == ""
    lemon = {"lemon": {"count": 5, "withinDays": 14}}
    given = f"sentinel.overrides={json.dumps({'history': lemon})}"
    rendered = _run(
        [helm_binary(), "template", "dsx", str(CHART), "--namespace", "gpu-ops", "--set-json", given]
    )
    assert rendered.returncode == 0, rendered.stderr
    assert json.loads(history_env(_docs(rendered.stdout))) == lemon


def test_the_reconciler_reads_the_sentinels_overrides_and_may_write_what_its_not_ready_check_writes() -> None:
    def overrides_env(docs: list[dict[str, Any]]) -> str:
        (step,) = [t for t in _spec(_workflows(docs)["dsx-reconcile"])["templates"] if "script" in t]
        return str(_env(step["script"])["DSX_FAULT_OVERRIDES"])

    def remediates(docs: list[dict[str, Any]]) -> str:
        cron = _workflows(docs)["dsx-reconcile"]
        assert "suspend" not in cron["spec"]  # the not-ready check runs with or without the Sensor
        return next(p["value"] for p in _spec(cron)["arguments"]["parameters"] if p["name"] == "remediate")

    docs = _render(CHART)
    assert overrides_env(docs) == ""
    assert remediates(docs) == "false"  # no Sensor: remediation is a person's to start
    with_sensor = _run(
        [
            helm_binary(),
            "template",
            "dsx",
            str(CHART),
            "--namespace",
            "gpu-ops",
            "--set",
            "events.enabled=true",
        ]
    )
    assert with_sensor.returncode == 0, with_sensor.stderr
    assert remediates(_docs(with_sensor.stdout)) == "true"
    granted = set(_granted(docs, "dsx-reconcile"))
    assert {
        ("*", "", "nodes", "patch"),
        ("*", "", "nodes/status", "patch"),
        ("default", "", "events", "create"),
    } <= granted
    changes = {"entries": [{"check": "not-ready", "code": "ready-unknown", "threshold": 600}]}
    given = f"sentinel.overrides={json.dumps(changes)}"
    rendered = _run(
        [helm_binary(), "template", "dsx", str(CHART), "--namespace", "gpu-ops", "--set-json", given]
    )
    assert rendered.returncode == 0, rendered.stderr
    assert json.loads(overrides_env(_docs(rendered.stdout))) == changes

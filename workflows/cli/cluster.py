"""``dsx cluster``: the operator's levers on nodes (list, cordon, uncordon, taint), through the same
cluster port the workflows use, against a real cluster or a simulated fleet."""

from __future__ import annotations

import os
from typing import get_args

import typer

from steps.cluster import ClusterPort, connect
from steps.cluster import vocabulary as vocab
from steps.cluster.node import CordonResult, Node, TaintEffect
from steps.errors import InputError
from workflows.cli.output import OUTPUT_OPTION, OutputFormat, console, emit, print_table

CLUSTER_OPTION = typer.Option(
    None,
    "--cluster",
    help="kube (kubeconfig or in-cluster), sim:KEY=VALUE,... (a simulated fleet), a fleet .yaml file, "
    "or state:PATH (a persisted fleet). Default: $DSX_CLUSTER, else kube.",
)
KUBECONFIG_OPTION = typer.Option(
    None, "--kubeconfig", help="Kubeconfig file (default $KUBECONFIG, ~/.kube/config)."
)
CONTEXT_OPTION = typer.Option(None, "--context", help="Kubeconfig context (default the current one).")
DEFAULT_TAINT = "dsx.dev/unhealthy:NoSchedule"
BY_OPTION = typer.Option(
    os.environ.get("USER") or "operator",
    "--by",
    help="The owner of the cordon, recorded on the node (default $USER): uncordon releases only its own.",
)


def _port(cluster: str | None, kubeconfig: str | None, context: str | None) -> ClusterPort:
    return connect(cluster, kubeconfig, context)


def _nodes_table(nodes: list[Node]) -> None:
    rows = []
    for node in nodes:
        gpu = f"{node.gpu_count}x {node.gpu_product.removeprefix('NVIDIA-')}" if node.gpu_product else "-"
        rows.append(
            [
                node.name,
                "Ready" if node.ready else "NotReady",
                _cordon_cell(node),
                gpu,
                node.labels.get(vocab.LABEL_RACK, "-"),
                node.labels.get(vocab.LABEL_CERTIFICATION, "-"),
                node.labels.get(vocab.LABEL_STATE, "-") if node.managed else "unmanaged",
                ", ".join(str(t) for t in node.taints) or "-",
            ]
        )
    print_table(None, ["node", "ready", "cordoned", "gpus", "rack", "certified", "state", "taints"], rows)


def _cordon_cell(node: Node) -> str:
    """``no``, the dsx owner of the cordon, or ``outside dsx`` for one made with kubectl or another tool."""
    cordon = node.cordon
    if cordon is None:
        return "no"
    return cordon.owner or "outside dsx"


def _cordon_result(result: CordonResult) -> None:
    """The line saying whose cordon it was and what became of it, then the node."""

    console().print(result.summary, markup=False, highlight=False, soft_wrap=True)
    _nodes_table([result.node])


def _parse_taint(text: str) -> tuple[str, str, TaintEffect, bool]:
    """``key[=value]:Effect`` with an optional trailing ``-`` (remove): ``(key, value, effect, remove)``."""
    remove = text.endswith("-")
    body = text[:-1] if remove else text
    key_value, sep, written = body.rpartition(":")
    if not sep:
        key_value, written = body, "NoSchedule"
    effects: tuple[TaintEffect, ...] = get_args(TaintEffect)
    effect = next((e for e in effects if e == written), None)
    if effect is None:
        raise InputError(f"taint {text!r}: the effect must be NoSchedule, PreferNoSchedule or NoExecute")
    key, _, value = key_value.partition("=")
    if not key:
        raise InputError(f"taint {text!r}: expected KEY[=VALUE]:EFFECT")
    return key, value, effect, remove


_NODE = typer.Argument(..., help="Node name.")


def nodes_cmd(
    selector: str | None = typer.Option(
        None, "--selector", "-l", help="Label selector, e.g. topology.dsx.dev/rack=rack-01."
    ),
    cluster: str | None = CLUSTER_OPTION,
    kubeconfig: str | None = KUBECONFIG_OPTION,
    context: str | None = CONTEXT_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """List nodes with their GPUs, rack, certification, state and taints."""
    found = _port(cluster, kubeconfig, context).list_nodes(selector)
    emit(found, output, _nodes_table)


def cordon_cmd(
    node: str = _NODE,
    reason: str = typer.Option("cordoned by hand", "--reason", help="Why, recorded on the node."),
    by: str = BY_OPTION,
    force: bool = typer.Option(
        False, "--force", help="Take over a cordon another owner made (the output says whose)."
    ),
    cluster: str | None = CLUSTER_OPTION,
    kubeconfig: str | None = KUBECONFIG_OPTION,
    context: str | None = CONTEXT_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Cordon a node for an owner (--by), recording who, why, when, and whether it was cordoned
    before. A node another owner cordoned is refused (exit 2) unless --force."""
    result = _port(cluster, kubeconfig, context).cordon(node, reason, by=by, force=force)
    emit(result, output, _cordon_result)


def uncordon_cmd(
    node: str = _NODE,
    by: str = BY_OPTION,
    force: bool = typer.Option(
        False,
        "--force",
        help="Release a cordon that is not this owner's: another owner's, or one made outside dsx.",
    ),
    cluster: str | None = CLUSTER_OPTION,
    kubeconfig: str | None = KUBECONFIG_OPTION,
    context: str | None = CONTEXT_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Release an owner's (--by) cordon and clear dsx's cordon annotations. Someone else's cordon
    (another owner's, kubectl's, or one there before dsx) is refused (exit 2) unless --force."""
    result = _port(cluster, kubeconfig, context).uncordon(node, by=by, force=force)
    emit(result, output, _cordon_result)


def taint_cmd(
    node: str = _NODE,
    taint: str = typer.Argument(
        DEFAULT_TAINT, help="KEY[=VALUE]:EFFECT; a trailing '-' removes it (as kubectl taint)."
    ),
    remove: bool = typer.Option(False, "--remove", help="Remove the taint instead of adding it."),
    cluster: str | None = CLUSTER_OPTION,
    kubeconfig: str | None = KUBECONFIG_OPTION,
    context: str | None = CONTEXT_OPTION,
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """Add a taint to a node (default dsx.dev/unhealthy:NoSchedule), or remove it."""
    key, value, effect, trailing_dash = _parse_taint(taint)
    port = _port(cluster, kubeconfig, context)
    if remove or trailing_dash:
        result = port.remove_taint(node, key, effect)
    else:
        result = port.add_taint(node, key, value, effect)
    emit(result, output, lambda n: _nodes_table([n]))


def register(app: typer.Typer) -> None:
    """Add the ``cluster`` command group."""
    group = typer.Typer(
        name="cluster",
        help="List nodes and cordon, uncordon or taint them, on a real cluster or a simulated fleet.",
        no_args_is_help=True,
    )
    group.command("nodes")(nodes_cmd)
    group.command("cordon")(cordon_cmd)
    group.command("uncordon")(uncordon_cmd)
    group.command("taint")(taint_cmd)
    app.add_typer(group, name="cluster")

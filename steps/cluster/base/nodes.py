"""The port's node calls: list and read nodes, cordons with owners, taints, labels, annotations and
conditions, each one read-modify-write with the node's ``resourceVersion``."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from steps.cluster import changes
from steps.cluster import vocabulary as vocab
from steps.cluster.base.core import NODES, PortCore, logged
from steps.cluster.node import CordonResult, Node, TaintEffect
from steps.cluster.selectors import parse_selector
from steps.errors import InputError

__all__ = ["NodeCalls"]

_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _check_labels(call: str, node: str, labels: Mapping[str, str | None], values: bool) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if not _LABEL_NAME.match(name) or (prefix and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix))):
            raise InputError(f"{call} node/{node}: {key!r} is not a valid label or annotation key")
        if values and value is not None and (len(value) > 63 or not _LABEL_VALUE.match(value)):
            raise InputError(f"{call} node/{node}: label {key}={value!r} is not a valid label value")


def _cordon_summary(call: str, result: CordonResult, by: str) -> str:
    """One line naming whose cordon the node carried and what became of it."""
    name, previous = result.node.name, result.previous
    reason = result.node.annotations.get(vocab.ANNOTATION_CORDON_REASON, "")
    if call == "uncordon":
        if previous is None:
            stale = "; a stale dsx cordon record was cleared" if result.changed else ""
            return f"{name} was not cordoned{stale}"
        return f"{name} uncordoned: released {previous.describe()}" + (" (forced)" if result.forced else "")
    if previous is None:
        return f"{name} cordoned by {by}: {reason}"
    if result.forced:
        return f"{name} cordoned by {by}: {reason}; took over {previous.describe()}"
    if previous.owner == by:
        return f"{name} was already cordoned by {by}" + (f"; new reason: {reason}" if result.changed else "")
    outside = previous.model_copy(update={"recorded_by": "", "reason": ""}).describe()
    return (
        f"{name} was already cordoned: {outside}; {by}'s reason is recorded with it ({reason}), "
        "and dsx will not uncordon it"
    )


class NodeCalls(PortCore):
    """The node calls of :class:`~steps.cluster.port.ClusterPort`, written once for every adapter."""

    @logged
    def list_nodes(self, selector: str | None = None) -> list[Node]:
        """Nodes matching a label selector, sorted by name."""
        parse_selector(selector)
        target = f"nodes -l {selector}" if selector else "nodes"
        items = self._run("list_nodes", target, True, lambda: self._list(NODES, None, selector, None))
        return sorted((Node.from_manifest(i) for i in items), key=lambda n: n.name)

    @logged
    def get_node(self, name: str) -> Node:
        """One node."""
        return self._read_node("get_node", name)

    def _change_cordon(
        self, call: str, node: str, by: str, force: bool, plan: Callable[[Node], dict[str, Any] | None]
    ) -> CordonResult:
        """Run a cordon or uncordon plan in one read-modify-write; say what it found and did."""
        if not by or by != by.strip() or not by.isprintable() or len(by) > 253:
            raise InputError(f"{call} node/{node}: the owner (by) must be a name on one line, not {by!r}")
        seen: list[Node] = []

        def compute(n: Node) -> dict[str, Any] | None:
            seen.append(n)
            return plan(n)

        after = self._change_node(call, node, compute)
        before = seen[-1]  # the read the write was based on
        previous = before.cordon
        if previous is None:
            forced = False
        elif call == "uncordon":
            forced = force and previous.owner != by
        else:
            forced = force and previous.holder not in ("", by)
        result = CordonResult(node=after, previous=previous, changed=after is not before, forced=forced)
        return result.model_copy(update={"summary": _cordon_summary(call, result, by)})

    @logged
    def cordon(self, node: str, reason: str, by: str = "dsx", force: bool = False) -> CordonResult:
        """Cordon the node for ``by``; another owner's cordon is refused unless ``force`` takes it over."""
        now = self._clock()
        return self._change_cordon(
            "cordon", node, by, force, lambda n: changes.cordon_patch(n, reason, by, force, now)
        )

    @logged
    def uncordon(self, node: str, by: str = "dsx", force: bool = False) -> CordonResult:
        """Release ``by``'s cordon; anyone else's (or one made outside dsx) is refused unless ``force``."""
        return self._change_cordon(
            "uncordon", node, by, force, lambda n: changes.uncordon_patch(n, by, force)
        )

    @logged
    def add_taint(
        self, node: str, key: str = vocab.TAINT_UNHEALTHY, value: str = "", effect: TaintEffect = "NoSchedule"
    ) -> Node:
        """Add a taint (replacing one with the same key and effect)."""
        _check_labels("add_taint", node, {key: value}, values=True)

        def compute(n: Node) -> dict[str, Any] | None:
            taints = changes.taints_with(n, key, value, effect)
            return None if taints is None else {"spec": {"taints": [t.to_manifest() for t in taints]}}

        return self._change_node("add_taint", node, compute)

    @logged
    def remove_taint(
        self, node: str, key: str = vocab.TAINT_UNHEALTHY, effect: TaintEffect | None = None
    ) -> Node:
        """Remove the taints with this key (and effect)."""

        def compute(n: Node) -> dict[str, Any] | None:
            taints = changes.taints_without(n, key, effect)
            if taints is None:
                return None
            return {"spec": {"taints": [t.to_manifest() for t in taints] or None}}

        return self._change_node("remove_taint", node, compute)

    def _set_metadata(
        self,
        call: str,
        node: str,
        labels: Mapping[str, str | None] | None,
        annotations: Mapping[str, str | None] | None,
    ) -> Node:
        """Labels and annotations in one patch carrying the node's ``resourceVersion``; nothing is written
        when the node already says all of it."""
        wanted_labels, wanted_annotations = dict(labels or {}), dict(annotations or {})
        _check_labels(call, node, wanted_labels, values=True)
        _check_labels(call, node, wanted_annotations, values=False)

        def compute(n: Node) -> dict[str, Any] | None:
            metadata: dict[str, Any] = {}
            if changed := changes.metadata_map_patch(n.labels, wanted_labels):
                metadata["labels"] = changed
            if changed := changes.metadata_map_patch(n.annotations, wanted_annotations):
                metadata["annotations"] = changed
            return {"metadata": metadata} if metadata else None

        return self._change_node(call, node, compute)

    @logged
    def set_node_metadata(
        self,
        node: str,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> Node:
        """Merge labels and annotations into the node in one patch (``None`` removes a key).

        One write, with the node's ``resourceVersion`` (re-read and retried on a conflict): a reader
        sees the labels and the annotations change together, never one without the other.
        """
        return self._set_metadata("set_node_metadata", node, labels, annotations)

    @logged
    def set_labels(self, node: str, labels: Mapping[str, str | None]) -> Node:
        """Merge labels into the node (``None`` removes one); :meth:`set_node_metadata` with labels only."""
        return self._set_metadata("set_labels", node, labels, None)

    @logged
    def set_annotations(self, node: str, annotations: Mapping[str, str | None]) -> Node:
        """Merge annotations into the node (``None`` removes one); :meth:`set_node_metadata` with
        annotations only."""
        return self._set_metadata("set_annotations", node, None, annotations)

    @logged
    def set_condition(self, node: str, type_: str, status: bool, reason: str, message: str) -> Node:
        """Set a node condition through the status subresource."""
        if not re.match(r"^[A-Za-z][A-Za-z0-9]*$", type_) or (
            reason and not re.match(r"^[A-Za-z0-9]+$", reason)
        ):
            raise InputError(f"set_condition node/{node}: condition type and reason must be CamelCase words")

        def compute(n: Node) -> dict[str, Any] | None:
            condition = changes.condition_after(n, type_, status, reason, message, self._clock())
            return None if condition is None else {"status": {"conditions": [condition.to_manifest()]}}

        return self._change_node("set_condition", node, compute, status=True)

"""The port's behaviour written once, on top of a few raw calls each adapter provides.

An adapter subclasses :class:`PortBase` and implements the primitives of :class:`~.core.PortCore`
(``_get``, ``_list``, ``_create``, ``_replace``, ``_patch``, ``_delete``, ``_evict``, ``_delete_pod``):
one request each. Everything else lives here, so the adapters cannot drift apart, in one module per
kind of call:

- :mod:`.core`: the primitives, retries with backoff, errors naming the call and the target, the
  read-modify-write of a node with its ``resourceVersion``;
- :mod:`.nodes`: nodes, cordons with owners, taints, labels and annotations, conditions;
- :mod:`.pods`: pods on a node, evictions and deletions pinned to a uid, Events about nodes;
- :mod:`.state`: state ConfigMaps and Lease locks;
- :mod:`.objects`: any object by apiVersion and kind.
"""

from __future__ import annotations

from steps.cluster.base.core import CONFIGMAPS, EVENTS, LEASES, NODES, PODS, PortCore, logged
from steps.cluster.base.nodes import NodeCalls
from steps.cluster.base.objects import ObjectCalls
from steps.cluster.base.pods import PodCalls
from steps.cluster.base.state import StateCalls, lease_name

__all__ = ["CONFIGMAPS", "EVENTS", "LEASES", "NODES", "PODS", "PortBase", "PortCore", "lease_name", "logged"]


class PortBase(NodeCalls, PodCalls, StateCalls, ObjectCalls):
    """Shared implementation of :class:`~steps.cluster.port.ClusterPort`: every call of the port, built with
    :class:`~.core.PortCore`'s arguments (namespace, retry, clock, field manager)."""

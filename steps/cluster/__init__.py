"""The one door to Kubernetes: a small port and its adapters (kubernetes client; simulated fleet).

Steps call :func:`connect` and use the :class:`ClusterPort` it returns; they never import the
kubernetes client. The node vocabulary lives in :mod:`steps.cluster.vocabulary`; what a node's GPUs and
NICs report comes through the health seam, :mod:`steps.cluster.health`. The simulated fleet
(:mod:`steps.cluster.sim`) is imported only when a ``sim:`` or ``state:`` spec asks for it.
"""

from steps.cluster.connect import connect, load_fleet, port_modules, shareable
from steps.cluster.errors import (
    ApiUnavailableError,
    ClusterConfigError,
    ClusterError,
    ConflictError,
    CordonRefusedError,
    ForbiddenError,
    NotFoundError,
)
from steps.cluster.health import GpuReport, NodeHealthSource, NodeReport, health_source
from steps.cluster.port import (
    ClusterPort,
    Condition,
    Cordon,
    CordonResult,
    EvictionResult,
    Node,
    NodeInfo,
    Pod,
    PodRef,
    Taint,
)
from steps.cluster.retry import RetryPolicy

__all__ = [
    "ApiUnavailableError",
    "ClusterConfigError",
    "ClusterError",
    "ClusterPort",
    "Condition",
    "ConflictError",
    "Cordon",
    "CordonRefusedError",
    "CordonResult",
    "EvictionResult",
    "ForbiddenError",
    "GpuReport",
    "Node",
    "NodeHealthSource",
    "NodeInfo",
    "NodeReport",
    "NotFoundError",
    "Pod",
    "PodRef",
    "RetryPolicy",
    "Taint",
    "connect",
    "health_source",
    "load_fleet",
    "port_modules",
    "shareable",
]

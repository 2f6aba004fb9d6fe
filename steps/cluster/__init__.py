"""The one door to Kubernetes: a small port and its adapters (kubernetes client; simulated fleet).

Steps call :func:`connect` and use the :class:`ClusterPort` it returns; they never import the
kubernetes client. The node vocabulary lives in :mod:`steps.cluster.vocabulary`.
"""

from steps.cluster.connect import connect, load_fleet, shareable
from steps.cluster.errors import (
    ApiUnavailableError,
    ClusterConfigError,
    ClusterError,
    ConflictError,
    CordonRefusedError,
    ForbiddenError,
    NotFoundError,
)
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
    "Node",
    "NodeInfo",
    "NotFoundError",
    "Pod",
    "PodRef",
    "RetryPolicy",
    "Taint",
    "connect",
    "load_fleet",
    "shareable",
]

"""Errors of the cluster port: each names the call and the node (or object) it was about, on one line."""

from __future__ import annotations

__all__ = [
    "ApiStatusError",
    "ApiUnavailableError",
    "ClusterConfigError",
    "ClusterError",
    "ConflictError",
    "CordonRefusedError",
    "ForbiddenError",
    "NotFoundError",
    "classify",
]

from typing import TYPE_CHECKING

from steps.errors import DsxError, InputError

if TYPE_CHECKING:
    from steps.cluster.node import Cordon


class ClusterError(DsxError):
    """A Kubernetes call failed; the message names the call and what it was about.

    Attributes:
        call: the port method that failed, e.g. ``cordon``.
        target: what the call was about, e.g. ``node/node-07`` or ``configmaps dsx/state`` (may be empty).
        status: the HTTP status of the last answer, 0 when there was none.
        detail: the reason in the API's words.
    """

    def __init__(self, call: str, target: str, detail: str, status: int = 0) -> None:
        self.call = call
        self.target = target
        self.status = status
        self.detail = " ".join(detail.split())
        where = f"{call} {target}" if target else call
        super().__init__(f"{where}: {self.detail}")


class NotFoundError(ClusterError):
    """The node or object does not exist (HTTP 404)."""


class ForbiddenError(ClusterError):
    """RBAC refused the call (HTTP 403, or 401 for bad credentials)."""


class ConflictError(ClusterError):
    """The object changed since it was read, or already exists (HTTP 409), and retries ran out."""


class ApiUnavailableError(ClusterError):
    """The API server could not be reached, timed out or kept failing (5xx, 429) after retries."""


class CordonRefusedError(DsxError):
    """A cordon or uncordon that would take over a cordon the caller does not own (the CLI exits 2).

    Attributes:
        call: ``cordon`` or ``uncordon``.
        target: ``node/NAME``.
        cordon: the :class:`~steps.cluster.node.Cordon` the node carries.
        resource_version: the node's ``resourceVersion`` when the refusal was decided.
    """

    def __init__(self, call: str, target: str, detail: str, cordon: Cordon, resource_version: str) -> None:
        self.call = call
        self.target = target
        self.cordon = cordon
        self.resource_version = resource_version
        self.detail = " ".join(detail.split())
        super().__init__(f"{call} {target}: refused: {self.detail}")


class ClusterConfigError(InputError):
    """No usable cluster configuration: a missing kubeconfig, an unknown context, a bad ``--cluster``."""


class ApiStatusError(Exception):
    """An adapter's raw answer that is not a success and not worth retrying (401, 403, 404, 409, 422...).

    The shared port code turns it into the :class:`ClusterError` subclass for its status, naming the
    call and the node.
    """

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def classify(call: str, target: str, status: int, detail: str) -> ClusterError:
    """The :class:`ClusterError` for an HTTP status, its message naming the call and target."""
    if status == 0:  # no HTTP answer at all, e.g. a TLS handshake that failed
        return ApiUnavailableError(call, target, detail, status)
    if status in (401, 403):
        word = "unauthorized" if status == 401 else "forbidden"
        return ForbiddenError(call, target, f"{word} ({status}): {detail}", status)
    if status == 404:
        return NotFoundError(call, target, f"not found (404): {detail}", status)
    if status == 409:
        return ConflictError(call, target, f"conflict (409): {detail}", status)
    return ClusterError(call, target, f"rejected ({status}): {detail}", status)

"""The kubernetes-client adapter: the port against a real API server.

Requests go through the client's ``ApiClient`` (its configuration, TLS and credentials from a
kubeconfig or the pod's service account) as raw JSON, so every kind, subresource and patch type is
reached the same way. The client's own urllib3 retries are switched off: :class:`PortBase` decides
what may be retried.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from steps.cluster import vocabulary as vocab
from steps.cluster.base import PODS, PortBase
from steps.cluster.errors import ApiStatusError, ClusterConfigError
from steps.cluster.port import Propagation
from steps.cluster.resources import Resource
from steps.cluster.retry import RetryPolicy, TransientError

__all__ = ["KubeCluster", "load_api_client"]

_SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_RETRYABLE = (429, 500, 502, 503, 504)


def _kubeconfig_files(kubeconfig: str | None) -> list[Path] | None:
    """The kubeconfig files to read, in kubectl's order; ``None`` when there are none to read.

    ``--kubeconfig`` names one file, read alone. Otherwise ``$KUBECONFIG`` is a list of paths
    (``os.pathsep``-separated) whose files are merged, those that do not exist skipped, as kubectl does;
    without it, ``~/.kube/config`` if it exists.

    Raises:
        ClusterConfigError: the file ``--kubeconfig`` names, or every file ``$KUBECONFIG`` lists, is
            missing.
    """
    hint = "(pass --kubeconfig, set KUBECONFIG, or use --cluster sim:... for a simulated fleet)"
    if kubeconfig:
        path = Path(kubeconfig).expanduser()
        if not path.exists():
            raise ClusterConfigError(f"connect: kubeconfig {path} does not exist {hint}")
        return [path]
    listed = [Path(p).expanduser() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        found = [p for p in listed if p.exists()]
        if not found:
            names = ", ".join(str(p) for p in listed)
            raise ClusterConfigError(f"connect: kubeconfig {names} does not exist {hint}")
        return found
    default_path = Path("~/.kube/config").expanduser()
    return [default_path] if default_path.exists() else None


def _first_current_context(paths: list[Path]) -> str | None:
    """The current context of merged kubeconfigs: the first file that names one wins, as in kubectl.

    (The kubernetes client's merge lets the last one win, so the context is named to it explicitly.)
    """
    from steps.errors import InputError
    from steps.yamlio import load_yaml

    for path in paths:
        try:
            data = load_yaml(path, str(path))
        except InputError as exc:
            raise ClusterConfigError(f"connect: kubeconfig {exc}") from None
        current = data.get("current-context") if isinstance(data, dict) else None
        if isinstance(current, str) and current:
            return current
    return None


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> tuple[Any, str | None]:
    """A configured ``kubernetes.client.ApiClient``, and the pod's namespace when running in a cluster.

    With no ``kubeconfig`` it uses the files ``$KUBECONFIG`` lists (merged as kubectl merges them) or
    ``~/.kube/config`` when present, else the in-cluster service account (whose namespace is returned;
    ``None`` otherwise).

    Raises:
        ClusterConfigError: the kubeconfig is missing or unreadable, or the context is unknown.
    """
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    namespace: str | None = None
    paths = _kubeconfig_files(kubeconfig)
    if paths is None and (_SERVICE_ACCOUNT / "token").exists():
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException as exc:
            raise ClusterConfigError(f"connect: in-cluster configuration is unusable: {exc}") from None
        ns_file = _SERVICE_ACCOUNT / "namespace"
        namespace = ns_file.read_text().strip() if ns_file.exists() else None
    else:
        if paths is None:
            raise ClusterConfigError(
                f"connect: kubeconfig {Path('~/.kube/config').expanduser()} does not exist (pass "
                "--kubeconfig, set KUBECONFIG, or use --cluster sim:... for a simulated fleet)"
            )
        shown = os.pathsep.join(str(p) for p in paths)
        if context is None and len(paths) > 1:
            context = _first_current_context(paths)
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=shown,  # the client merges a path list: first file wins for each name
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        except ConfigException as exc:
            where = f" context {context!r}" if context else ""
            raise ClusterConfigError(f"connect: kubeconfig {shown}{where}: {_one_line(exc)}") from None
        except Exception as exc:  # a file that is not YAML, or YAML that is not a kubeconfig
            raise ClusterConfigError(
                f"connect: kubeconfig {shown} cannot be read: {_one_line(exc)}"
            ) from None
    if not str(configuration.host).startswith(("https://", "http://")):
        raise ClusterConfigError(
            f"connect: the kubeconfig's server {configuration.host!r} is not an http:// or https:// URL"
        )
    configuration.retries = False
    return client.ApiClient(configuration), namespace


class KubeCluster(PortBase):
    """The port over the kubernetes client.

    Args:
        api_client: a configured ``kubernetes.client.ApiClient`` (see :func:`load_api_client`).
        namespace: where dsx keeps its ConfigMaps and Leases (Events about nodes go to ``default``).
        retry: backoff for transient failures.
        timeout: ``(connect, read)`` seconds for each request.
        clock: the current time.
        field_manager: named on every write (``?fieldManager=``), so ``managedFields`` tells dsx's
            writes from anyone else's.
    """

    def __init__(
        self,
        api_client: Any,
        namespace: str = "dsx",
        retry: RetryPolicy | None = None,
        timeout: tuple[float, float] = (5.0, 30.0),
        clock: Callable[[], dt.datetime] | None = None,
        field_manager: str = vocab.FIELD_MANAGER,
    ) -> None:
        super().__init__(namespace=namespace, retry=retry, clock=clock, field_manager=field_manager)
        self._api = api_client
        self._api.configuration.retries = False
        self._timeout = timeout

    @property
    def endpoint(self) -> str:
        """The API server URL."""
        return str(self._api.configuration.host)

    @property
    def runs_pods(self) -> bool:
        """Yes: checks run as Jobs the cluster's kubelets start."""
        return True

    # ----------------------------------------------------------------- one request

    def _request(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """Send one request; ``(status, parsed body)`` for any HTTP answer, ``TransientError`` for none."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        if query:
            path = f"{path}?{urlencode(sorted(query.items()))}"
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            _, url, headers, body, _ = self._api.param_serialize(
                method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
            )
            response = self._api.call_api(
                method, url, header_params=headers, body=body, _request_timeout=self._timeout
            )
            raw = response.read()
        except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError) as exc:
            raise TransientError(
                0, f"cannot reach the Kubernetes API at {self.endpoint}: {_reason(exc)}", sent=False
            ) from None
        except (urllib3.exceptions.TimeoutError, urllib3.exceptions.ProtocolError) as exc:
            raise TransientError(
                0, f"no answer from the Kubernetes API at {self.endpoint}: {_reason(exc)}", sent=True
            ) from None
        except urllib3.exceptions.HTTPError as exc:
            raise TransientError(
                0, f"cannot reach the Kubernetes API at {self.endpoint}: {_reason(exc)}", sent=False
            ) from None
        except ApiException as exc:  # TLS failures surface as status 0
            detail = (
                f"cannot talk to the Kubernetes API at {self.endpoint}: {_one_line(Exception(exc.reason))}"
            )
            raise ApiStatusError(exc.status or 0, detail) from None
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw.decode("utf-8", "replace")[:200]}
        return int(response.status), data

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        missing_ok: bool = False,
    ) -> Any:
        """One request; the body on success, ``None`` on 404 when ``missing_ok``, else the right error."""
        status, data = self._request(method, path, query, body, content_type)
        if 200 <= status < 300:
            return data
        if status == 404 and missing_ok:
            return None
        message = _message(data, status)
        raise _status_error(status, message, data)

    # ----------------------------------------------------------------- primitives

    def _get(self, res: Resource, name: str, namespace: str | None) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self._send("GET", res.object_path(name, namespace), missing_ok=True)
        return result

    def _list(
        self, res: Resource, namespace: str | None, label_selector: str | None, field_selector: str | None
    ) -> list[dict[str, Any]]:
        query = {}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        data = self._send("GET", res.collection_path(namespace), query)
        return list(data.get("items") or [])

    def _create(self, res: Resource, namespace: str | None, manifest: Mapping[str, Any]) -> dict[str, Any]:
        path, query = res.collection_path(namespace), {"fieldManager": self.field_manager}
        result: dict[str, Any] = self._send("POST", path, query, body=dict(manifest))
        return result

    def _replace(
        self, res: Resource, name: str, namespace: str | None, manifest: Mapping[str, Any]
    ) -> dict[str, Any]:
        path, query = res.object_path(name, namespace), {"fieldManager": self.field_manager}
        result: dict[str, Any] = self._send("PUT", path, query, body=dict(manifest))
        return result

    def _patch(
        self,
        res: Resource,
        name: str,
        namespace: str | None,
        patch: Mapping[str, Any],
        strategic: bool = False,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        kind = "application/strategic-merge-patch+json" if strategic else "application/merge-patch+json"
        result: dict[str, Any] = self._send(
            "PATCH",
            res.object_path(name, namespace, subresource),
            {"fieldManager": self.field_manager},
            body=dict(patch),
            content_type=kind,
        )
        return result

    def _delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None,
        grace_seconds: int | None,
        propagation: Propagation | None = None,
    ) -> bool:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if propagation is not None:
            body["propagationPolicy"] = propagation
        return self._send("DELETE", res.object_path(name, namespace), body=body, missing_ok=True) is not None

    def _delete_pod(self, namespace: str, name: str, grace_seconds: int | None, uid: str | None) -> bool:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", **_delete_options(grace_seconds, uid)}
        path = PODS.object_path(name, namespace)
        return self._send("DELETE", path, body=body, missing_ok=True) is not None

    def _evict(
        self, namespace: str, name: str, grace_seconds: int | None, uid: str | None
    ) -> tuple[int, str]:
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        options = _delete_options(grace_seconds, uid)
        if options:
            body["deleteOptions"] = options
        status, data = self._request("POST", PODS.object_path(name, namespace, "eviction"), body=body)
        message = _message(data, status) if status >= 300 else ""
        if 200 <= status < 300 or status == 404:
            return status, message
        if status == 429 and _disruption_budget(data):
            return status, message
        if status == 500 and "PodDisruptionBudget" in message:
            return status, message
        raise _status_error(status, message, data)


def _status_error(status: int, message: str, data: Any) -> TransientError | ApiStatusError:
    """The error for an answer that is not a success: transient for a status that may go away (429 was
    refused before the server acted, so it is safe to send again), else final."""
    if status in _RETRYABLE:
        return TransientError(
            status,
            f"the API answered {status}: {message}",
            sent=status != 429,
            retry_after=_retry_after(data),
        )
    return ApiStatusError(status, message)


def _delete_options(grace_seconds: int | None, uid: str | None) -> dict[str, Any]:
    """The fields of a DeleteOptions: the grace period, and the uid the object must still have (the API
    server answers 409 when the object of that name is another one)."""
    options: dict[str, Any] = {}
    if grace_seconds is not None:
        options["gracePeriodSeconds"] = grace_seconds
    if uid:
        options["preconditions"] = {"uid": uid}
    return options


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None) or exc
    text = str(reason)
    return text.split(": ", 1)[-1] if "Failed to establish" in text else text


def _message(data: Any, status: int) -> str:
    """The API's message from a Status body, with the first cause when it adds to it."""
    if not isinstance(data, Mapping):
        return f"HTTP {status}"
    message = str(data.get("message") or data.get("reason") or f"HTTP {status}")
    causes = (data.get("details") or {}).get("causes") or []
    extra = [
        str(c.get("message")) for c in causes if c.get("message") and str(c.get("message")) not in message
    ]
    return " ".join([message, *extra])


def _disruption_budget(data: Any) -> bool:
    causes = ((data or {}).get("details") or {}).get("causes") or [] if isinstance(data, Mapping) else []
    return any(c.get("reason") == "DisruptionBudget" for c in causes) or "disruption budget" in _message(
        data, 429
    )


def _retry_after(data: Any) -> float | None:
    if isinstance(data, Mapping):
        seconds = (data.get("details") or {}).get("retryAfterSeconds")
        if isinstance(seconds, int | float):
            return float(seconds)
    return None

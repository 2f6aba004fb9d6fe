"""``dsx-repair-webhook``: a repair request handed to a web service, an example repair template.

dsx-remediate creates a Workflow of the template named by ``repair-template`` with the request as
parameters; this one POSTs the whole request (the ConfigMap ``dsx-repair-<node>``'s ``request.yaml``, kind
``RepairRequest``: the action, the GPUs, the evidence) as JSON to a URL: a ticketing system, a cloud
provider's or a vendor's repair API, an in-cluster receiver. A ``2xx`` answer is success (the repair wait
then waits for the node to come back); any other answer, or none, fails the step and so the Workflow,
and dsx-remediate escalates the node saying so.
"""

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import yaml

from steps.cluster import connect
from steps.durations import parse_duration
from steps.errors import DsxError, InputError

__all__ = ["RepairHookError", "notify"]


class RepairHookError(DsxError):
    """The service did not take the request: its status and what it said, or why it could not be reached."""


def _request(name: str) -> dict[str, Any]:
    """The repair request of the ConfigMap ``name`` in dsx's namespace."""
    port = connect()
    found = port.get_object("v1", "ConfigMap", name, port.namespace)
    if found is None:
        raise InputError(f"parameter request: no ConfigMap {name} in namespace {port.namespace}")
    try:
        body = yaml.safe_load((found.get("data") or {}).get("request.yaml", ""))
    except yaml.YAMLError as exc:
        raise InputError(f"ConfigMap {name}: request.yaml is not YAML ({exc})") from None
    if not isinstance(body, dict) or body.get("kind") != "RepairRequest":
        raise InputError(f"ConfigMap {name}: request.yaml holds no RepairRequest")
    return body


def notify(url: str, request: str, node: str = "", workflow: str = "", timeout: str = "30s") -> str:
    """POST the repair request of the ConfigMap ``request`` (dsx-remediate's ``dsx-repair-<node>``) to
    ``url`` as JSON, with the header ``X-Dsx-Workflow`` naming this workflow; what the service answered.

    Raises:
        InputError: the URL is not http(s), ``timeout`` is not a duration, or the request is missing or
            malformed (the node it names must be ``node`` when given).
        RepairHookError: the service answered other than 2xx, or could not be reached in time.
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise InputError(f"parameter url: {url!r} is not an http(s) URL (the chart's remediate.webhook.url)")
    try:
        seconds = parse_duration(timeout)
    except ValueError as exc:
        raise InputError(f"parameter timeout: {exc}") from None
    body = _request(request)
    if node and body.get("node") != node:
        raise InputError(f"ConfigMap {request}: the request is for {body.get('node')!r}, not {node!r}")
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "X-Dsx-Workflow": workflow, "User-Agent": "dsx"}
    post = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(post, timeout=seconds) as answer:
            said = answer.read(4096).decode(errors="replace").strip()
            status = answer.status
    except urllib.error.HTTPError as exc:
        said = exc.read(4096).decode(errors="replace").strip()
        raise RepairHookError(f"{url} answered {exc.code} {exc.reason}: {said or 'nothing'}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RepairHookError(f"{url} could not be reached: {reason}") from None
    action = body.get("action", "?")
    return f"{body.get('node')}: {action} request taken by {url} ({status}){': ' + said if said else ''}"

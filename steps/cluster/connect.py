"""Open the cluster a ``--cluster`` spec names, and hand a simulated fleet on to other processes.

Spec forms:

- ``kube`` (or nothing, with ``DSX_CLUSTER`` unset): a real cluster, through ``--kubeconfig`` and
  ``--context``, ``$KUBECONFIG``, ``~/.kube/config`` or, inside a pod, the service account.
- ``sim:KEY=VALUE,...``: a simulated fleet held in this process (see :mod:`steps.cluster.sim.spec`);
  ``sim:`` alone gives the default fleet, ``sim:PATH.yaml`` reads a fleet file, and
  ``sim:PATH.yaml,KEY=VALUE,...`` reads one and replaces some of its keys.
- ``PATH.yaml`` / ``PATH.yml``: a fleet file.
- ``state:PATH``: a simulated fleet persisted as JSON, shared by every process that opens it.

Environment: ``DSX_CLUSTER`` (the spec when none is given), ``DSX_NAMESPACE`` (where dsx keeps its
ConfigMaps and Leases; default the pod's namespace in a cluster, else ``dsx``; Events about nodes go to
``default``),
``DSX_RETRY_ATTEMPTS`` and ``DSX_RETRY_BASE_DELAY`` (see :class:`steps.cluster.retry.RetryPolicy`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ClusterConfigError
from steps.cluster.port import ClusterPort
from steps.cluster.retry import RetryPolicy

if TYPE_CHECKING:  # the simulator is imported only when a sim: or state: spec asks for it
    from steps.cluster.sim.model import Fleet

__all__ = ["connect", "load_fleet", "port_modules", "shareable"]

_KUBE = "kube"


def _resolve(spec: str | None) -> str:
    chosen = spec if spec is not None else os.environ.get(vocab.ENV_CLUSTER, "")
    return chosen.strip() or _KUBE


def _state_path(spec: str) -> Path:
    """The file a ``state:PATH`` spec names.

    Raises:
        ClusterConfigError: no path given, or the path is a folder or no regular file.
    """
    text = spec.removeprefix("state:").strip()
    if not text:
        raise ClusterConfigError(f"--cluster {spec!r}: state: needs the path of a fleet state file")
    path = Path(text)
    if path.is_dir():
        raise ClusterConfigError(f"--cluster {spec!r}: {path} is a folder, not a fleet state file")
    if path.exists() and not path.is_file():  # a FIFO would block, /dev/zero would never end
        raise ClusterConfigError(f"--cluster {spec!r}: {path} is not a regular file (a pipe, a device...)")
    return path


def load_fleet(spec: str) -> Fleet:
    """Build the fleet a ``sim:`` spec or a fleet file names.

    Raises:
        InputError: a malformed spec or file.
        ClusterConfigError: the spec is not a simulated fleet.
    """
    from steps.cluster.sim.spec import build_fleet, load_spec_file, parse_short_spec

    body = spec.removeprefix("sim:")
    if spec.startswith("sim:") and "=" in body:
        return build_fleet(parse_short_spec(body), spec)
    if spec.startswith("sim:") and not body.strip():
        return build_fleet(parse_short_spec(""), "sim:")
    if body.endswith((".yaml", ".yml")):
        return build_fleet(load_spec_file(Path(body)), f"sim:{body}")
    raise ClusterConfigError(
        f"--cluster {spec!r}: expected sim:KEY=VALUE,..., a fleet .yaml file, state:PATH or kube"
    )


def connect(
    spec: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    namespace: str | None = None,
    retry: RetryPolicy | None = None,
) -> ClusterPort:
    """The port for a cluster spec (``DSX_CLUSTER`` when ``spec`` is ``None``).

    Raises:
        ClusterConfigError: a missing kubeconfig or fleet state, an unknown context, an unreadable spec.
        InputError: a malformed simulated-fleet spec or file.
    """
    chosen = _resolve(spec)
    retry = retry or RetryPolicy.from_env()
    ns = namespace or os.environ.get(vocab.ENV_NAMESPACE) or None
    if chosen == _KUBE:
        from steps.cluster.kube import KubeCluster, load_api_client

        api_client, pod_namespace = load_api_client(kubeconfig, context)
        return KubeCluster(api_client, namespace=ns or pod_namespace or "dsx", retry=retry)
    if kubeconfig or context:
        raise ClusterConfigError(f"--kubeconfig and --context apply to a real cluster, not to {chosen!r}")
    from steps.cluster.sim import FileStore, MemoryStore, SimCluster

    if chosen.startswith("state:"):
        return SimCluster(FileStore(_state_path(chosen)), namespace=ns or "dsx", retry=retry)
    return SimCluster(MemoryStore(load_fleet(chosen)), namespace=ns or "dsx", retry=retry)


def port_modules(spec: str | None = None) -> list[str]:
    """The modules :func:`connect` imports to open ``spec``'s port (``DSX_CLUSTER`` when ``None``).

    A fork server that imports them once spares every step it forks its own import: about 0.1 s of CPU
    for the simulator, as much for the Kubernetes client, in each step of a run.
    """
    if _resolve(spec) == _KUBE:
        return ["steps.cluster.kube", "kubernetes"]
    return ["steps.cluster.sim"]


def shareable(spec: str | None, folder: Path) -> str:
    """A spec every process of a run can open to reach the same cluster.

    A simulated fleet is built once and written to ``folder/fleet.json``; the result is
    ``state:`` that file. A real cluster (or a fleet that is already ``state:``) is returned unchanged.

    Raises:
        ClusterConfigError: a ``state:`` spec without a path, or naming a folder or a missing file.
        InputError: a malformed simulated-fleet spec or file.
    """
    chosen = _resolve(spec)
    if chosen.startswith("state:"):
        from steps.cluster.sim import FileStore

        FileStore(_state_path(chosen))  # a missing file or a folder is refused before any step runs
        return chosen
    if chosen == _KUBE:
        return chosen
    from steps.cluster.sim.store import write_fleet

    path = (folder / "fleet.json").resolve()
    write_fleet(load_fleet(chosen), path)
    return f"state:{path}"

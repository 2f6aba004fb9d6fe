"""The process kubelet where dsx leans on what a container runtime and cluster DNS do.

A rank pod's torchrun starts its ranks in sessions of their own, finds rank 0 by its headless Service
name, and c10d looks up the name of every peer it connects to. On a real node the container's PID
namespace ends the ranks with the pod, and cluster DNS answers every lookup at once; these tests hold the
process kubelet to both, on the real control plane.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from steps.cluster.kube import load_api_client
from tests.e2e.conftest import RealCluster
from tests.e2e.conftest import wait_until as _wait
from tests.processes import marked

pytestmark = pytest.mark.e2e

IMAGE = "ghcr.io/dsx-dev/dsx:0.1.0"

# Starts a child in a session of its own, as torchrun starts a rank, then waits to be stopped.
ESCAPER = """
import subprocess, sys, time
subprocess.Popen(["sleep", "3600"], start_new_session=True)
open("/dev/termination-log", "w").write("started")
time.sleep(3600)
"""

# What c10d asks of cluster DNS: a reverse lookup for every connection it logs (twenty here, the slowest
# timed), a peer by the short name torchrun is given, the peer's address back to its name, and its own name.
LOOKUP = """
import socket, time
slowest = 0.0
for _ in range(20):
    start = time.monotonic()
    try:
        socket.getnameinfo(("10.244.250.250", 80), socket.NI_NAMEREQD)
    except OSError:
        pass
    slowest = max(slowest, time.monotonic() - start)
peer = socket.gethostbyname("peer-0.peers")
back = socket.gethostbyaddr(peer)[0]
own = socket.gethostbyname(socket.gethostname())
open("/dev/termination-log", "w").write(f"{slowest:.3f} {peer} {back} {own}")
"""


def _pod(name: str, code: str, marker: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "nodeSelector": {"kubernetes.io/hostname": "node-00"},
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["python", "-c", code],
                    "env": [{"name": "DSX_TEST_MARK", "value": marker}],
                }
            ],
        },
    }


def _terminated(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    statuses = core.read_namespaced_pod(name, namespace).status.container_statuses or []
    return statuses[0].state.terminated if statuses else None


@pytest.fixture
def namespace(real_cluster: RealCluster) -> Any:
    if real_cluster.own is None:
        pytest.skip("reads this machine's processes: runs against the process kubelet only")
    api, _ = load_api_client(str(real_cluster.kubeconfig))
    core = client.CoreV1Api(api)
    name = f"kubelet-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    _wait(lambda: _account(core, name), 30, "the default service account")
    try:
        yield core, name
    finally:
        core.delete_namespace(name)


def _account(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespaced_service_account("default", namespace)
        return True
    except ApiException:
        return False


def test_a_deleted_pod_takes_every_process_it_started_whatever_session_they_joined(namespace: Any) -> None:
    core, ns = namespace
    marker = uuid.uuid4().hex
    core.create_namespaced_pod(ns, _pod("escaper", ESCAPER, marker))
    _wait(
        lambda: len(marked(f"DSX_TEST_MARK={marker}")) >= 2,
        90,
        "the pod's process and its child in its own session",
    )
    core.delete_namespaced_pod("escaper", ns)
    _wait(lambda: not marked(f"DSX_TEST_MARK={marker}"), 30, "every process of the deleted pod gone")


def test_cluster_dns_answers_a_pod_at_once_for_its_peers_and_itself(namespace: Any) -> None:
    """A closed port 53 refused at first, then the host's ICMP rate limit left every third or fourth
    lookup to the resolver's 5 s timeout; c10d's lookups stalled the ranks' connections."""
    core, ns = namespace
    service = {"metadata": {"name": "peers"}, "spec": {"clusterIP": "None", "selector": {"app": "peers"}}}
    core.create_namespaced_service(ns, service)
    peer = _pod("peer", "import time; time.sleep(3600)", uuid.uuid4().hex)
    peer["metadata"]["labels"] = {"app": "peers"}
    peer["spec"].update(hostname="peer-0", subdomain="peers")
    core.create_namespaced_pod(ns, peer)
    peer_ip = _wait(lambda: core.read_namespaced_pod("peer", ns).status.pod_ip, 90, "the peer's IP")
    core.create_namespaced_pod(ns, _pod("lookup", LOOKUP, uuid.uuid4().hex))
    ended = _wait(lambda: _terminated(core, ns, "lookup"), 120, "the lookup pod's end")
    assert ended.exit_code == 0, ended
    slowest, found, back, own = ended.message.split()
    assert float(slowest) < 1.0, f"the slowest of twenty reverse lookups took {slowest} s"
    assert (found, back) == (peer_ip, f"peer-0.peers.{ns}.svc.cluster.local")
    assert own == core.read_namespaced_pod("lookup", ns).status.pod_ip


def test_a_deleted_pods_ip_is_not_given_to_the_next_pod_at_once(namespace: Any) -> None:
    """Round-robin, as the CNI's host-local IPAM: the kernel tears a deleted pod's namespace down in the
    background, and an IP handed out again meanwhile would be answered for twice on the bridge."""
    core, ns = namespace
    ips = []
    for name in ("first", "second"):
        core.create_namespaced_pod(ns, _pod(name, "print('ok')", uuid.uuid4().hex))
        _wait(lambda n=name: _terminated(core, ns, n), 90, f"pod {name}'s end")
        ips.append(core.read_namespaced_pod(name, ns).status.pod_ip)
        core.delete_namespaced_pod(name, ns)
        _wait(lambda n=name: not _exists(core, ns, n), 60, f"pod {name} gone")
    assert ips[0] and ips[1] and ips[0] != ips[1], ips


def _exists(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise

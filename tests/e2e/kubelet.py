"""A process kubelet for the e2e tier: fake GPU nodes whose pods run as host processes.

    python -m tests.e2e.kubelet --dir DIR --kubeconfig FILE --bin DIR --bridge BR --gateway IP \\
        --apiserver-port PORT --ca FILE --nodes 4 --racks 2 [--gpus 8]

What it does, as the real kubelet does it (``pkg/kubelet``):

- **Nodes.** Registers ``node-00``... with capacity and allocatable ``nvidia.com/gpu`` (``--gpus``, 8 by
  default), the labels GPU Feature Discovery sets (``nvidia.com/gpu.present``, ``.product``, ``.count``,
  ``.memory``), a rack label (``topology.dsx.dev/rack``), ``status.nodeInfo`` with a boot id; renews each
  node's Lease in ``kube-node-lease`` every 10 s and posts its status every minute.
- **Pods.** Watches pods bound to its nodes. Each pod gets a network namespace of its own on the cluster's
  bridge (``hostNetwork`` pods stay in the host's), an IP, its names in cluster DNS (:class:`ClusterDns`,
  on the bridge's gateway: ``HOSTNAME.SUBDOMAIN.NAMESPACE.svc.cluster.local`` for pods behind a headless
  Service, and the IP's reverse name), and an ``/etc/hosts`` and ``/etc/resolv.conf`` of its own as the
  kubelet writes them (:meth:`PodWorker._hosts_file`, :meth:`PodWorker._resolv_conf`). Volumes: emptyDir,
  configMap, secret, downwardAPI, hostPath, and projected (service-account tokens through the
  TokenRequest API, ``kube-root-ca.crt``, the namespace). Each container runs in a mount namespace of its own
  (:mod:`tests.e2e.container`) and a PID namespace of its own, as a container runtime gives it: when its
  first process ends or is killed, the kernel ends every other (torchrun starts its ranks in sessions of
  their own, which a process-group kill misses; left alive they would hold the pod's IP once it is given
  to a new pod). A private ``/tmp``, the volume mounts with ``subPath`` and ``readOnly``,
  ``/dev/termination-log``, the pod's ``runAsUser``, ``runAsGroup``, ``fsGroup`` and supplemental groups.
  Environment: ``value``, ``fieldRef``, ``resourceFieldRef``, ``configMapKeyRef``, ``secretKeyRef``,
  ``envFrom``, the image's own variables and ``KUBERNETES_SERVICE_HOST``/``PORT``. Init containers run in
  order, then the rest at once; ``restartPolicy`` Never, OnFailure and Always; ``activeDeadlineSeconds``.
  Statuses as the kubelet writes them: phase, the five pod conditions, init and container statuses with
  ``running`` and ``terminated`` (exit code, reason Completed or Error, the termination message, with
  ``FallbackToLogsOnError``), ``podIP``, ``hostIP``, ``startTime``.
- **Deletion.** A pod being deleted gets SIGTERM on every container's process group, SIGKILL once its
  grace period is over, then the kubelet's final delete (grace 0, uid precondition).
- **Images** map to host programs: Argo's executor image to the built ``argoexec``, dsx's control and GPU
  images to this interpreter's environment running this checkout's code (``HOME=/tmp``, as the Dockerfile
  sets), Argo Events' image to the built ``argo-events`` with the built ``argo`` on ``PATH`` (the image
  has it in ``/usr/local/bin``: its sensor's argoWorkflow trigger runs ``argo submit``), ``pause`` images to a
  process that sleeps until stopped. Any other image ends ``ErrImagePull``.

Control of the fake hardware, for tests: ``DIR/nodes/NODE/reboot`` (a file) reboots the node as a real one
reboots (:meth:`ProcessKubelet.reboot`): the new boot id at once, Ready 20 s later, and 40 s after that
the node's sentinel conditions written False, as the agent's first reading of the new boot would (the
e2e cluster runs no agent of its own). ``DIR/nodes/NODE/down`` (a file) takes the node down as a machine
that is off or cut off: its Lease is no longer renewed nor its status posted (the node lifecycle
controller then marks it ``Unknown``), and nothing is done for its pods (a pod deleted there stays
terminating); removing the file brings it back as a reboot.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dnslib
from kubernetes import client, config
from kubernetes.client.rest import ApiException

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[1]
CONTAINER_HELPER = HERE / "container.py"
#: GPUs a fake node reports unless told (``--gpus``): what an H100 node has.
GPUS = 8
CLUSTER_DOMAIN = "cluster.local"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
KUBELET_VERSION = "v1.37.2"
OS_IMAGE = "Ubuntu 22.04.5 LTS"
LEASE_RENEW_S = 10
STATUS_REPORT_S = 60
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Image:
    """What an image would have given the container: its entrypoint, command, environment, workdir."""

    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str]
    workdir: str


def image_for(name: str, bin_dir: Path) -> Image | None:
    if "argoproj/argoexec" in name:
        return Image(["argoexec"], [], {"PATH": f"{bin_dir}:{SYSTEM_PATH}"}, "/")
    if "argoproj/argo-events" in name:
        return Image([str(bin_dir / "argo-events")], [], {"PATH": f"{bin_dir}:{SYSTEM_PATH}"}, "/")
    if "dsx-dev/dsx" in name:
        env = {
            "PATH": f"{Path(sys.executable).parent}:{bin_dir}:{SYSTEM_PATH}",
            # This checkout's dsx, ahead of whichever one the environment has installed (an editable
            # install of another checkout would otherwise be what the pods run).
            "PYTHONPATH": str(CHECKOUT),
            "HOME": "/tmp",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        return Image([], ["dsx", "--help"], env, "/tmp")
    if "/pause" in name:
        # The pause program ends at SIGTERM or SIGINT (with a handler, as PID 1 must have one to hear them).
        pause = 'trap "exit 0" TERM INT; sleep infinity & wait'
        return Image(["sh", "-c", pause], [], {"PATH": SYSTEM_PATH}, "/")
    return None


# ------------------------------------------------------------------------------------------ network


class Network:
    """Pod network namespaces on one bridge, IPs from its /24, and the names cluster DNS answers for.

    IPs are handed out round-robin, as the host-local IPAM of the CNI plugins does (it continues from the
    last address it reserved): an address just given back is not given again at once. Handing out the
    lowest free one reused a deleted pod's IP within the second, while the kernel was still tearing the
    old namespace down in the background with its veth on the bridge: two interfaces answered for one IP,
    and a peer that learnt the dying one's address lost its packets until its ARP entry was probed again,
    some 5 s later. The veth is also deleted at once on release, not left to the namespace's deferred
    teardown.
    """

    def __init__(self, bridge: str, gateway: str) -> None:
        self.bridge = bridge
        self.gateway = gateway
        self.prefix = gateway.rsplit(".", 1)[0]
        self.lock = threading.Lock()
        self.create_lock = threading.Lock()
        self.used: dict[int, str] = {}
        self.names: dict[str, list[str]] = {}
        self.counter = 0
        self.last = 1

    def create(self, uid: str) -> tuple[str, str]:
        """A network namespace for pod ``uid``: (namespace name, pod IP)."""
        with self.lock:
            order = [*range(self.last + 1, 255), *range(2, self.last + 1)]
            octet = next(n for n in order if n not in self.used)
            self.used[octet] = uid
            self.last = octet
            self.counter += 1
            number = self.counter
        ns = f"{self.bridge}-{number}"
        veth = self._veth(ns)
        ip = f"{self.prefix}.{octet}"
        steps = [
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
            ["ip", "link", "set", veth, "master", self.bridge, "up"],
            ["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"],
            ["ip", "-n", ns, "link", "set", "eth0", "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", ns, "route", "add", "default", "via", self.gateway],
        ]
        # One at a time: concurrent `ip netns add` and `ip link add ... netns` race on the namespace's mount.
        with self.create_lock:
            for step in steps:
                done = subprocess.run(step, capture_output=True, text=True)
                if done.returncode != 0:
                    subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
                    raise OSError(f"{' '.join(step)}: {done.stderr.strip()}")
        return ns, ip

    def release(self, ns: str, ip: str) -> list[int]:
        """Give the pod's IP back once nothing is left in its namespace: the processes still there are
        killed first (returned, for the log), as a runtime's sandbox teardown does. A process left alive
        would keep the namespace, its veth and the IP on the bridge, beside the next pod given it."""
        left = self._pids(ns)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while left and self._pids(ns) and time.monotonic() < deadline:
            time.sleep(0.1)
        subprocess.run(["ip", "link", "delete", self._veth(ns)], capture_output=True)
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        with self.lock:
            self.used.pop(int(ip.rsplit(".", 1)[1]), None)
        return left

    def _veth(self, ns: str) -> str:
        """The host side of namespace ``ns``'s veth pair (its peer is the pod's ``eth0``)."""
        return f"v{self.bridge[-3:]}x{ns.rsplit('-', 1)[1]}"

    @staticmethod
    def _pids(ns: str) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(pid) for pid in done.stdout.split()]

    def publish(self, uid: str, ip: str, names: list[str]) -> None:
        """Let cluster DNS answer ``names`` (fully qualified; the first is the reverse answer) with ``ip``."""
        with self.lock:
            self.names[uid] = [ip, *names]

    def withdraw(self, uid: str) -> None:
        with self.lock:
            self.names.pop(uid, None)

    def resolve(self, name: str) -> str | None:
        """The IP of a published name (fully qualified, lower case), or ``None``."""
        with self.lock:
            return next((entry[0] for entry in self.names.values() if name in entry[1:]), None)

    def reverse(self, ip: str) -> str | None:
        """The first name published for ``ip``, or ``None``."""
        with self.lock:
            return next(
                (entry[1] for entry in self.names.values() if entry[0] == ip and len(entry) > 1), None
            )


class ClusterDns:
    """The cluster's DNS as CoreDNS serves pods (its ``kubernetes`` plugin), on the bridge's gateway, port 53.

    A pod behind a headless Service (``hostname`` and ``subdomain``) is
    ``HOSTNAME.SUBDOMAIN.NAMESPACE.svc.cluster.local``, and its IP's reverse name points back there; any
    pod is ``A-B-C-D.NAMESPACE.pod.cluster.local`` (``pods insecure``). A known name asked for another
    type answers with no records, anything else NXDOMAIN: every query is answered at once, as a cluster's
    DNS answers. A closed port is not the same: the host's ICMP rate limit lets about one refusal a second
    through, so a burst of lookups (c10d makes one for every connection it logs) waited out the
    resolver's 5 s timeout every third or fourth query. A Service name, and the reverse lookup that gives
    it, is answered only while ``service_exists(namespace, subdomain)`` says the headless Service is
    there, as CoreDNS answers from its endpoints (that the Service selects the pod is not checked). UDP
    only: glibc asks over UDP and these answers are small.
    """

    def __init__(self, network: Network, service_exists: Callable[[str, str], bool], port: int = 53) -> None:
        self.network = network
        self.port = port
        self.service_exists = service_exists

    def start(self) -> int:
        """Bind the gateway's port and answer from a thread of its own; the port bound."""
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        server.bind((self.network.gateway, self.port))
        threading.Thread(target=self._serve, args=(server,), name="cluster dns", daemon=True).start()
        return int(server.getsockname()[1])

    def _serve(self, server: socket.socket) -> None:
        while True:
            try:
                data, peer = server.recvfrom(4096)
            except OSError:
                return
            reply = self.answer(data)
            if reply is not None:
                with contextlib.suppress(OSError):
                    server.sendto(reply, peer)

    def answer(self, data: bytes) -> bytes | None:
        """The reply to one query packet, or ``None`` for a packet that is not a query."""
        try:
            request = dnslib.DNSRecord.parse(data)
        except dnslib.DNSError:
            return None
        if request.header.qr or not request.questions:
            return None
        reply = request.reply()
        question = request.q
        name = str(question.qname).rstrip(".").lower()
        if question.qtype == dnslib.QTYPE.PTR:
            target = self.network.reverse(_reverse_ip(name) or "")
            if target is None or not self._service_there(target):
                reply.header.rcode = dnslib.RCODE.NXDOMAIN
            else:
                reply.add_answer(
                    dnslib.RR(question.qname, dnslib.QTYPE.PTR, rdata=dnslib.PTR(target), ttl=30)
                )
            return reply.pack()
        ip = self.network.resolve(name)
        if ip is None or not self._service_there(name):
            reply.header.rcode = dnslib.RCODE.NXDOMAIN
        elif question.qtype in (dnslib.QTYPE.A, dnslib.QTYPE.ANY):
            reply.add_answer(dnslib.RR(question.qname, dnslib.QTYPE.A, rdata=dnslib.A(ip), ttl=30))
        return reply.pack()

    def _service_there(self, name: str) -> bool:
        """Whether the headless Service a ``HOST.SUBDOMAIN.NS.svc.cluster.local`` name stands on exists
        (any other name stands on none)."""
        labels = name.split(".")
        if len(labels) != 6 or ".".join(labels[3:]) != f"svc.{CLUSTER_DOMAIN}":
            return True
        return self.service_exists(labels[2], labels[1])


def _reverse_ip(name: str) -> str | None:
    """``d.c.b.a.in-addr.arpa`` as ``a.b.c.d``; ``None`` for any other name."""
    labels = name.split(".")
    if len(labels) != 6 or labels[4:] != ["in-addr", "arpa"]:
        return None
    return ".".join(reversed(labels[:4]))


def pod_dns_names(ip: str, namespace: str, hostname: str, subdomain: str | None) -> list[str]:
    """The names cluster DNS gives a pod, the one its IP's reverse lookup answers first."""
    names = [f"{ip.replace('.', '-')}.{namespace}.pod.{CLUSTER_DOMAIN}"]
    if subdomain:
        names.insert(0, f"{hostname}.{subdomain}.{namespace}.svc.{CLUSTER_DOMAIN}")
    return [name.lower() for name in names]


# ---------------------------------------------------------------------------------------------- pods


@dataclass
class Running:
    name: str
    process: subprocess.Popen[bytes]
    started_at: str
    log: Path
    spec_dir: Path
    restarts: int = 0


@dataclass
class PodWorker:
    kubelet: ProcessKubelet
    pod: dict[str, Any]
    thread: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    launching: threading.Lock = field(default_factory=threading.Lock)
    running: dict[str, Running] = field(default_factory=dict)
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    init_statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    netns: str = ""
    ip: str = ""
    start_time: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    finished: bool = False
    deleting: bool = False
    resolv: Path | None = None
    hosts: Path | None = None
    hostname: str = ""

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    @property
    def dir(self) -> Path:
        return self.kubelet.dir / "pods" / self.uid

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.pod["spec"])

    # -------------------------------------------------------------------------------- life cycle

    def start(self) -> None:
        self.thread = threading.Thread(target=self._life, name=f"pod {self.key}", daemon=True)
        self.thread.start()

    def _life(self) -> None:
        try:
            self._run()
        except Exception as exc:  # the kubelet reports it on the pod, as a sandbox failure
            self.kubelet.log(f"{self.key}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            self._patch_status({"phase": "Failed", "reason": "KubeletError", "message": str(exc)[:1000]})
            self.finished = True
        finally:
            self._kill_all(signal.SIGKILL)

    def _run(self) -> None:
        spec = self.spec
        self.dir.mkdir(parents=True, exist_ok=True)
        self.start_time = now()
        if spec.get("hostNetwork"):
            self.ip = self.kubelet.network.gateway
        else:
            self.netns, self.ip = self.kubelet.network.create(self.uid)
        self.hostname = spec.get("hostname") or self.pod["metadata"]["name"]
        if self.netns:
            names = pod_dns_names(
                self.ip, self.pod["metadata"]["namespace"], self.hostname, spec.get("subdomain")
            )
            self.kubelet.network.publish(self.uid, self.ip, names)
        self.hosts = self._hosts_file()
        self.resolv = self._resolv_conf()
        for c in spec.get("initContainers") or []:
            self.init_statuses[c["name"]] = _waiting(c, "PodInitializing")
        for c in spec.get("containers") or []:
            self.statuses[c["name"]] = _waiting(
                c, "PodInitializing" if spec.get("initContainers") else "ContainerCreating"
            )
        self._report()
        try:
            self._volumes()
        except (ApiException, OSError, KeyError) as exc:
            self._patch_status(
                {"phase": "Pending", "reason": "FailedMount", "message": f"volume setup failed: {exc}"[:1000]}
            )
            while not self.stopping.wait(1):
                pass
            return
        restart = spec.get("restartPolicy", "Always")
        for c in spec.get("initContainers") or []:
            code = self._run_to_end(c, self.init_statuses, restart)
            if self.stopping.is_set():
                return
            if code != 0:
                self._finish("Failed")
                return
        for c in spec.get("containers") or []:
            self._launch(c, self.statuses)
        self._report()
        self._supervise(restart)

    def _hosts_file(self) -> Path:
        """The pod's ``/etc/hosts``, written once as the kubelet writes it (``managedHostsFileContent``):
        localhost, the pod's own IP with its names (the fully qualified one first when it has a
        ``subdomain``) and its ``hostAliases``; a ``hostNetwork`` pod's names the node. Peers are
        found through cluster DNS (:class:`ClusterDns`), never here."""
        spec = self.spec
        lines = [
            "# Kubernetes-managed hosts file.",
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            "fe00::0\tip6-localnet",
            "fe00::0\tip6-mcastprefix",
            "fe00::1\tip6-allnodes",
            "fe00::2\tip6-allrouters",
        ]
        if self.netns:
            own = [self.hostname]
            if spec.get("subdomain"):
                ns = self.pod["metadata"]["namespace"]
                own.insert(0, f"{self.hostname}.{spec['subdomain']}.{ns}.svc.{CLUSTER_DOMAIN}")
            lines.append(f"{self.ip}\t" + "\t".join(own))
        else:
            lines.append(f"{self.ip}\t{spec.get('nodeName') or self.hostname}")
        for alias in spec.get("hostAliases") or []:
            lines.append(f"{alias['ip']}\t" + "\t".join(alias.get("hostnames") or []))
        path = self.dir / "hosts"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _resolv_conf(self) -> Path | None:
        """The pod's ``/etc/resolv.conf`` as the kubelet writes it for its ``dnsPolicy``: ``ClusterFirst``
        (the default; a ``hostNetwork`` pod takes the node's instead) and ``ClusterFirstWithHostNet`` name
        cluster DNS (:class:`ClusterDns`) with the cluster's search domains and ``ndots:5``; ``Default``
        keeps the node's (``None``: nothing mounted); ``None`` is the pod's ``dnsConfig`` alone."""
        spec = self.spec
        policy = spec.get("dnsPolicy") or "ClusterFirst"
        ns = self.pod["metadata"]["namespace"]
        servers: list[str] = []
        searches: list[str] = []
        options: list[str] = []
        if policy == "ClusterFirstWithHostNet" or (policy == "ClusterFirst" and self.netns):
            servers = [self.kubelet.network.gateway]
            searches = [f"{ns}.svc.{CLUSTER_DOMAIN}", f"svc.{CLUSTER_DOMAIN}", CLUSTER_DOMAIN]
            options = ["ndots:5"]
        elif policy != "None":
            return None
        config = spec.get("dnsConfig") or {}
        servers += config.get("nameservers") or []
        searches += config.get("searches") or []
        for option in config.get("options") or []:
            value = option.get("value")
            options.append(option["name"] + (f":{value}" if value is not None else ""))
        lines = [f"search {' '.join(searches)}"] if searches else []
        lines += [f"nameserver {server}" for server in servers]
        lines += [f"options {' '.join(options)}"] if options else []
        path = self.dir / "resolv.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _deadline_passed(self) -> bool:
        deadline = self.spec.get("activeDeadlineSeconds")
        if deadline is None:
            return False
        started = dt.datetime.strptime(self.start_time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
        return (dt.datetime.now(dt.UTC) - started).total_seconds() > float(deadline)

    def _run_to_end(
        self, container: dict[str, Any], statuses: dict[str, dict[str, Any]], restart: str
    ) -> int:
        while True:
            self._launch(container, statuses)
            running = self.running.get(container["name"])
            if running is None:  # stopping: not started
                return -1
            self._report()
            while running.process.poll() is None:
                if self.stopping.wait(0.2):
                    return -1
                if self._deadline_passed():
                    self._deadline()
                    return -1
            code = self._ended(container, statuses)
            self._report()
            if code == 0 or restart == "Never":
                return code
            if self.stopping.wait(1):
                return -1

    def _supervise(self, restart: str) -> None:
        containers = {c["name"]: c for c in self.spec.get("containers") or []}
        while not self.stopping.is_set():
            changed = False
            for name, c in containers.items():
                running = self.running.get(name)
                if running is None or running.process.poll() is None:
                    continue
                code = self._ended(c, self.statuses)
                changed = True
                if restart == "Always" or (restart == "OnFailure" and code != 0):
                    if self.stopping.wait(1):
                        break
                    self._launch(c, self.statuses, restarts=running.restarts + 1)
            if changed:
                self._report()
            if not self.running:
                ok = all(
                    s["state"].get("terminated", {}).get("exitCode") == 0 for s in self.statuses.values()
                )
                self._finish("Succeeded" if ok else "Failed")
                return
            if self._deadline_passed():
                self._deadline()
                return
            self.stopping.wait(0.2)

    def _deadline(self) -> None:
        self._kill_all(signal.SIGKILL)
        for name in list(self.running):
            self._ended_by_signal(name)
        self._patch_status(
            {
                "phase": "Failed",
                "reason": "DeadlineExceeded",
                "message": "Pod was active on the node longer than the specified deadline",
                **self._status_lists(),
            }
        )
        self.finished = True

    def _finish(self, phase: str) -> None:
        self.finished = True
        self._report(phase=phase)

    # -------------------------------------------------------------------------------- containers

    def _launch(self, c: dict[str, Any], statuses: dict[str, dict[str, Any]], restarts: int = 0) -> None:
        image = image_for(c.get("image", ""), self.kubelet.bin)
        if image is None:
            statuses[c["name"]] = {
                **_waiting(c, "ErrImagePull"),
                "state": {
                    "waiting": {
                        "reason": "ErrImagePull",
                        "message": f"image {c.get('image')!r} is not known to the process kubelet",
                    }
                },
            }
            self._report()
            while not self.stopping.wait(1):
                pass
            return
        cdir = self.dir / "containers" / c["name"]
        if cdir.exists():
            shutil.rmtree(cdir)
        cdir.mkdir(parents=True)
        term = cdir / "termination-log"
        term.touch()
        term.chmod(0o666)
        # As the kubelet combines them with the image's: a command replaces the entrypoint and drops the
        # image's arguments; arguments alone replace the image's arguments.
        command, args = c.get("command"), c.get("args")
        if command:
            argv = [*command, *(args or [])]
        else:
            argv = [*image.entrypoint, *(args if args is not None else image.cmd)]
        uid, gid, groups = self._identity(c)
        spec = {
            "name": c["name"],
            "hostname": self.hostname,
            "argv": argv,
            "env": self._env(c, image),
            "workingDir": c.get("workingDir") or image.workdir,
            "mounts": self._mounts(c),
            "hosts": str(self.hosts),
            "resolv": str(self.resolv) if self.resolv else None,
            "terminationLog": str(term),
            "terminationMessagePath": c.get("terminationMessagePath") or "/dev/termination-log",
            "uid": uid,
            "gid": gid,
            "groups": groups,
        }
        spec_path = cdir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        # --pid --fork: the container's command is PID 1 of a namespace of its own, so its end ends every
        # process it started, whichever session they joined; --kill-child ends it when unshare is killed.
        namespaces = ["--mount", "--uts", "--pid", "--fork", "--kill-child", "--propagation", "private"]
        wrapper = ["unshare", *namespaces, "--"]
        if self.netns:
            wrapper = ["ip", "netns", "exec", self.netns, *wrapper]
        log = cdir.with_suffix(".log")
        # No container starts once the pod is stopping: a restart racing the stop would outlive the pod.
        with self.launching:
            if self.stopping.is_set():
                return
            with open(log, "ab") as out:
                process = subprocess.Popen(
                    [*wrapper, sys.executable, "-I", str(CONTAINER_HELPER), str(spec_path)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            started = now()
            self.running[c["name"]] = Running(c["name"], process, started, log, cdir, restarts)
        statuses[c["name"]] = _container_status(
            c, {"running": {"startedAt": started}}, ready=True, restarts=restarts, pid=process.pid
        )

    def _ended(self, c: dict[str, Any], statuses: dict[str, dict[str, Any]]) -> int:
        running = self.running.pop(c["name"])
        code = running.process.wait()
        code = 128 - code if code < 0 else code  # killed by signal N: 128 + N
        start_error = running.spec_dir / "start-error"
        message = (running.spec_dir / "termination-log").read_text(errors="replace")[:4096]
        reason = "Completed" if code == 0 else "Error"
        if start_error.exists():
            reason, message = "StartError", start_error.read_text()
        elif not message and code != 0 and c.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            lines = running.log.read_text(errors="replace").splitlines()[-80:]
            message = "\n".join(lines)[-2048:]
        terminated: dict[str, Any] = {
            "exitCode": code,
            "reason": reason,
            "startedAt": running.started_at,
            "finishedAt": now(),
            "containerID": f"process://{running.process.pid}",
        }
        if message:
            terminated["message"] = message
        statuses[c["name"]] = _container_status(
            c, {"terminated": terminated}, ready=False, restarts=running.restarts, pid=running.process.pid
        )
        return code

    def _ended_by_signal(self, name: str) -> None:
        containers = {
            c["name"]: c for c in [*(self.spec.get("initContainers") or []), *self.spec["containers"]]
        }
        target = self.init_statuses if name in self.init_statuses else self.statuses
        self._ended(containers[name], target)

    def _kill_all(self, sig: int) -> None:
        for running in list(self.running.values()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(running.process.pid, sig)

    def stop(self, grace: float) -> None:
        """SIGTERM every container, SIGKILL once ``grace`` is over; report them terminated."""
        with self.launching:
            self.stopping.set()
        self._kill_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(r.process.poll() is None for r in self.running.values()):
            time.sleep(0.1)
        self._kill_all(signal.SIGKILL)
        for name in list(self.running):
            self._ended_by_signal(name)
        if self.thread is not None:
            self.thread.join(timeout=5)

    def cleanup(self) -> None:
        self.kubelet.network.withdraw(self.uid)
        if self.netns:
            left = self.kubelet.network.release(self.netns, self.ip)
            if left:
                self.kubelet.log(f"{self.key}: {len(left)} processes outlived its containers, killed: {left}")
            self.netns = ""

    # --------------------------------------------------------------------------------- identity

    def _identity(self, c: dict[str, Any]) -> tuple[int, int, list[int]]:
        pod_sc = self.spec.get("securityContext") or {}
        sc = c.get("securityContext") or {}
        uid = int(sc.get("runAsUser", pod_sc.get("runAsUser", 0)))
        gid = int(sc.get("runAsGroup", pod_sc.get("runAsGroup", 0)))
        if (sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True) and uid == 0:
            raise OSError("container has runAsNonRoot and image will run as root")
        groups = [gid]
        if pod_sc.get("fsGroup") is not None:
            groups.append(int(pod_sc["fsGroup"]))
        groups += [int(g) for g in pod_sc.get("supplementalGroups") or []]
        return uid, gid, sorted(set(groups))

    # ------------------------------------------------------------------------------------- env

    def _field(self, path: str) -> str:
        meta = self.pod["metadata"]
        simple = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": self.spec.get("nodeName", ""),
            "spec.serviceAccountName": self.spec.get("serviceAccountName", "default"),
            "status.podIP": self.ip,
            "status.podIPs": self.ip,
            "status.hostIP": self.kubelet.network.gateway,
            "status.hostIPs": self.kubelet.network.gateway,
        }
        if path in simple:
            return str(simple[path])
        for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
            if path.startswith(prefix + "['") and path.endswith("']"):
                return str((meta.get(source) or {}).get(path[len(prefix) + 2 : -2], ""))
            if path == prefix:
                return "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get(source) or {}).items()))
        raise KeyError(f"unsupported fieldRef {path!r}")

    def _resource(self, c: dict[str, Any], ref: dict[str, Any]) -> str:
        resources = c.get("resources") or {}
        kind, _, name = ref["resource"].partition(".")
        value = (resources.get(kind) or {}).get(name)
        if value is None and kind == "requests":
            value = (resources.get("limits") or {}).get(name)
        if value is None:
            value = {"cpu": "16", "memory": str(128 * 2**30), "ephemeral-storage": str(500 * 2**30)}.get(
                name, "0"
            )
        return str(value)

    def _env(self, c: dict[str, Any], image: Image) -> dict[str, str]:
        ns = self.pod["metadata"]["namespace"]
        env = dict(image.env)
        env["HOSTNAME"] = self.hostname
        env["KUBERNETES_SERVICE_HOST"] = self.kubelet.network.gateway
        env["KUBERNETES_SERVICE_PORT"] = str(self.kubelet.apiserver_port)
        env["KUBERNETES_SERVICE_PORT_HTTPS"] = str(self.kubelet.apiserver_port)
        env["KUBERNETES_PORT"] = f"tcp://{self.kubelet.network.gateway}:{self.kubelet.apiserver_port}"
        for source in c.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self.kubelet.config_map(
                    ns, source["configMapRef"]["name"], source["configMapRef"].get("optional")
                )
            else:
                data = self.kubelet.secret(
                    ns, source["secretRef"]["name"], source["secretRef"].get("optional")
                )
            env.update({prefix + k: v for k, v in data.items()})
        for item in c.get("env") or []:
            if "value" in item:
                env[item["name"]] = _expand(str(item["value"]), env)
                continue
            ref = item.get("valueFrom") or {}
            if "fieldRef" in ref:
                env[item["name"]] = self._field(ref["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in ref:
                env[item["name"]] = self._resource(c, ref["resourceFieldRef"])
            elif "configMapKeyRef" in ref:
                r = ref["configMapKeyRef"]
                value = self.kubelet.config_map(ns, r["name"], r.get("optional")).get(r["key"])
                if value is not None:
                    env[item["name"]] = value
            elif "secretKeyRef" in ref:
                r = ref["secretKeyRef"]
                value = self.kubelet.secret(ns, r["name"], r.get("optional")).get(r["key"])
                if value is not None:
                    env[item["name"]] = value
            else:
                env[item["name"]] = ""
        return env

    # --------------------------------------------------------------------------------- volumes

    def _volume_dir(self, name: str) -> Path:
        return self.dir / "volumes" / name

    def _write_files(self, root: Path, files: dict[str, bytes], mode: int) -> None:
        root.mkdir(parents=True, exist_ok=True)
        gid = (self.spec.get("securityContext") or {}).get("fsGroup")
        for rel, content in files.items():
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            target.chmod(mode)
            if gid is not None:
                os.chown(target, 0, int(gid))
        root.chmod(0o755)

    def _items(self, data: dict[str, bytes], items: list[dict[str, Any]] | None) -> dict[str, bytes]:
        if not items:
            return data
        return {i["path"]: data[i["key"]] for i in items if i["key"] in data}

    def _projected_source(self, source: dict[str, Any]) -> dict[str, bytes]:
        ns = self.pod["metadata"]["namespace"]
        if "serviceAccountToken" in source:
            s = source["serviceAccountToken"]
            token = self.kubelet.token(ns, self.spec.get("serviceAccountName", "default"), self.pod, s)
            return {s["path"]: token.encode()}
        if "configMap" in source:
            s = source["configMap"]
            data = {
                k: v.encode() for k, v in self.kubelet.config_map(ns, s["name"], s.get("optional")).items()
            }
            return self._items(data, s.get("items"))
        if "secret" in source:
            s = source["secret"]
            data = {k: v.encode() for k, v in self.kubelet.secret(ns, s["name"], s.get("optional")).items()}
            return self._items(data, s.get("items"))
        if "downwardAPI" in source:
            return self._downward(source["downwardAPI"].get("items") or [])
        raise KeyError(f"unsupported projected source {sorted(source)}")

    def _downward(self, items: list[dict[str, Any]]) -> dict[str, bytes]:
        out = {}
        for item in items:
            if "fieldRef" in item:
                out[item["path"]] = self._field(item["fieldRef"]["fieldPath"]).encode()
        return out

    def _volumes(self) -> None:
        ns = self.pod["metadata"]["namespace"]
        for volume in self.spec.get("volumes") or []:
            root = self._volume_dir(volume["name"])
            if "emptyDir" in volume:
                root.mkdir(parents=True, exist_ok=True)
                root.chmod(0o777)
            elif "hostPath" in volume:
                continue
            elif "configMap" in volume:
                s = volume["configMap"]
                data = {
                    k: v.encode()
                    for k, v in self.kubelet.config_map(ns, s["name"], s.get("optional")).items()
                }
                self._write_files(root, self._items(data, s.get("items")), s.get("defaultMode", 0o644))
            elif "secret" in volume:
                s = volume["secret"]
                data = {
                    k: v.encode()
                    for k, v in self.kubelet.secret(ns, s["secretName"], s.get("optional")).items()
                }
                self._write_files(root, self._items(data, s.get("items")), s.get("defaultMode", 0o644))
            elif "downwardAPI" in volume:
                s = volume["downwardAPI"]
                self._write_files(root, self._downward(s.get("items") or []), s.get("defaultMode", 0o644))
            elif "projected" in volume:
                s = volume["projected"]
                files: dict[str, bytes] = {}
                for source in s.get("sources") or []:
                    files.update(self._projected_source(source))
                self._write_files(root, files, s.get("defaultMode", 0o644))
            else:
                raise KeyError(f"volume {volume['name']}: unsupported type {sorted(set(volume) - {'name'})}")

    def _mounts(self, c: dict[str, Any]) -> list[dict[str, Any]]:
        volumes = {v["name"]: v for v in self.spec.get("volumes") or []}
        mounts = []
        for m in c.get("volumeMounts") or []:
            volume = volumes[m["name"]]
            source = Path(volume["hostPath"]["path"]) if "hostPath" in volume else self._volume_dir(m["name"])
            if m.get("subPath"):
                source = source / m["subPath"]
                if not source.exists():
                    source.mkdir(parents=True)
                    source.chmod(0o777)
            mounts.append(
                {"source": str(source), "target": m["mountPath"], "readOnly": bool(m.get("readOnly"))}
            )
        return mounts

    # ---------------------------------------------------------------------------------- status

    def _status_lists(self) -> dict[str, Any]:
        lists: dict[str, Any] = {"containerStatuses": list(self.statuses.values())}
        if self.init_statuses:
            lists["initContainerStatuses"] = list(self.init_statuses.values())
        return lists

    def _report(self, phase: str | None = None) -> None:
        inits_done = all(
            s["state"].get("terminated", {}).get("exitCode") == 0 for s in self.init_statuses.values()
        )
        running = [s for s in self.statuses.values() if "running" in s["state"]]
        all_ready = bool(self.statuses) and len(running) == len(self.statuses)
        if phase is None:
            phase = (
                "Running"
                if running or any("terminated" in s["state"] for s in self.statuses.values())
                else "Pending"
            )
        stamp = now()
        conditions = [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": stamp},
            {"type": "Initialized", "status": "True" if inits_done else "False", "lastTransitionTime": stamp},
            {"type": "Ready", "status": "True" if all_ready else "False", "lastTransitionTime": stamp},
            {
                "type": "ContainersReady",
                "status": "True" if all_ready else "False",
                "lastTransitionTime": stamp,
            },
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
        ]
        if not inits_done:
            conditions[1]["reason"] = "ContainersNotInitialized"
        if not all_ready:
            conditions[2]["reason"] = conditions[3]["reason"] = (
                "PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady"
            )
        status = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.kubelet.network.gateway,
            "hostIPs": [{"ip": self.kubelet.network.gateway}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            **self._status_lists(),
        }
        self._patch_status(status)

    def _patch_status(self, status: dict[str, Any]) -> None:
        meta = self.pod["metadata"]
        with self.lock:
            for _ in range(5):
                try:
                    self.kubelet.core.patch_namespaced_pod_status(
                        meta["name"], meta["namespace"], {"status": status}
                    )
                    return
                except ApiException as exc:
                    if exc.status == 404:
                        return
                    self.kubelet.log(f"{self.key}: status not written: {exc.status} {exc.body}")
                    time.sleep(0.5)


def _expand(value: str, env: dict[str, str]) -> str:
    """``$(VAR)`` references to earlier variables, as the kubelet expands them; ``$$`` escapes."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
        elif value.startswith("$(", i) and ")" in value[i:]:
            end = value.index(")", i)
            name = value[i + 2 : end]
            out.append(env.get(name, value[i : end + 1]))
            i = end + 1
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _waiting(c: dict[str, Any], reason: str) -> dict[str, Any]:
    return {
        "name": c["name"],
        "image": c.get("image", ""),
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "started": False,
        "state": {"waiting": {"reason": reason}},
    }


def _container_status(
    c: dict[str, Any], state: dict[str, Any], ready: bool, restarts: int, pid: int
) -> dict[str, Any]:
    return {
        "name": c["name"],
        "image": c.get("image", ""),
        "imageID": f"process://{c.get('image', '')}",
        "containerID": f"process://{pid}",
        "ready": ready,
        "restartCount": restarts,
        "started": "running" in state,
        "state": state,
    }


# -------------------------------------------------------------------------------------------- nodes


class ProcessKubelet:
    def __init__(self, args: argparse.Namespace) -> None:
        self.dir: Path = args.dir.resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bin: Path = args.bin
        self.apiserver_port: int = args.apiserver_port
        self.ca = Path(args.ca).read_text()
        config.load_kube_config(str(args.kubeconfig))
        self.api = client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)
        self.auth = client.AuthenticationV1Api(self.api)
        self.network = Network(args.bridge, args.gateway)
        self.dns = ClusterDns(self.network, service_exists=self.service_exists)
        self.nodes = [f"node-{i:02d}" for i in range(args.nodes)]
        self.racks = {n: f"rack-{i * args.racks // args.nodes:02d}" for i, n in enumerate(self.nodes)}
        self.gpus: int = args.gpus
        self.workers: dict[str, PodWorker] = {}
        self.workers_lock = threading.Lock()
        self.stop_event = threading.Event()
        self.boot_ids: dict[str, str] = {}
        self.transitions: dict[tuple[str, str], tuple[str, str]] = {}
        self.ready: dict[str, bool] = dict.fromkeys(self.nodes, True)
        self.down: set[str] = set()

    def service_exists(self, namespace: str, name: str) -> bool:
        """Whether Service ``namespace/name`` exists (for cluster DNS); an API server out of reach says no."""
        try:
            self.core.read_namespaced_service(name, namespace)
        except Exception:  # not found, or the server away: cluster DNS cannot answer from it either
            return False
        return True

    def log(self, line: str) -> None:
        print(f"{now()} {line}", flush=True)

    # ------------------------------------------------------------------------------- API reads

    def config_map(self, ns: str, name: str, optional: bool | None) -> dict[str, str]:
        try:
            cm = self.core.read_namespaced_config_map(name, ns)
        except ApiException as exc:
            if exc.status == 404 and optional:
                return {}
            raise
        data = dict(cm.data or {})
        return data

    def secret(self, ns: str, name: str, optional: bool | None) -> dict[str, str]:
        try:
            secret = self.core.read_namespaced_secret(name, ns)
        except ApiException as exc:
            if exc.status == 404 and optional:
                return {}
            raise
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    def token(self, ns: str, account: str, pod: dict[str, Any], source: dict[str, Any]) -> str:
        """A bound token through the TokenRequest API, bound to the pod, as the kubelet asks for it."""
        spec: dict[str, Any] = {
            "expirationSeconds": int(source.get("expirationSeconds", 3607)),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        }
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        result = self.core.create_namespaced_service_account_token(
            account, ns, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        )
        return str(result.status.token)

    # ---------------------------------------------------------------------------------- nodes

    def boot_id(self, node: str) -> str:
        path = self.dir / "nodes" / node / "boot_id"
        if node not in self.boot_ids:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_text(str(uuid.uuid4()))
            self.boot_ids[node] = path.read_text().strip()
        return self.boot_ids[node]

    def _node_status(self, node: str) -> dict[str, Any]:
        stamp = now()
        ready = self.ready[node]

        def condition(kind: str, status: bool, reason: str, message: str) -> dict[str, Any]:
            # As the kubelet's setters: the transition time moves only when the status does.
            value = "True" if status else "False"
            was = self.transitions.get((node, kind))
            if was is None or was[0] != value:
                was = self.transitions[(node, kind)] = (value, stamp)
            return {
                "type": kind,
                "status": value,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": was[1],
            }

        resources = {
            "cpu": "16",
            "memory": "128Gi",
            "pods": "110",
            "ephemeral-storage": "500Gi",
            "nvidia.com/gpu": str(self.gpus),
        }
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition(
                    "MemoryPressure",
                    False,
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition("DiskPressure", False, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition(
                    "PIDPressure", False, "KubeletHasSufficientPID", "kubelet has sufficient PID available"
                ),
                condition(
                    "Ready",
                    ready,
                    "KubeletReady" if ready else "KubeletNotReady",
                    "kubelet is posting ready status" if ready else "container runtime is down",
                ),
            ],
            "addresses": [
                {"type": "InternalIP", "address": self.network.gateway},
                {"type": "Hostname", "address": node},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, node).hex,
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, node)),
                "bootID": self.boot_id(node),
                "kernelVersion": platform.release(),
                "osImage": OS_IMAGE,
                "containerRuntimeVersion": "process://1.0",
                "kubeletVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def register(self, node: str) -> None:
        labels = {
            "kubernetes.io/hostname": node,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": GPU_PRODUCT,
            "nvidia.com/gpu.count": str(self.gpus),
            "nvidia.com/gpu.memory": "81559",
            "topology.dsx.dev/rack": self.racks[node],
        }
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}}
        with contextlib.suppress(ApiException):
            self.core.create_node(body)
        self.post_status(node)

    def post_status(self, node: str) -> None:
        with contextlib.suppress(ApiException):
            self.core.patch_node_status(node, {"status": self._node_status(node)})

    def renew_lease(self, node: str) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": micro_now()},
        }
        try:
            self.coordination.patch_namespaced_lease(node, "kube-node-lease", {"spec": body["spec"]})
        except ApiException as exc:
            if exc.status == 404:
                with contextlib.suppress(ApiException):
                    self.coordination.create_namespaced_lease("kube-node-lease", body)

    def _heartbeats(self) -> None:
        last_status = 0.0
        while not self.stop_event.is_set():
            for node in self.nodes:
                if self.ready[node] and node not in self.down:
                    self.renew_lease(node)
            if time.monotonic() - last_status > STATUS_REPORT_S:
                for node in self.nodes:
                    if node not in self.down:
                        self.post_status(node)
                last_status = time.monotonic()
            self._controls()
            self.stop_event.wait(LEASE_RENEW_S / 5)

    def _controls(self) -> None:
        for node in self.nodes:
            request = self.dir / "nodes" / node / "reboot"
            if request.exists():
                request.unlink()
                threading.Thread(target=self.reboot, args=(node,), daemon=True).start()
            down = (self.dir / "nodes" / node / "down").exists()
            if down and node not in self.down:
                self.log(f"{node}: down (no Lease renewed, no status posted, its pods left as they are)")
                self.down.add(node)
            elif not down and node in self.down:
                self.down.discard(node)
                threading.Thread(target=self.reboot, args=(node,), daemon=True).start()

    def reboot(self, node: str, ready_after: float = 20.0, clear_after: float = 40.0) -> None:
        """As a node reboots: its pods die, a new boot id is reported at once, Ready comes later, and the
        sentinel's first reading of the new boot clears its conditions later still."""
        self.log(f"{node}: reboot")
        with self.workers_lock:
            workers = [w for w in self.workers.values() if w.spec.get("nodeName") == node]
        for worker in workers:
            worker.stop(0)
        self.ready[node] = False
        path = self.dir / "nodes" / node / "boot_id"
        path.write_text(str(uuid.uuid4()))
        self.boot_ids.pop(node, None)
        self.post_status(node)
        time.sleep(ready_after)
        self.ready[node] = True
        self.post_status(node)
        time.sleep(clear_after)
        self.clear_sentinel(node)

    def clear_sentinel(self, node: str) -> None:
        """The sentinel agent's first pass on a healthy node: each of its True conditions written False."""
        with contextlib.suppress(ApiException):
            current = self.core.read_node(node).to_dict()
            stamp = now()
            cleared = [
                {
                    "type": c["type"],
                    "status": "False",
                    "reason": "NoProblem",
                    "message": "no problem after the reboot",
                    "lastTransitionTime": stamp,
                    "lastHeartbeatTime": stamp,
                }
                for c in (current.get("status") or {}).get("conditions") or []
                if c["type"].startswith("Dsx") and c["status"] == "True"
            ]
            if cleared:
                self.log(f"{node}: sentinel conditions cleared: {', '.join(c['type'] for c in cleared)}")
                self.core.patch_node_status(node, {"status": {"conditions": cleared}})

    # ----------------------------------------------------------------------------------- pods

    def sync(self, pod: dict[str, Any]) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in self.nodes or node in self.down:
            return
        uid = pod["metadata"]["uid"]
        with self.workers_lock:
            worker = self.workers.get(uid)
            if worker is None:
                if pod["metadata"].get("deletionTimestamp"):
                    self._confirm_deletion(pod)
                    return
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    return  # ended before this kubelet started: nothing to run
                worker = PodWorker(self, pod)
                self.workers[uid] = worker
                worker.start()
                return
            worker.pod = pod
            # Checked and set under the lock: the watch and the resync may both bring the deletion.
            deleting = bool(pod["metadata"].get("deletionTimestamp")) and not worker.deleting
            worker.deleting = worker.deleting or deleting
        if deleting:
            grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            threading.Thread(target=self._delete, args=(worker, grace), daemon=True).start()

    def _delete(self, worker: PodWorker, grace: float) -> None:
        worker.stop(grace)
        worker.cleanup()
        self._confirm_deletion(worker.pod)
        with self.workers_lock:
            self.workers.pop(worker.uid, None)
        self._keep_logs(worker)

    def _keep_logs(self, worker: PodWorker) -> None:
        """A deleted pod's container logs move to ``DIR/deleted/NAMESPACE_NAME/`` (for a failing test's
        report; the real kubelet drops them), then its folder goes."""
        keep = self.dir / "deleted" / worker.key.replace("/", "_")
        keep.mkdir(parents=True, exist_ok=True)
        for log in (worker.dir / "containers").glob("*.log"):
            with contextlib.suppress(FileNotFoundError):
                shutil.move(str(log), keep / log.name)
        shutil.rmtree(worker.dir, ignore_errors=True)

    def _confirm_deletion(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                meta["name"],
                meta["namespace"],
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
                ),
            )

    def _watch_pods(self) -> None:
        from kubernetes import watch

        while not self.stop_event.is_set():
            try:
                listing = self.api.sanitize_for_serialization(
                    self.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=")
                )
                for pod in listing["items"]:
                    self.sync(pod)
                version = listing["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector="spec.nodeName!=",
                    resource_version=version,
                    timeout_seconds=30,
                    _preload_content=False,
                )
                for event in stream:
                    if self.stop_event.is_set():
                        return
                    pod = event["raw_object"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.sync(pod)
                    elif event["type"] == "DELETED":
                        self._forget(pod)
            except Exception as exc:  # the watch is restarted, as informers relist
                self.log(f"pod watch: {type(exc).__name__}: {exc}")
                self.stop_event.wait(1)

    def _forget(self, pod: dict[str, Any]) -> None:
        with self.workers_lock:
            worker = self.workers.pop(pod["metadata"]["uid"], None)
        if worker is not None:
            worker.stop(0)
            worker.cleanup()
            self._keep_logs(worker)

    # ------------------------------------------------------------------------------------ run

    def run(self) -> None:
        for node in self.nodes:
            self.register(node)
            self.renew_lease(node)
        self.dns.start()
        threading.Thread(target=self._heartbeats, name="heartbeats", daemon=True).start()
        threading.Thread(target=self._watch_pods, name="pods", daemon=True).start()
        self.log(f"kubelet: {len(self.nodes)} nodes registered")
        self.stop_event.wait()
        self.shutdown()

    def shutdown(self) -> None:
        with self.workers_lock:
            workers = list(self.workers.values())
        threads = [threading.Thread(target=w.stop, args=(5,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for w in workers:
            w.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.kubelet")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--bin", type=Path, required=True)
    parser.add_argument("--bridge", required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--apiserver-port", type=int, required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--racks", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=GPUS, help="nvidia.com/gpu of each node")
    args = parser.parse_args(argv)
    kubelet = ProcessKubelet(args)
    signal.signal(signal.SIGTERM, lambda *_: kubelet.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: kubelet.stop_event.set())
    kubelet.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

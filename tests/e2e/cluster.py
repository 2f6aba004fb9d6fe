"""A real control plane on this machine: ``python -m tests.e2e.cluster up|down --dir DIR``.

``up`` builds what the cache lacks (:mod:`tests.e2e.build`), then starts, each as a process of its own
with its log under ``DIR/logs``: etcd, kube-apiserver (its own PKI, Node and RBAC authorization, the
default admission plugins, Pod Security among them, the default one-hour event TTL), kube-controller-manager
(every default controller: garbage collector, Job, ReplicaSet and Deployment, disruption, node lifecycle,
service-account token and root-CA publisher...), kube-scheduler, Argo's CRDs (full schemas) and
workflow-controller, and the process kubelet (:mod:`tests.e2e.kubelet`) with four fake H100 nodes in two
racks. Then it labels namespace ``gpu-ops`` ``pod-security.kubernetes.io/enforce=restricted`` and installs
``charts/dsx`` there with the real helm. It prints ``export`` lines a shell can ``eval``.

The Events tier comes with it unless ``--no-events``: a JetStream ``nats-server`` (TLS) on the bridge,
Argo Events' release manifests (its CRDs and controller Deployment, in ``argo-events``), an EventBus
``default`` in ``gpu-ops`` pointing at that server (``jetstreamExotic``), and the chart installed with
``events.enabled=true``; ``up`` returns once the controller's pod and those of the chart's EventSource and
Sensor run.

Pods run in network namespaces of their own on a bridge this module creates (``10.244.N.0/24``); the API
server listens on the bridge's address, so pods reach it as ``KUBERNETES_SERVICE_HOST``. ``down`` stops
every process ``up`` started (by the process groups recorded in ``DIR/state.json``), removes the bridge
and the pods' network namespaces, and removes nothing else outside ``DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e import build
from tests.e2e.pki import make_pki, sign_server

__all__ = ["Cluster", "main"]

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools" / "bin"
NAMESPACE = "gpu-ops"
ARGO_NAMESPACE = "argo"
EXECUTOR_IMAGE = "quay.io/argoproj/argoexec:{version}"
SERVICE_RANGE = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
#: GPUs each fake node offers. A real H100 node has 8; here each GPU's rank is a CPU process with torch,
#: and 4 nodes of 8 (32 ranks importing torch at once) do not fit a healthy run's deadline on 2 cores.
DEFAULT_GPUS = 2
#: Values the chart is installed with: the sentinel DaemonSet needs NVML and host paths, which a
#: namespace enforcing Pod Security ``restricted`` refuses; the e2e tier does not install it. The repair
#: template is the one dsx ships, for ``replace`` (which no scenario's fault asks for but test_repair's).
#: The fault catalogue's overrides shorten the not-ready threshold to what a test can wait (test_not_ready
#: reads them back from dsx-reconcile's step, where the chart puts them).
CHART_VALUES = [
    "--set",
    "sentinel.enabled=false",
    "--set",
    "remediate.repairTemplate.name=dsx-repair-webhook",
    "--set-json",
    'sentinel.overrides={"entries": [{"check": "not-ready", "code": "ready-unknown", "threshold": 20}]}',
]
#: What the Events tier adds to them: the chart's EventSource and Sensor.
EVENTS_VALUES = ["--set", "events.enabled=true"]
ARGO_EVENTS_NAMESPACE = "argo-events"
ARGO_EVENTS_MODULE = "github.com/argoproj/argo-events"
#: The EventBus the chart's EventSource and Sensor use (``events.eventBusName`` empty: Argo Events' default).
EVENT_BUS = "default"
#: The JetStream stream an Argo Events bus keeps its events in (argo-events ``v1alpha1.JetStreamStreamName``).
EVENT_STREAM = "default"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _subnet_free(third: int) -> bool:
    out = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    return f" 10.244.{third}." not in out


@dataclass
class State:
    """What ``up`` started, kept in ``DIR/state.json`` so ``down`` (in another process) can stop it."""

    processes: dict[str, int] = field(default_factory=dict)
    bridge: str = ""
    subnet: int = -1
    apiserver_port: int = 0
    etcd_port: int = 0
    nats_port: int = 0
    nats_monitor_port: int = 0

    @classmethod
    def load(cls, path: Path) -> State:
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, indent=2, sort_keys=True))


class Cluster:
    """One control plane rooted at ``dir``; :meth:`up` and :meth:`down` are what the CLI and the pytest
    session fixture both call."""

    def __init__(
        self,
        dir: Path,
        *,
        nodes: int = 4,
        racks: int = 2,
        gpus: int = DEFAULT_GPUS,
        events: bool = True,
        log: Any = print,
    ) -> None:
        self.dir = dir.resolve()
        self.nodes = nodes
        self.racks = racks
        self.gpus = gpus
        self.events = events
        self.log = log
        self.state_path = self.dir / "state.json"
        self.state = State.load(self.state_path)
        self.bin: Path = Path()

    # ---------------------------------------------------------------------------------------- paths

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def gateway(self) -> str:
        return f"10.244.{self.state.subnet}.1"

    @property
    def server(self) -> str:
        return f"https://{self.gateway}:{self.state.apiserver_port}"

    def path_entries(self) -> list[str]:
        return [str(self.bin), str(TOOLS)]

    def env(self) -> dict[str, str]:
        """KUBECONFIG and PATH for argo, kubectl and helm against this cluster."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": os.pathsep.join([*self.path_entries(), os.environ.get("PATH", "")]),
        }

    def exports(self) -> str:
        path = os.pathsep.join([*self.path_entries(), "$PATH"])
        return f"export KUBECONFIG={self.kubeconfig}\nexport PATH={path}\n"

    # ------------------------------------------------------------------------------------------ up

    def up(self) -> None:
        for what, path in (("the checkout", ROOT), ("its Python environment", Path(sys.prefix).resolve())):
            if path.is_relative_to("/tmp"):
                raise RuntimeError(
                    f"{what} ({path}) is under /tmp, which every pod's containers get a private copy of "
                    "(tests/e2e/container.py): the pods would not find dsx's code; clone it elsewhere"
                )
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        if self.state.processes:
            raise RuntimeError(f"{self.dir}: a cluster is already up here (run down first)")
        self.bin = build.build(build.CORE | (build.EVENTS if self.events else set()), log=self.log)
        subprocess.run([str(ROOT / ".ci" / "fetch-helm")], check=True, capture_output=True)
        started = time.monotonic()
        try:
            self._network()
            make_pki(self.pki, [self.gateway, "127.0.0.1", "10.96.0.1"])
            self._kubeconfigs()
            self._etcd()
            self._apiserver()
            self._controllers()
            self._argo()
            if self.events:
                self._nats()
                self._argo_events()
            self._kubelet()
            self._chart()
            if self.events:
                self._events_running()
        except BaseException:
            self.down()
            raise
        self.log(f"control plane up in {time.monotonic() - started:.0f}s ({self.server})")

    def _network(self) -> None:
        third = next((n for n in range(200, 250) if _subnet_free(n)), None)
        if third is None:
            raise RuntimeError("no free 10.244.N.0/24 subnet for the pod bridge")
        bridge = f"dsxe2e{third}"
        subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
        self.state.bridge, self.state.subnet = bridge, third
        self.state.apiserver_port = _free_port()
        self.state.etcd_port = _free_port()
        self.state.save(self.state_path)
        subprocess.run(["ip", "addr", "add", f"{self.gateway}/24", "dev", bridge], check=True)
        subprocess.run(["ip", "link", "set", bridge, "up"], check=True)

    def _kubeconfig(self, stem: str, namespace: str = "default", server: str = "", name: str = "") -> Path:
        path = self.dir / f"{name or stem}.kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": server or self.server,
                        "certificate-authority": str(self.pki / "ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": stem,
                    "user": {
                        "client-certificate": str(self.pki / f"{stem}.crt"),
                        "client-key": str(self.pki / f"{stem}.key"),
                    },
                }
            ],
            "contexts": [
                {"name": "e2e", "context": {"cluster": "e2e", "user": stem, "namespace": namespace}}
            ],
            "current-context": "e2e",
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    def kubeconfig_for(self, server: str, user: str, name: str) -> Path:
        """A kubeconfig ``NAME.kubeconfig`` for the API server at ``server`` as the client certificate
        ``pki/USER.crt`` (:data:`tests.e2e.pki.CLIENTS`, or one :func:`tests.e2e.pki.sign_client` made)."""
        return self._kubeconfig(user, server=server, name=name)

    def _kubeconfigs(self) -> None:
        self._kubeconfig("admin", NAMESPACE).replace(self.kubeconfig)
        for stem in ("controller-manager", "scheduler", "kubelet"):
            self._kubeconfig(stem)
        self._kubeconfig("workflow-controller", ARGO_NAMESPACE)

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        logfile = open(self.dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            argv,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=self.dir,
        )
        logfile.close()
        self.state.processes[name] = proc.pid
        self.state.save(self.state_path)

    def _alive(self, name: str) -> None:
        pid = self.state.processes[name]
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = 0, 0
        if done:
            tail = (self.dir / "logs" / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"{name} exited ({status}):\n" + "\n".join(tail))

    def _wait(self, name: str, check: Any, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._alive(name)
            with contextlib.suppress(Exception):
                if check():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready after {timeout:.0f}s (see {self.dir}/logs/{name}.log)")
            time.sleep(0.5)

    def _etcd(self) -> None:
        port = self.state.etcd_port
        self._start(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--name",
                "e2e",
                "--data-dir",
                str(self.dir / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{_free_port()}",
                "--log-level",
                "warn",
                "--quota-backend-bytes",
                str(2 * 1024**3),
            ],
        )
        self._wait(
            "etcd", lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200
        )

    def _https_ok(self, url: str) -> bool:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        with urllib.request.urlopen(url, context=context, timeout=3) as response:
            return bool(response.status == 200)

    @property
    def audit_log(self) -> Path:
        return self.dir / "logs" / "audit.jsonl"

    def _audit_policy(self) -> Path:
        path = self.dir / "audit-policy.json"
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {"level": "Metadata", "userGroups": [f"system:serviceaccounts:{NAMESPACE}"]},
                {"level": "None"},
            ],
        }
        path.write_text(json.dumps(policy))
        return path

    def _apiserver(self) -> None:
        self._start(
            "kube-apiserver",
            [
                *self._apiserver_argv(self.state.apiserver_port, "apiserver-certs"),
                # Every request of the service accounts in the namespaces dsx uses, with its verdict: the
                # RBAC tests read what each account asked for and whether it was allowed.
                f"--audit-policy-file={self._audit_policy()}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",
            ],
        )
        self._wait("kube-apiserver", lambda: self._https_ok(f"{self.server}/readyz"), timeout=180)

    @contextlib.contextmanager
    def apiserver(self, name: str, *flags: str) -> Iterator[str]:
        """A second API server on the same etcd, as an HA control plane has, with ``flags`` added (a short
        ``--event-ttl``, or ``--etcd-prefix`` for a cluster of its own): its URL while the block runs;
        stopped when it ends. It keeps no audit log."""
        port = _free_port()
        with self.running(name, [*self._apiserver_argv(port, f"{name}-certs"), *flags]):
            url = f"https://{self.gateway}:{port}"
            self._wait(name, lambda: self._https_ok(f"{url}/readyz"), timeout=180)
            yield url

    @contextlib.contextmanager
    def running(self, name: str, argv: list[str]) -> Iterator[None]:
        """``argv`` running as the process ``name`` (logged in ``logs/NAME.log``, stopped by :meth:`down`
        too) while the block runs."""
        self._start(name, argv)
        try:
            yield
        finally:
            self._stop(self.state.processes.pop(name), grace=10)
            self.state.save(self.state_path)

    def _apiserver_argv(self, port: int, cert_dir: str) -> list[str]:
        pki = self.pki
        return [
            str(self.bin / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.state.etcd_port}",
            f"--bind-address={self.gateway}",
            f"--advertise-address={self.gateway}",
            f"--secure-port={port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--authorization-mode=Node,RBAC",
            # The default plugins (NamespaceLifecycle, LimitRanger, ServiceAccount, PodSecurity,
            # Priority, DefaultTolerationSeconds, ResourceQuota, the webhooks...) and NodeRestriction,
            # as kubeadm has them.
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--cert-dir={self.dir / cert_dir}",
            "--profiling=false",
        ]

    def _controllers(self) -> None:
        pki = self.pki
        self._start(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                f"--kubeconfig={self.dir / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={self.dir / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={self.dir / 'controller-manager.kubeconfig'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={_free_port()}",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
            ],
        )
        self._start(
            "kube-scheduler",
            [
                str(self.bin / "kube-scheduler"),
                f"--kubeconfig={self.dir / 'scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={self.dir / 'scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={self.dir / 'scheduler.kubeconfig'}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={_free_port()}",
            ],
        )
        # The root-CA publisher writes kube-root-ca.crt into every namespace: pods' token volumes need it.
        self._wait(
            "kube-controller-manager",
            lambda: self.kubectl("get", "configmap", "kube-root-ca.crt", "-n", "default"),
        )

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [str(TOOLS / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def argo_tree(self) -> Path:
        return self.bin.parent / "src" / "argo-workflows" / "argo-workflows"

    def _argo(self) -> None:
        versions = build.read_versions()
        crds = self.argo_tree() / "manifests" / "base" / "crds" / "full"
        files = sorted(str(p) for p in crds.glob("argoproj.io_*.yaml"))
        self.kubectl("apply", "--server-side", *(f"-f={f}" for f in files))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        self.kubectl("create", "namespace", ARGO_NAMESPACE)
        # A namespace that enforces Pod Security "restricted" refuses Argo's init and wait containers
        # without a security context: the README's advice to operators, applied.
        executor = {
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "runAsNonRoot": True,
                "seccompProfile": {"type": "RuntimeDefault"},
            }
        }
        config = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "workflow-controller-configmap", "namespace": ARGO_NAMESPACE},
            # Its metrics on a port of its own (Argo's default, 9090, is any other service's too).
            "data": {"executor": json.dumps(executor), "metricsConfig": json.dumps({"port": _free_port()})},
        }
        self.kubectl("apply", "-f", "-", input=json.dumps(config))
        self._start(
            "workflow-controller",
            [
                str(self.bin / "workflow-controller"),
                f"--kubeconfig={self.dir / 'workflow-controller.kubeconfig'}",
                f"--executor-image={EXECUTOR_IMAGE.format(version=versions['ARGO_WORKFLOWS'])}",
                "--loglevel=info",
            ],
            env={"LEADER_ELECTION_DISABLE": "true", "DEFAULT_REQUEUE_TIME": "1s"},
        )

    def _kubelet(self) -> None:
        self._start(
            "kubelet",
            [
                sys.executable,
                "-m",
                "tests.e2e.kubelet",
                "--dir",
                str(self.dir / "kubelet"),
                "--kubeconfig",
                str(self.dir / "kubelet.kubeconfig"),
                "--bin",
                str(self.bin),
                "--bridge",
                self.state.bridge,
                "--gateway",
                self.gateway,
                "--apiserver-port",
                str(self.state.apiserver_port),
                "--ca",
                str(self.pki / "ca.crt"),
                "--nodes",
                str(self.nodes),
                "--racks",
                str(self.racks),
                "--gpus",
                str(self.gpus),
            ],
            env={"PYTHONPATH": str(ROOT)},
        )

        def ready() -> bool:
            nodes = json.loads(self.kubectl("get", "nodes", "-o", "json"))["items"]
            ready = [
                n
                for n in nodes
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
                )
            ]
            return len(ready) == self.nodes

        self._wait("kubelet", ready)

    def _chart(self) -> None:
        self.kubectl("create", "namespace", NAMESPACE)
        self.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
        if self.events:
            self._event_bus()
        proc = subprocess.run(
            [
                str(TOOLS / "helm"),
                "install",
                "dsx",
                str(ROOT / "charts" / "dsx"),
                "-n",
                NAMESPACE,
                *CHART_VALUES,
                *(EVENTS_VALUES if self.events else []),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **self.env()},
        )
        if proc.returncode != 0:
            raise RuntimeError(f"helm install: {proc.stderr.strip()}")

    # ------------------------------------------------------------------------------ Argo Events

    @property
    def nats_url(self) -> str:
        return f"nats://{self.gateway}:{self.state.nats_port}"

    def _nats(self) -> None:
        """The EventBus's JetStream server, a host process on the bridge's address.

        Why an exotic bus and not Argo Events' own ``jetstream`` one: for that the controller makes a
        StatefulSet of nats pods behind a Service and hands the pods the URL
        ``nats://<service>.<namespace>.svc:4222`` (argo-events v1.9.11
        ``pkg/reconciler/eventbus/installer/jetstream.go:120``), which needs cluster DNS and a Service
        proxy this tier has neither of; ``jetstreamExotic`` takes a URL as given and deploys nothing
        (``pkg/reconciler/eventbus/installer/exotic_jetstream.go:32``, "Skip deployment because of using
        exotic config"). TLS, because every JetStream client of Argo Events connects with
        ``nats.Secure`` (``pkg/eventbus/jetstream/base/jetstream.go:80``: a server without TLS is refused,
        nats.go's "secure connection not available"), as its own bus serves it with a self-signed
        certificate (``jetstream.go:560``); the clients skip verification, as there.
        """
        sign_server(self.pki, "nats", "dsx-e2e-nats", [self.gateway])
        self.state.nats_port = _free_port()
        self.state.nats_monitor_port = _free_port()
        self.state.save(self.state_path)
        config = self.dir / "nats.conf"
        store = self.dir / "nats"
        config.write_text(
            "\n".join(
                [
                    f'listen: "{self.gateway}:{self.state.nats_port}"',
                    f'http: "127.0.0.1:{self.state.nats_monitor_port}"',
                    'server_name: "dsx-e2e"',
                    f'jetstream {{ store_dir: "{store}", max_memory_store: 256MB, max_file_store: 1GB }}',
                    f'tls {{ cert_file: "{self.pki / "nats.crt"}", key_file: "{self.pki / "nats.key"}" }}',
                    "",
                ]
            )
        )
        self._start("nats-server", [str(self.bin / "nats-server"), "-c", str(config)])
        self._wait("nats-server", lambda: bool(self.jetstream().get("config")))

    def jetstream(self, query: str = "") -> dict[str, Any]:
        """The JetStream server's report (``/jsz``): streams and consumers with ``query`` (e.g.
        ``streams=true&consumers=true``)."""
        url = f"http://127.0.0.1:{self.state.nats_monitor_port}/jsz" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url, timeout=3) as response:
            report: dict[str, Any] = json.loads(response.read())
        return report

    def _argo_events(self) -> None:
        """Argo Events as its release installs it: its own ``manifests/install.yaml`` (CRDs, the
        controller's account, cluster role and config, the controller Deployment) applied into
        ``argo-events``; the process kubelet runs the controller's pod, and those of the EventSource and
        Sensor Deployments it makes, from the built ``argo-events`` (the image's entrypoint)."""
        install = build.module_dir("ARGO_EVENTS", ARGO_EVENTS_MODULE) / "manifests" / "install.yaml"
        self.kubectl("create", "namespace", ARGO_EVENTS_NAMESPACE)
        self.kubectl("apply", "--server-side", "-f", str(install))
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *(f"crd/{n}.argoproj.io" for n in ("eventbus", "eventsources", "sensors")),
        )

    def _event_bus(self) -> None:
        bus = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "EventBus",
            "metadata": {"name": EVENT_BUS, "namespace": NAMESPACE},
            "spec": {
                "jetstreamExotic": {
                    "url": self.nats_url,
                    # One server: one replica (Argo Events' default stream config asks for three).
                    "streamConfig": "maxAge: 1h\nreplicas: 1\nduplicates: 300s\n",
                }
            },
        }
        self.kubectl("apply", "-f", "-", input=json.dumps(bus))

    def _events_running(self) -> None:
        """Wait for the Argo Events controller and the pods of the chart's EventSource and Sensor."""

        def running(namespace: str, selector: str) -> bool:
            pods = json.loads(self.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json"))
            return any(p["status"].get("phase") == "Running" for p in pods["items"])

        for namespace, selector in (
            (ARGO_EVENTS_NAMESPACE, "app=controller-manager"),
            (NAMESPACE, "eventsource-name=dsx-nodes"),
            (NAMESPACE, "sensor-name=dsx-remediate"),
        ):
            self._wait("kubelet", lambda n=namespace, s=selector: running(n, s), timeout=180)

        def subscribed() -> bool:
            """The Sensor reads the bus: its durable consumer exists on the stream of the events (it reads
            only what arrives after it subscribed)."""
            report = self.jetstream("streams=true&consumers=true")
            streams = [s for a in report.get("account_details") or [] for s in a.get("stream_detail") or []]
            return any(s["name"] == EVENT_STREAM and s.get("consumer_detail") for s in streams)

        self._wait("nats-server", subscribed, timeout=120)

    # ---------------------------------------------------------------------------------------- down

    def down(self) -> None:
        """Stop what :meth:`up` started: the kubelet first (it stops its pods), then the rest in reverse."""
        for name in reversed(list(self.state.processes)):
            self._stop(self.state.processes[name], grace=30 if name == "kubelet" else 10)
        self.state.processes = {}
        for ns in _pod_namespaces(self.state.bridge):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        if self.state.bridge:
            subprocess.run(["ip", "link", "delete", self.state.bridge], capture_output=True)
            self.state.bridge = ""
        if self.dir.exists():
            self.state.save(self.state_path)

    @staticmethod
    def _stop(pid: int, grace: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _pod_namespaces(bridge: str) -> Iterator[str]:
    """The network namespaces the kubelet made for pods on ``bridge`` (named after it)."""
    if not bridge:
        return
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(f"{bridge}-"):
            yield name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--dir", type=Path, required=True, help="where the cluster keeps everything")
    parser.add_argument(
        "--no-events",
        action="store_true",
        help="without the Events tier (Argo Events, its JetStream bus, the chart's EventSource and Sensor)",
    )
    args = parser.parse_args(argv)
    cluster = Cluster(args.dir, events=not args.no_events, log=lambda line: print(line, file=sys.stderr))
    if args.action == "down":
        cluster.down()
        return 0
    try:
        cluster.up()
    except build.BuildError as exc:
        print(f"dsx e2e cluster: {exc}", file=sys.stderr)
        return 3
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"dsx e2e cluster: {exc}", file=sys.stderr)
        return 3
    sys.stdout.write(cluster.exports())
    return 0


if __name__ == "__main__":
    sys.exit(main())

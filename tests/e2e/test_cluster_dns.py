"""The process kubelet's cluster DNS, and the files it mounts at a pod's ``/etc/hosts`` and resolv.conf.

No cluster here: the DNS answers real UDP queries on the loopback, the files are written for pods that
are never run. The e2e tier holds the same to the real control plane (``test_kubelet.py``).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dnslib
import pytest

from tests.e2e.kubelet import ClusterDns, Network, PodWorker, pod_dns_names

FQDN = "peer-0.peers.gpu-ops.svc.cluster.local"


@pytest.fixture
def dns() -> tuple[Network, int]:
    network = Network("dsxdns0", "127.0.0.1")
    network.publish("uid-1", "10.9.0.7", pod_dns_names("10.9.0.7", "gpu-ops", "peer-0", "peers"))
    return network, ClusterDns(
        network, lambda namespace, name: (namespace, name) == ("gpu-ops", "peers"), port=0
    ).start()


def _ask(port: int, name: str, kind: str) -> dnslib.DNSRecord:
    query = dnslib.DNSRecord.question(name, kind)
    return dnslib.DNSRecord.parse(query.send("127.0.0.1", port, timeout=2))


def test_a_pod_behind_a_headless_service_is_found_by_name_and_by_address(dns: tuple[Network, int]) -> None:
    _, port = dns
    found = _ask(port, FQDN, "A")
    assert found.header.rcode == dnslib.RCODE.NOERROR
    assert [str(rr.rdata) for rr in found.rr] == ["10.9.0.7"]
    back = _ask(port, "7.0.9.10.in-addr.arpa", "PTR")
    assert [str(rr.rdata) for rr in back.rr] == [FQDN + "."]
    pod = _ask(port, "10-9-0-7.gpu-ops.pod.cluster.local", "A")
    assert [str(rr.rdata) for rr in pod.rr] == ["10.9.0.7"]


def test_every_other_question_is_answered_at_once(dns: tuple[Network, int]) -> None:
    _, port = dns
    ipv6 = _ask(port, FQDN, "AAAA")
    assert (ipv6.header.rcode, ipv6.rr) == (dnslib.RCODE.NOERROR, [])
    for name, kind in [("peer-0.peers", "A"), ("pypi.org", "A"), ("250.250.244.10.in-addr.arpa", "PTR")]:
        answer = _ask(port, name, kind)
        assert (answer.header.rcode, answer.rr) == (dnslib.RCODE.NXDOMAIN, []), name


def test_a_withdrawn_pod_is_no_longer_found(dns: tuple[Network, int]) -> None:
    network, port = dns
    network.withdraw("uid-1")
    assert _ask(port, FQDN, "A").header.rcode == dnslib.RCODE.NXDOMAIN
    assert _ask(port, "7.0.9.10.in-addr.arpa", "PTR").header.rcode == dnslib.RCODE.NXDOMAIN


def test_without_its_headless_service_a_pod_is_found_by_its_pod_name_alone() -> None:
    network = Network("dsxdns0", "127.0.0.1")
    network.publish("uid-1", "10.9.0.7", pod_dns_names("10.9.0.7", "gpu-ops", "peer-0", "peers"))
    asked: list[tuple[str, str]] = []
    port = ClusterDns(network, lambda ns, name: asked.append((ns, name)) or False, port=0).start()
    assert _ask(port, FQDN, "A").header.rcode == dnslib.RCODE.NXDOMAIN
    assert _ask(port, "7.0.9.10.in-addr.arpa", "PTR").header.rcode == dnslib.RCODE.NXDOMAIN
    assert [str(rr.rdata) for rr in _ask(port, "10-9-0-7.gpu-ops.pod.cluster.local", "A").rr] == ["10.9.0.7"]
    assert asked == [("gpu-ops", "peers"), ("gpu-ops", "peers")]


def test_a_packet_that_is_not_a_query_gets_no_answer() -> None:
    server = ClusterDns(Network("dsxdns0", "127.0.0.1"), lambda namespace, name: True)
    assert server.answer(b"\x00garbage") is None
    reply = dnslib.DNSRecord.question(FQDN).reply().pack()
    assert server.answer(reply) is None


def _worker(tmp_path: Path, spec: dict[str, Any], netns: str = "dsxbr-1") -> PodWorker:
    kubelet: Any = SimpleNamespace(dir=tmp_path, network=Network("dsxbr", "10.9.0.1"))
    pod = {"metadata": {"name": "peer-0-abcde", "namespace": "gpu-ops", "uid": "uid-1"}, "spec": spec}
    worker = PodWorker(kubelet, pod, netns=netns, ip="10.9.0.7" if netns else "10.9.0.1")
    worker.hostname = spec.get("hostname") or "peer-0-abcde"
    worker.dir.mkdir(parents=True)
    return worker


def test_a_pods_hosts_file_names_itself_alone_as_the_kubelet_writes_it(tmp_path: Path) -> None:
    spec = {
        "hostname": "peer-0",
        "subdomain": "peers",
        "hostAliases": [{"ip": "10.1.1.1", "hostnames": ["a"]}],
    }
    lines = _worker(tmp_path, spec)._hosts_file().read_text().splitlines()
    assert "127.0.0.1\tlocalhost" in lines
    assert f"10.9.0.7\t{FQDN}\tpeer-0" in lines
    assert lines[-1] == "10.1.1.1\ta"
    node = _worker(tmp_path / "host", {"hostNetwork": True, "nodeName": "node-00"}, netns="")
    assert node._hosts_file().read_text().splitlines()[-1] == "10.9.0.1\tnode-00"


@pytest.mark.parametrize(
    ("spec", "netns", "expected"),
    [
        (
            {},
            "dsxbr-1",
            "search gpu-ops.svc.cluster.local svc.cluster.local cluster.local\n"
            "nameserver 10.9.0.1\noptions ndots:5\n",
        ),
        ({"hostNetwork": True}, "", None),
        (
            {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"},
            "",
            "search gpu-ops.svc.cluster.local svc.cluster.local cluster.local\n"
            "nameserver 10.9.0.1\noptions ndots:5\n",
        ),
        ({"dnsPolicy": "Default"}, "dsxbr-1", None),
        (
            {
                "dnsPolicy": "None",
                "dnsConfig": {"nameservers": ["1.2.3.4"], "options": [{"name": "ndots", "value": "2"}]},
            },
            "dsxbr-1",
            "nameserver 1.2.3.4\noptions ndots:2\n",
        ),
    ],
)
def test_a_pods_resolv_conf_follows_its_dns_policy(
    tmp_path: Path, spec: dict[str, Any], netns: str, expected: str | None
) -> None:
    path = _worker(tmp_path, spec, netns)._resolv_conf()
    assert (path.read_text() if path else None) == expected

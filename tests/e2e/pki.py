"""The control plane's own certificates, made with openssl: one CA, the API server's serving certificate,
client certificates for each component, and the service-account signing key."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["Client", "make_pki", "sign_client", "sign_server"]

#: (file stem, common name, organisation) of each client certificate.
Client = tuple[str, str, str]

CLIENTS: tuple[Client, ...] = (
    ("admin", "dsx-e2e-admin", "system:masters"),
    ("controller-manager", "system:kube-controller-manager", ""),
    ("scheduler", "system:kube-scheduler", ""),
    # The process kubelet plays every node; it acts as an administrator (one client for all its nodes).
    ("kubelet", "dsx-e2e-kubelet", "system:masters"),
    ("workflow-controller", "dsx-e2e-argo-controller", "system:masters"),
    ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _subject(cn: str, org: str) -> str:
    return f"/CN={cn}" + (f"/O={org}" if org else "")


def _sign(pki: Path, stem: str, subject: str, extensions: str) -> None:
    _openssl("genrsa", "-out", f"{stem}.key", "2048", cwd=pki)
    _openssl("req", "-new", "-key", f"{stem}.key", "-subj", subject, "-out", f"{stem}.csr", cwd=pki)
    (pki / f"{stem}.ext").write_text(extensions)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{stem}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-sha256",
        "-extfile",
        f"{stem}.ext",
        "-out",
        f"{stem}.crt",
        cwd=pki,
    )


def make_pki(pki: Path, addresses: list[str]) -> None:
    """Write the CA, the serving certificate for ``addresses`` and the names in-cluster clients use,
    every client of :data:`CLIENTS`, and ``sa.key``/``sa.pub``. Idempotent: a complete folder is kept."""
    pki.mkdir(parents=True, exist_ok=True)
    if (pki / "complete").exists():
        return
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=pki)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-subj",
        "/CN=dsx-e2e-ca",
        "-days",
        "30",
        "-sha256",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-out",
        "ca.crt",
        cwd=pki,
    )
    names = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    san = ",".join([*(f"DNS:{n}" for n in names), *(f"IP:{a}" for a in addresses)])
    _sign(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n",
    )
    for stem, cn, org in CLIENTS:
        _sign_client(pki, stem, cn, org)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    (pki / "complete").write_text("")


def sign_server(pki: Path, stem: str, common_name: str, addresses: list[str]) -> None:
    """A serving certificate ``STEM.crt``/``STEM.key`` signed by the CA of :func:`make_pki`, for
    ``addresses`` (IPs). Kept when present."""
    if (pki / f"{stem}.crt").exists():
        return
    san = ",".join(f"IP:{a}" for a in addresses)
    _sign(
        pki,
        stem,
        _subject(common_name, ""),
        f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n",
    )


def sign_client(pki: Path, stem: str, common_name: str, org: str = "") -> None:
    """A client certificate ``STEM.crt``/``STEM.key`` for the user ``common_name`` (in group ``org``),
    signed by the CA of :func:`make_pki`. Kept when present."""
    if not (pki / f"{stem}.crt").exists():
        _sign_client(pki, stem, common_name, org)


def _sign_client(pki: Path, stem: str, common_name: str, org: str) -> None:
    _sign(
        pki,
        stem,
        _subject(common_name, org),
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
    )

"""The control plane's certificates and ServiceAccount signing keys, made with the openssl CLI.

One CA signs the API server's serving certificate and the admin client certificate (group
``system:masters``); a separate RSA key pair signs ServiceAccount tokens. Everything lives in the
cluster's temporary directory and dies with it.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _signed(directory: Path, name: str, subject: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    key, csr, cert, ext = (directory / f"{name}{suffix}" for suffix in (".key", ".csr", ".crt", ".ext"))
    ext.write_text(extensions)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-subj", subject, "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-days", "2", "-sha256", "-extfile", str(ext), "-out", str(cert))
    return cert, key


def make_pki(directory: Path, addresses: list[str]) -> Pki:
    """CA, serving cert valid for ``addresses`` and the in-cluster names, admin cert, SA key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / "ca.key", directory / "ca.crt"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca_cert),
             "-days", "2", "-subj", "/CN=rollout-router-test-ca")
    names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
             "localhost"]
    san = ",".join([f"IP:{a}" for a in addresses] + [f"DNS:{n}" for n in names])
    server = _signed(directory, "apiserver", "/CN=kube-apiserver", (ca_cert, ca_key),
                     f"subjectAltName={san}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
    admin = _signed(directory, "admin", "/O=system:masters/CN=kubernetes-admin", (ca_cert, ca_key),
                    "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
    sa_key, sa_pub = directory / "sa.key", directory / "sa.pub"
    _openssl("genrsa", "-out", str(sa_key), "2048")
    _openssl("rsa", "-in", str(sa_key), "-pubout", "-out", str(sa_pub))
    return Pki(ca_cert, ca_key, server[0], server[1], admin[0], admin[1], sa_key, sa_pub)


def kubeconfig(path: Path, server: str, pki: Pki) -> Path:
    """An admin kubeconfig (client certificate) for kubectl, helm, the tests and the controllers."""
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: realk8s
  cluster: {{server: "{server}", certificate-authority: "{pki.ca_cert}"}}
users:
- name: admin
  user: {{client-certificate: "{pki.admin_cert}", client-key: "{pki.admin_key}"}}
contexts:
- name: admin@realk8s
  context: {{cluster: realk8s, user: admin, namespace: default}}
current-context: admin@realk8s
""")
    return path

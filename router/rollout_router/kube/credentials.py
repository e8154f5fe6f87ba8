"""Who we are and where the API is: the in-cluster service account, else KUBECONFIG (or ~/.kube/config).

In a pod the service account's files are read directly (the router image carries
no Kubernetes client). Out of a cluster the ``kubernetes`` package loads the
kubeconfig, since it knows every form (certificate data, exec plugins, auth
providers); requests always go through ``client`` on aiohttp. Tokens are re-read
per request: in-cluster tokens rotate and exec plugins refresh them.
"""
from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class CredentialsError(RuntimeError):
    """No usable credentials; the message says what was looked for."""


@dataclass(frozen=True)
class Credentials:
    """The API server's URL, how to trust it, and how to present ourselves to it."""

    server: str
    ca_path: str | None
    insecure: bool
    certificate_path: str | None
    private_key_path: str | None
    authorization: Callable[[], str | None]  # the Authorization header's value, re-read on every call

    def ssl_context(self) -> ssl.SSLContext | bool:
        """TLS settings for aiohttp; False for a plain-HTTP server (a local emulator or proxy)."""
        if not self.server.startswith("https://"):
            return False
        context = ssl.create_default_context(cafile=None if self.insecure else self.ca_path)
        if self.insecure:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        if self.certificate_path:
            context.load_cert_chain(self.certificate_path, self.private_key_path)
        return context


def load(service_account: Path = SERVICE_ACCOUNT) -> Credentials:
    """In-cluster service account, else KUBECONFIG (read at call time, not at import: tests set it late).

    Blocking (it reads files and may run an exec plugin): call it through ``asyncio.to_thread``.
    """
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    token = service_account / "token"
    if host and port and token.is_file():
        return in_cluster(host, port, service_account)
    return from_kubeconfig(os.environ.get("KUBECONFIG"))


def in_cluster(host: str, port: str, service_account: Path) -> Credentials:
    """The pod's own service account, as the kubelet mounts it."""
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    token = service_account / "token"
    return Credentials(server=server, ca_path=str(service_account / "ca.crt"), insecure=False,
                       certificate_path=None, private_key_path=None,
                       authorization=lambda: f"Bearer {token.read_text().strip()}")


def from_kubeconfig(path: str | None) -> Credentials:
    try:
        from kubernetes import client, config  # only out of a cluster: kubeconfig has many forms
    except ImportError:
        raise CredentialsError("not in a pod (no service account token), and reading a kubeconfig needs the "
                               "kubernetes package: pip install 'rollout-router[kubeconfig]'") from None
    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=path, client_configuration=configuration)
    except (config.ConfigException, OSError) as error:
        raise CredentialsError(f"not in a pod, and no usable kubeconfig ({path or '~/.kube/config'}): {error}") from None
    return Credentials(server=configuration.host.rstrip("/"), ca_path=configuration.ssl_ca_cert,
                       insecure=not configuration.verify_ssl, certificate_path=configuration.cert_file,
                       private_key_path=configuration.key_file,
                       authorization=lambda: configuration.get_api_key_with_prefix(
                           "BearerToken", alias="authorization") or None)

"""Who we are and where the API is: the in-cluster service account, else KUBECONFIG (or ~/.kube/config).

The ``kubernetes`` package only loads the credentials (it knows every kubeconfig
form: certificate data, exec plugins, auth providers); requests go through
``client`` on aiohttp. Tokens are re-read per request, since in-cluster tokens
rotate and exec plugins refresh them.
"""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Credentials:
    """The API server's URL, how to trust it, and how to present ourselves to it."""

    server: str
    ca_path: str | None
    insecure: bool
    certificate_path: str | None
    private_key_path: str | None
    configuration: Any  # the kubernetes client's Configuration: the source of (refreshed) tokens

    def authorization(self) -> str | None:
        """The Authorization header's value, e.g. ``Bearer <token>``; re-read on every call."""
        return self.configuration.get_api_key_with_prefix("BearerToken", alias="authorization") or None

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


def load() -> Credentials:
    """In-cluster service account, else KUBECONFIG (read at call time, not at import: tests set it late).

    Blocking (it reads files and may run an exec plugin): call it through ``asyncio.to_thread``.
    """
    from kubernetes import client, config  # heavy; only routers with discovery (and the operator) pay for it

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    return Credentials(server=configuration.host.rstrip("/"), ca_path=configuration.ssl_ca_cert,
                       insecure=not configuration.verify_ssl, certificate_path=configuration.cert_file,
                       private_key_path=configuration.key_file, configuration=configuration)

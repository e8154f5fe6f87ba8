"""``rollout-router operator``: run the kopf operator for RolloutRouter resources."""
from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import secrets
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from rollout_router import usage
from rollout_router.kube import credentials

from .api_retries import OneLinePerRetry
from .spec import DEFAULT_IMAGE

if TYPE_CHECKING:  # kopf (the [operator] extra) is imported only to run, so --help works without it
    import kopf

IMAGE_ENV = "ROLLOUT_ROUTER_IMAGE"
ALLOWED_IMAGES_ENV = "ROLLOUT_ROUTER_ALLOWED_IMAGES"
TOKEN_KEY_ENV = "ROLLOUT_ROUTER_ADMIN_TOKEN_KEY_FILE"
LOG_LEVELS = ["debug", "info", "warning", "error", "critical"]
METRICS_PORT = 8080  # as controller-runtime operators: metrics on 8080, health on 8081


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], metavar="NS",
                       help="Watch RolloutRouters in NS (repeatable).")
    scope.add_argument("--all-namespaces", "-A", action="store_true",
                       help="Watch RolloutRouters in every namespace (the default without --namespace).")
    parser.add_argument("--status-interval", type=usage.number(positive=True), default=10.0, metavar="SECONDS",
                        help="How often router pods' /status is read into the resource status (default 10).")
    parser.add_argument("--liveness", metavar="URL", default=None, type=_liveness,
                        help="Serve kopf's liveness probe, e.g. http://0.0.0.0:8081/healthz (default: none).")
    parser.add_argument("--metrics-port", type=usage.port_or_zero, default=METRICS_PORT, metavar="PORT",
                        help=f"Serve Prometheus metrics at /metrics on PORT (default {METRICS_PORT}; 0: off).")
    parser.add_argument("--metrics-host", default="0.0.0.0", metavar="ADDR",
                        help="Address the metrics endpoint listens on (default 0.0.0.0).")
    parser.add_argument("--router-image", default=os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE, metavar="IMAGE",
                        help=f"Image of router pods whose spec.router.image is unset (default: ${IMAGE_ENV}, "
                             f"else {DEFAULT_IMAGE}).")
    parser.add_argument("--allowed-image", action=Replacing, dest="allowed_images", metavar="PATTERN",
                        default=_env_list(ALLOWED_IMAGES_ENV),
                        help="Router images RolloutRouters may name in spec.router.image, as shell patterns "
                             "(e.g. 'registry.example.com/rollout-router:*'; repeatable; default: "
                             f"${ALLOWED_IMAGES_ENV}, comma-separated; unset: any image).")
    parser.add_argument("--admin-token-key-file", type=Path, metavar="PATH",
                        default=Path(os.environ[TOKEN_KEY_ENV]) if os.environ.get(TOKEN_KEY_ENV) else None,
                        help="Secret key the routers' admin tokens are derived from, one per RolloutRouter (the "
                             f"Helm chart mounts one; default: ${TOKEN_KEY_ENV}; unset: a random key per operator "
                             "process, so tokens change when the operator restarts).")
    parser.add_argument("--verbose", "-v", action="store_true", help="Debug logging (the same as --log-level debug).")
    parser.add_argument("--log-level", type=str.lower, default="info", choices=LOG_LEVELS,
                        help="Log level (default info).")





def _liveness(text: str) -> str:
    """An argparse type: kopf's liveness endpoint, http://HOST:PORT/PATH (kopf serves plain HTTP only)."""
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None or not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"must be http://HOST:PORT/PATH with a port 1-65535 (e.g. "
                                         f"http://0.0.0.0:8081/healthz), got {text!r}")
    return text


def _unbindable(url: str) -> str | None:
    """Why the liveness endpoint's address cannot be listened on (taken, or not this machine's), before kopf tries
    it inside its run (a traceback there)."""
    parts = urlsplit(url)
    try:
        socket.create_server((parts.hostname or "", parts.port or 0)).close()
    except OSError as error:
        return error.strerror or str(error)
    return None


class Replacing(argparse.Action):
    """``append``, but the first flag replaces the default (the environment's list) instead of adding to it: an
    allow-list given on the command line is the whole list."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        items = getattr(namespace, self.dest)
        setattr(namespace, self.dest, [*([] if items is self.default else items), values])


def token_key(path: Path | None) -> bytes:
    """The key of --admin-token-key-file; a random one without it. OSError/ValueError: a bad file."""
    if path is None:
        logging.getLogger(__name__).warning(
            "no --admin-token-key-file: the routers' admin tokens are derived from a random key and change "
            "when the operator restarts (docs/security.md)")
        return secrets.token_bytes(32)
    key = path.read_bytes().strip()
    if len(key) < 16:
        raise ValueError("the key must hold at least 16 bytes")
    return key


def _env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


class ApiBackoffs:
    """kopf's delays between retries of its own API calls: growing to 30 s, then 30 s for ever.

    Without a length, kopf never gives up (a tuple's length is its number of retries, after which
    the error escalates and the operator stops), so an API server that is down for minutes is
    waited out and the watches, handlers and timers carry on when it is back.
    """

    def __iter__(self) -> Iterator[float]:
        return itertools.chain((1, 2, 5, 10, 20), itertools.repeat(30))


def connection_info(creds: credentials.Credentials) -> kopf.ConnectionInfo:
    """kopf's form of the shared credentials; kopf logs in again (so re-reads a rotated token) on a 401."""
    import kopf
    scheme, _, token = (creds.authorization() or "").partition(" ")
    return kopf.ConnectionInfo(server=creds.server, ca_path=creds.ca_path, insecure=creds.insecure,
                               scheme=scheme or None, token=token or None, certificate_path=creds.certificate_path,
                               private_key_path=creds.private_key_path)


def _check_credentials() -> str | None:
    """Why the API cannot be reached with this environment's credentials, in one line; None if it can."""
    try:
        credentials.load()
    except Exception as error:  # noqa: BLE001  (the kubernetes package raises several kinds for a bad config)
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        return (f"no Kubernetes credentials: not in a pod with a service account, and {where}: "
                f"{str(error).strip() or type(error).__name__}")
    return None


def run(args: argparse.Namespace) -> int:
    problem = _check_credentials()
    if problem:
        print(f"rollout-router operator: {problem}", file=sys.stderr)
        return 2
    level = "debug" if args.verbose else args.log_level
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(OneLinePerRetry(ApiBackoffs()))
    try:
        key = token_key(args.admin_token_key_file)
    except (OSError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        print(f"rollout-router operator: --admin-token-key-file {args.admin_token_key_file}: {reason}", file=sys.stderr)
        return 2
    import kopf

    from . import kube, metrics
    from .handlers import register

    registry = kopf.OperatorRegistry()
    register(registry, args.status_interval, args.router_image, args.allowed_images, key)
    if args.metrics_port:
        try:
            metrics.serve(args.metrics_host, args.metrics_port)
        except OSError as error:
            print(f"rollout-router operator: --metrics-host {args.metrics_host} --metrics-port {args.metrics_port}: "
                  f"{error.strerror}", file=sys.stderr)
            return 2
    if args.liveness is not None and (refused := _unbindable(args.liveness)) is not None:
        print(f"rollout-router operator: --liveness {args.liveness}: {refused}", file=sys.stderr)
        return 2

    @kopf.on.login(registry=registry)
    async def login(**_: object) -> kopf.ConnectionInfo:
        """The credentials the operator's own calls use (a custom registry has no default login)."""
        return connection_info(await asyncio.to_thread(credentials.load))

    @kopf.on.cleanup(registry=registry)
    async def disconnect(**_: object) -> None:
        await kube.close()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: object) -> None:
        settings.posting.level = logging.WARNING  # Kubernetes events for warnings and errors only
        settings.networking.error_backoffs = ApiBackoffs()  # dropped watches, 5xx, 429: retried for ever
        settings.watching.server_timeout = 270
        # No namespace listing nor CRD watching: exact --namespace names need neither, and the RBAC grants neither.
        settings.scanning.disabled = True
        settings.persistence.finalizer = "rolloutrouter.dev/children"

    kopf.run(registry=registry, standalone=True, namespaces=args.namespace,
             clusterwide=not args.namespace, liveness_endpoint=args.liveness)
    return 0

"""``rollout-router operator``: run the kopf operator for RolloutRouter resources."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os

import kopf

from rollout_router.kube import credentials

from . import kube, metrics
from .handlers import register
from .spec import DEFAULT_IMAGE

IMAGE_ENV = "ROLLOUT_ROUTER_IMAGE"
METRICS_PORT = 8080  # as controller-runtime operators: metrics on 8080, health on 8081


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], metavar="NS",
                       help="Watch RolloutRouters in NS (repeatable).")
    scope.add_argument("--all-namespaces", "-A", action="store_true",
                       help="Watch RolloutRouters in every namespace (the default without --namespace).")
    parser.add_argument("--status-interval", type=float, default=10.0, metavar="SECONDS",
                        help="How often router pods' /status is read into the resource status (default 10).")
    parser.add_argument("--liveness", metavar="URL", default=None,
                        help="Serve kopf's liveness probe, e.g. http://0.0.0.0:8081/healthz.")
    parser.add_argument("--metrics-port", type=int, default=METRICS_PORT, metavar="PORT",
                        help=f"Serve Prometheus metrics at /metrics on PORT (default {METRICS_PORT}; 0: off).")
    parser.add_argument("--metrics-host", default="0.0.0.0", metavar="ADDR",
                        help="Address the metrics endpoint listens on (default 0.0.0.0).")
    parser.add_argument("--router-image", default=os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE, metavar="IMAGE",
                        help=f"Image of router pods whose spec.router.image is unset (default: ${IMAGE_ENV}, "
                             f"else {DEFAULT_IMAGE}).")
    parser.add_argument("--verbose", "-v", action="store_true", help="Debug logging.")


def connection_info(creds: credentials.Credentials) -> kopf.ConnectionInfo:
    """kopf's form of the shared credentials; kopf logs in again (so re-reads a rotated token) on a 401."""
    scheme, _, token = (creds.authorization() or "").partition(" ")
    return kopf.ConnectionInfo(server=creds.server, ca_path=creds.ca_path, insecure=creds.insecure,
                               scheme=scheme or None, token=token or None, certificate_path=creds.certificate_path,
                               private_key_path=creds.private_key_path)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registry = kopf.OperatorRegistry()
    register(registry, args.status_interval, args.router_image)
    if args.metrics_port:
        metrics.serve(args.metrics_host, args.metrics_port)

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
        settings.networking.error_backoffs = [1, 2, 5, 10, 20, 30]  # dropped watches, API 5xx
        settings.watching.server_timeout = 270
        settings.persistence.finalizer = "rolloutrouter.dev/children"

    kopf.run(registry=registry, standalone=True, namespaces=args.namespace,
             clusterwide=not args.namespace, liveness_endpoint=args.liveness)
    return 0

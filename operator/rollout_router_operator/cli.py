"""``rollout-router operator``: run the kopf operator for RolloutRouter resources."""
from __future__ import annotations

import argparse
import logging

import kopf

from .handlers import register


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
    parser.add_argument("--verbose", "-v", action="store_true", help="Debug logging.")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registry = kopf.OperatorRegistry()
    register(registry, args.status_interval)

    @kopf.on.login(registry=registry)
    def login(**kwargs: object) -> kopf.ConnectionInfo | None:
        """In-cluster service account, else KUBECONFIG (a custom registry has no default login)."""
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: object) -> None:
        settings.posting.level = logging.WARNING  # Kubernetes events for warnings and errors only
        settings.networking.error_backoffs = [1, 2, 5, 10, 20, 30]  # dropped watches, API 5xx
        settings.watching.server_timeout = 270
        settings.persistence.finalizer = "rolloutrouter.dev/children"

    kopf.run(registry=registry, standalone=True, namespaces=args.namespace,
             clusterwide=not args.namespace, liveness_endpoint=args.liveness)
    return 0

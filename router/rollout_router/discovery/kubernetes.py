"""Kubernetes pod discovery: keep the replica set equal to the Ready pods a selector matches.

``pod_endpoint`` (pod -> URL or None) and ``PodTracker`` (listings and events ->
replica set) are pure; ``run`` feeds them from ``kube.watching.follow``, which
lists once and then watches (resuming dropped watches, re-listing on 410).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from ..kube.backoff import BACKOFF_MIN, Backoff
from ..kube.client import Client
from ..kube.pods import container_port, is_ready
from ..kube.resources import PODS
from ..kube.selectors import matches, to_query
from ..kube.watching import Listing, follow
from ..replicas import DISCOVERED, STATIC, ReplicaSet
from ..settings import DiscoverySettings

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class Endpoint(NamedTuple):
    url: str
    grpc_target: str | None


def pod_endpoint(pod: dict, settings: DiscoverySettings) -> Endpoint | None:
    """The pod's replica entry, or None while it cannot serve (or its port cannot be resolved)."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or not is_ready(pod) or not matches(settings.selector, pod.get("metadata", {}).get("labels")):
        return None
    port = container_port(pod, settings.port)
    if port is None:
        log.warning("pod %s has no container port named %r; skipped", pod["metadata"].get("name"), settings.port)
        return None
    host = f"[{ip}]" if ":" in ip else ip
    grpc_port = container_port(pod, settings.grpc_port)
    return Endpoint(f"http://{host}:{port}", f"{host}:{grpc_port}" if grpc_port is not None else None)


class PodTracker:
    """Applies pod snapshots and watch events to a ``ReplicaSet``, touching only what changed."""

    def __init__(self, settings: DiscoverySettings, replicas: ReplicaSet):
        self.settings, self.replicas = settings, replicas
        self._pods: dict[str, Endpoint] = {}  # pod name -> endpoint, serving pods only
        # url -> grpc target, as last written to the set. It starts as what a previous watch left, so the
        # first listing removes what no longer matches.
        self._applied: dict[str, str | None] = {r.id: r.sources[DISCOVERED] for r in replicas.replicas(DISCOVERED)}

    def reset(self, pods: Iterable[dict]) -> None:
        """A full listing: pods not in it are gone."""
        self._pods = {}
        for pod in pods:
            self._store(pod)
        self._sync()
        self.replicas.replace((), STATIC)  # the pods take over from a static list (workers added by API stay)

    def apply(self, event_type: str, pod: dict) -> None:
        if event_type == "DELETED":
            self._pods.pop(pod["metadata"]["name"], None)
        else:
            self._store(pod)
        self._sync()

    def _store(self, pod: dict) -> None:
        name = pod["metadata"]["name"]
        endpoint = pod_endpoint(pod, self.settings)
        if endpoint is None:
            self._pods.pop(name, None)
        else:
            self._pods[name] = endpoint

    def _sync(self) -> None:
        wanted = {e.url: e.grpc_target for e in self._pods.values()}
        for url in self._applied.keys() - wanted.keys():
            self.replicas.remove(url, DISCOVERED)
            log.info("replica removed: %s", url)
        for url, grpc_target in wanted.items():
            if url not in self._applied or self._applied[url] != grpc_target:
                self.replicas.add(url, grpc_target, DISCOVERED)
                log.info("replica added: %s", url)
        self._applied = wanted


def resolve_namespace(settings: DiscoverySettings) -> str:
    """The settings' namespace, else POD_NAMESPACE, else the service account's namespace."""
    if settings.namespace:
        return settings.namespace
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    raise RuntimeError("discovery needs a namespace: set discovery.namespace or POD_NAMESPACE")


async def _connect(settings: DiscoverySettings, api: Client | None) -> tuple[Client, str]:
    """Credentials and namespace, retried with backoff: a router must not stay blind after a bad start."""
    backoff = Backoff(log, BACKOFF_MIN)
    while True:
        try:
            return api or await Client.connect(), resolve_namespace(settings)
        except Exception as error:  # noqa: BLE001 - any failure here is logged and retried
            await backoff.wait(f"pod discovery cannot start: {error}")


async def run(settings: DiscoverySettings, replicas: ReplicaSet, api: Client | None = None) -> None:
    """Keep ``replicas`` equal to the serving pods until cancelled; API errors back off and retry.

    A pod the tracker cannot read (no name, say) restarts the watch with a fresh
    listing rather than ending discovery. ``api`` is closed only if created here.
    """
    client, namespace = await _connect(settings, api)
    selector = to_query(settings.selector)
    tracker = PodTracker(settings, replicas)
    log.info("watching pods in %s matching %r at %s", namespace, selector, client.server)
    backoff = Backoff(log, BACKOFF_MIN)
    try:
        while True:
            try:
                async for change in follow(client, PODS, namespace, selector):
                    if isinstance(change, Listing):
                        tracker.reset(change.items)
                        backoff.reset()
                    elif change.type in ("ADDED", "MODIFIED", "DELETED"):
                        tracker.apply(change.type, change.object)
            except (ValueError, KeyError) as error:
                await backoff.wait(f"pod discovery: unreadable pod: {error!r}")
    finally:
        if api is None:
            await client.close()

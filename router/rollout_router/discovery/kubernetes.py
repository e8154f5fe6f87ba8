"""Kubernetes pod discovery: keep the replica set equal to the Ready pods a selector matches.

``pod_endpoint`` (pod -> URL or None) and ``PodTracker`` (listings and events ->
replica set) are pure; ``run`` feeds them from ``kube.watching.keep_watching``,
which lists once and then watches (resuming dropped watches, re-listing on 410).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NamedTuple

from ..kube.client import Client
from ..kube.pods import container_port, is_ready
from ..kube.resources import PODS
from ..kube.selectors import matches, to_query
from ..kube.watching import keep_watching, own_namespace
from ..replicas import DISCOVERED, STATIC, ReplicaSet
from ..settings import DiscoverySettings

log = logging.getLogger(__name__)


class Endpoint(NamedTuple):
    url: str
    grpc_target: str | None


def pod_endpoint(pod: dict, settings: DiscoverySettings) -> Endpoint | None:
    """The pod's replica entry, or None while it cannot serve (or its port cannot be resolved)."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or not is_ready(pod) or not matches(settings.selector, pod.get("metadata", {}).get("labels")):
        return None
    host = f"[{ip}]" if ":" in ip else ip
    if settings.port is None:  # gRPC only (vLLM's gRPC frontend): the replica is its gRPC address
        grpc_port = _port(pod, settings.grpc_port)
        return Endpoint(f"grpc://{host}:{grpc_port}", None) if grpc_port is not None else None
    port = _port(pod, settings.port)
    if port is None:
        return None
    grpc_port = container_port(pod, settings.grpc_port)
    return Endpoint(f"http://{host}:{port}", f"{host}:{grpc_port}" if grpc_port is not None else None)


def _port(pod: dict, port: int | str | None) -> int | None:
    """The pod's port by number or container port name; None (logged) when the pod has no such name."""
    number = container_port(pod, port)
    if number is None:
        log.warning("pod %s has no container port named %r; skipped", pod["metadata"].get("name"), port)
    return number


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
    return own_namespace(settings.namespace, "discovery.namespace", "discovery")


async def run(settings: DiscoverySettings, replicas: ReplicaSet, api: Client | None = None) -> None:
    """Keep ``replicas`` equal to the serving pods until cancelled; API errors back off and retry.

    A pod the tracker cannot read (no name, say) restarts the watch with a fresh
    listing rather than ending discovery. ``api`` is closed only if created here.
    """
    tracker = PodTracker(settings, replicas)
    await keep_watching("pod discovery", PODS, settings.namespace, "discovery.namespace",
                        to_query(settings.selector), tracker.reset, tracker.apply, api)

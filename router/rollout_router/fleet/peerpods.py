"""In a cluster: the router pods of one resource are the fleet's candidates (``--peer-selector``).

The Ready pods matching the selector (and those terminating while they run: ``admin_urls``), followed with the same list-then-watch
(``kube.watching.keep_watching``) that replica discovery uses; a pod is named by its
admin URL, ``http://<podIP>:<containerPort named "admin">``; a pod running ``serve --workers N`` is N members,
one per worker, at its container ports named ``fleet-0`` to ``fleet-<N-1>`` (its "admin" port is the parent's,
which answers for the pod and is not a member: ``multicore``).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from ..kube.client import Client
from ..kube.pods import container_port, is_ready
from ..kube.resources import PODS
from ..kube.watching import keep_watching
from ..listening import address

ADMIN_PORT_NAME = "admin"
WORKER_PORT_PREFIX = "fleet-"  # + the worker's index: a worker's admin port in a pod running several


def admin_urls(pod: dict) -> list[str]:
    """The pod's members' admin URLs, one per worker, else its "admin" port's: while it is Ready, and while it
    is terminating but still running, Ready or not (a router leaving its fleet still holds pins, pushes them and
    answers for them: dropped at its deletion, its peers would neither know it is leaving nor ask it first)."""
    status = pod.get("status") or {}
    ip = status.get("podIP")
    draining = bool(pod.get("metadata", {}).get("deletionTimestamp")) and status.get("phase") == "Running"
    if not ip or not (is_ready(pod) or draining):
        return []
    ports = _worker_ports(pod) or [p for p in [container_port(pod, ADMIN_PORT_NAME)] if p is not None]
    return [f"http://{address(ip, port)}" for port in ports]


def _worker_ports(pod: dict) -> list[int]:
    """The container ports named ``fleet-<index>``, by index."""
    found: dict[int, int] = {}
    for container in pod.get("spec", {}).get("containers", []):
        for port in container.get("ports") or []:
            name, number = str(port.get("name", "")), port.get("containerPort")
            index = name.removeprefix(WORKER_PORT_PREFIX)
            if index != name and index.isdigit() and isinstance(number, int):
                found[int(index)] = number
    return [found[index] for index in sorted(found)]


class PodPeers:
    """Pod name -> its members' admin URLs, for the Ready router pods; ``apply``/``reset`` return the URLs now."""

    def __init__(self) -> None:
        self._pods: dict[str, list[str]] = {}

    def reset(self, pods: Iterable[dict]) -> set[str]:
        self._pods = {}
        for pod in pods:
            self._store(pod)
        return self._urls()

    def apply(self, event_type: str, pod: dict) -> set[str]:
        if event_type == "DELETED":
            self._pods.pop(pod["metadata"]["name"], None)
        else:
            self._store(pod)
        return self._urls()

    def _urls(self) -> set[str]:
        return {url for urls in self._pods.values() for url in urls}

    def _store(self, pod: dict) -> None:
        name, urls = pod["metadata"]["name"], admin_urls(pod)
        if urls:
            self._pods[name] = urls
        else:
            self._pods.pop(name, None)


async def watch_peers(selector: str, namespace: str | None, on_peers: Callable[[set[str]], None],
                      api: Client | None = None) -> None:
    """Call ``on_peers`` with the Ready router pods' admin URLs whenever they change, until cancelled."""
    peers = PodPeers()
    await keep_watching("peer discovery", PODS, namespace, "--peer-namespace", selector,
                        lambda pods: on_peers(peers.reset(pods)),
                        lambda event_type, pod: on_peers(peers.apply(event_type, pod)), api)

"""In a cluster: the router pods of one resource are the fleet's candidates (``--peer-selector``).

The Ready pods matching the selector, followed with the same list-then-watch
(``kube.watching.keep_watching``) that replica discovery uses; a pod is named by its
admin URL, ``http://<podIP>:<containerPort named "admin">``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from ..kube.client import Client
from ..kube.pods import container_port, is_ready
from ..kube.resources import PODS
from ..kube.watching import keep_watching
from ..listening import address

ADMIN_PORT_NAME = "admin"


def admin_url(pod: dict) -> str | None:
    """The Ready pod's admin URL, or None while it is not a member."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or not is_ready(pod):
        return None
    port = container_port(pod, ADMIN_PORT_NAME)
    if port is None:
        return None
    return f"http://{address(ip, port)}"


class PodPeers:
    """Pod name -> admin URL of the Ready router pods; ``apply``/``reset`` return the URLs now."""

    def __init__(self) -> None:
        self._pods: dict[str, str] = {}

    def reset(self, pods: Iterable[dict]) -> set[str]:
        self._pods = {}
        for pod in pods:
            self._store(pod)
        return set(self._pods.values())

    def apply(self, event_type: str, pod: dict) -> set[str]:
        if event_type == "DELETED":
            self._pods.pop(pod["metadata"]["name"], None)
        else:
            self._store(pod)
        return set(self._pods.values())

    def _store(self, pod: dict) -> None:
        name, url = pod["metadata"]["name"], admin_url(pod)
        if url is None:
            self._pods.pop(name, None)
        else:
            self._pods[name] = url


async def watch_peers(selector: str, namespace: str | None, on_peers: Callable[[set[str]], None],
                      api: Client | None = None) -> None:
    """Call ``on_peers`` with the Ready router pods' admin URLs whenever they change, until cancelled."""
    peers = PodPeers()
    await keep_watching("peer discovery", PODS, namespace, "--peer-namespace", selector,
                        lambda pods: on_peers(peers.reset(pods)),
                        lambda event_type, pod: on_peers(peers.apply(event_type, pod)), api)

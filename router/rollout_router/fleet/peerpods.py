"""In a cluster: the router pods of one resource are the fleet's candidates (``--peer-selector``).

The Ready pods matching the selector, followed with the same list-then-watch
(``kube.watching.follow``) that replica discovery uses; a pod is named by its
admin URL, ``http://<podIP>:<containerPort named "admin">``.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

from ..kube.backoff import BACKOFF_MIN, Backoff
from ..kube.client import Client
from ..kube.pods import container_port, is_ready
from ..kube.resources import PODS
from ..kube.watching import Listing, follow
from ..listening import address

log = logging.getLogger(__name__)

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
    namespace = namespace or os.environ.get("POD_NAMESPACE")
    backoff = Backoff(log, BACKOFF_MIN)
    while True:
        try:
            client = api or await Client.connect()
            break
        except Exception as error:  # noqa: BLE001 - logged and retried: a router must not stay alone
            await backoff.wait(f"peer discovery cannot start: {error}")
    if not namespace:
        from ..discovery.kubernetes import SERVICE_ACCOUNT_NAMESPACE
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    peers = PodPeers()
    log.info("watching router pods in %s matching %r", namespace, selector)
    try:
        while True:
            try:
                async for change in follow(client, PODS, namespace, selector):
                    if isinstance(change, Listing):
                        on_peers(peers.reset(change.items))
                        backoff.reset()
                    elif change.type in ("ADDED", "MODIFIED", "DELETED"):
                        on_peers(peers.apply(change.type, change.object))
            except (ValueError, KeyError) as error:
                await backoff.wait(f"peer discovery: unreadable pod: {error!r}")
    finally:
        if api is None:
            await client.close()

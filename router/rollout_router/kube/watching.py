"""Follow a set of objects: list once, then watch, resuming each watch where the last one stopped.

A watch ends when the server's timeout passes or the connection drops; the
next one starts from the last resourceVersion seen (an event's or a
bookmark's), so nothing is listed again and nothing is missed. Only when the
API answers 410 Gone (that version is compacted away) is the set listed afresh.

``keep_watching`` is the one loop around it that pod discovery and the fleet's
peer pods both run: find the namespace and connect (retried with backoff: a
router must never stay blind or alone after a bad start), then follow for ever,
and close the client it made however it ends.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from .backoff import BACKOFF_MIN, Backoff
from .client import TRANSIENT, ApiError, Client
from .objects import list_objects
from .resources import Resource

log = logging.getLogger(__name__)
WATCH_SECONDS = 240  # the server ends each watch after this; the next resumes from the last resourceVersion
QUICK_END_SECONDS = 1.0  # a watch that ends sooner, having delivered nothing, is a problem: back off
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class Listing:
    """Every object that matches now: anything not in it is gone."""

    items: list[dict]


@dataclass(frozen=True)
class Event:
    """One change: ``type`` is ADDED, MODIFIED or DELETED."""

    type: str
    object: dict


async def watch(client: Client, resource: Resource, namespace: str | None, selector: str, resource_version: str,
                timeout_seconds: int = WATCH_SECONDS) -> AsyncIterator[dict]:
    """One watch's raw events (BOOKMARKs included) until the server ends it; an ERROR event raises ``ApiError``."""
    params = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
    if selector:
        params["labelSelector"] = selector
    if resource_version:
        params["resourceVersion"] = resource_version
    async for event in client.stream(resource.path(namespace), params, read_seconds=timeout_seconds + 30):
        if event.get("type") == "ERROR":
            raise ApiError.from_status(event.get("object") or {})
        yield event


async def follow(client: Client, resource: Resource, namespace: str | None, selector: str = "",
                 timeout_seconds: int = WATCH_SECONDS) -> AsyncIterator[Listing | Event]:
    """A ``Listing``, then ``Event``s, forever; a 410 yields a fresh ``Listing``. Other errors back off and retry."""
    backoff = Backoff(log)
    loop = asyncio.get_running_loop()
    resource_version = ""
    listed = False
    while True:
        problem = None
        try:
            if not listed:
                items, resource_version = await list_objects(client, resource, namespace, selector)
                listed = True
                yield Listing(items)
            started, delivered = loop.time(), False
            async for event in watch(client, resource, namespace, selector, resource_version, timeout_seconds):
                resource_version = event["object"]["metadata"].get("resourceVersion") or resource_version
                if event["type"] != "BOOKMARK":
                    delivered = True
                    yield Event(event["type"], event["object"])
            if not delivered and loop.time() - started < QUICK_END_SECONDS:
                problem = "the watch ended at once"
        except ApiError as error:
            if error.status == 410:  # our resourceVersion is too old: only a fresh listing is complete
                listed = False
            else:
                problem = str(error)
        except (*TRANSIENT, ValueError, KeyError) as error:  # a dropped stream resumes from resource_version
            problem = repr(error)
        if problem is None:
            backoff.reset()
        else:
            await backoff.wait(f"watch of {resource.plural} in {namespace}: {problem}")


def own_namespace(namespace: str | None, setting: str, who: str) -> str:
    """``namespace``, else POD_NAMESPACE, else the service account's; outside a pod with neither, a
    RuntimeError saying that ``who`` needs the ``setting``."""
    if namespace:
        return namespace
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    raise RuntimeError(f"{who} needs a namespace: set {setting} or POD_NAMESPACE")


async def _start(what: str, namespace: str | None, setting: str, api: Client | None) -> tuple[Client, str]:
    """The namespace, then a client (``api`` if given), retried with backoff until both are there."""
    backoff = Backoff(log, BACKOFF_MIN)
    while True:
        try:
            found = own_namespace(namespace, setting, what)
            return api or await Client.connect(), found
        except Exception as error:  # noqa: BLE001 - any failure here is logged and retried
            await backoff.wait(f"{what} cannot start: {error}")


async def keep_watching(what: str, resource: Resource, namespace: str | None, setting: str, selector: str,
                        listed: Callable[[list[dict]], None], changed: Callable[[str, dict], None],
                        api: Client | None = None) -> None:
    """Call ``listed`` with every matching object, then ``changed`` with each ADDED, MODIFIED or DELETED
    one, until cancelled. An object the callbacks cannot read (no name, say) restarts the watch with a
    fresh listing rather than ending it. ``api`` is closed only if created here."""
    client, namespace = await _start(what, namespace, setting, api)
    log.info("%s: watching %s in %s matching %r at %s", what, resource.plural, namespace, selector, client.server)
    backoff = Backoff(log, BACKOFF_MIN)
    try:
        while True:
            try:
                async for change in follow(client, resource, namespace, selector):
                    if isinstance(change, Listing):
                        listed(change.items)
                        backoff.reset()
                    elif change.type in ("ADDED", "MODIFIED", "DELETED"):
                        changed(change.type, change.object)
            except (ValueError, KeyError) as error:
                await backoff.wait(f"{what}: unreadable {resource.plural}: {error!r}")
    finally:
        if api is None:
            await client.close()

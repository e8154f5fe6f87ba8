"""Follow a set of objects: list once, then watch, resuming each watch where the last one stopped.

A watch ends when the server's timeout passes or the connection drops; the
next one starts from the last resourceVersion seen (an event's or a
bookmark's), so nothing is listed again and nothing is missed. Only when the
API answers 410 Gone (that version is compacted away) is the set listed afresh.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .backoff import Backoff
from .client import TRANSIENT, ApiError, Client
from .objects import list_objects
from .resources import Resource

log = logging.getLogger(__name__)
WATCH_SECONDS = 240  # the server ends each watch after this; the next resumes from the last resourceVersion
QUICK_END_SECONDS = 1.0  # a watch that ends sooner, having delivered nothing, is a problem: back off


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

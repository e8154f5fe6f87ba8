"""The few Kubernetes API calls the operator makes, through ``rollout_router.kube``.

Children are written with server-side apply (one PATCH creates or updates,
and fields we stop rendering are removed), so there is no read-modify-write
and no 409 to resolve. Errors are sorted into retryable (kopf backs off and
retries) and permanent ones (``ApiError``).
"""
from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from rollout_router.kube import objects
from rollout_router.kube.client import TRANSIENT, ApiError, Client
from rollout_router.kube.resources import PODS

FIELD_MANAGER = "rollout-router-operator"
# One client per event loop: kopf runs one loop, tests start one per test.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Client] = weakref.WeakKeyDictionary()


class RetryableError(Exception):
    """A conflict, a throttle, a server error or a dropped connection: try again later."""


async def api_client() -> Client:
    """In-cluster service account, else KUBECONFIG (or ~/.kube/config); created on first use."""
    loop = asyncio.get_running_loop()
    if loop not in _clients:
        _clients[loop] = await Client.connect()
    return _clients[loop]


async def close() -> None:
    """Close this loop's client (kopf's cleanup)."""
    client = _clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.close()


@asynccontextmanager
async def _sorted_errors(what: str) -> AsyncIterator[None]:
    """Retryable failures become ``RetryableError``; the rest (``ApiError`` 4xx) pass through."""
    try:
        yield
    except ApiError as error:
        if error.retryable:
            raise RetryableError(f"{what}: {error}") from error
        raise
    except TRANSIENT as error:
        raise RetryableError(f"{what}: {error!r}") from error


async def apply(manifest: dict) -> None:
    """Server-side apply, taking ownership of every field we render."""
    meta = manifest["metadata"]
    async with _sorted_errors(f"apply {manifest['kind']} {meta['namespace']}/{meta['name']}"):
        await objects.apply(await api_client(), manifest, FIELD_MANAGER)


async def delete(api_version: str, kind: str, namespace: str, name: str) -> bool:
    """Delete one child; False if it was already gone."""
    async with _sorted_errors(f"delete {kind} {namespace}/{name}"):
        return await objects.delete(await api_client(), api_version, kind, namespace, name)


async def list_pods(namespace: str, label_selector: str) -> list[dict]:
    async with _sorted_errors(f"list pods in {namespace}"):
        items, _ = await objects.list_objects(await api_client(), PODS, namespace, label_selector)
    return items

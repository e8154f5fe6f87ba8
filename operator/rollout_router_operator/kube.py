"""The few Kubernetes API calls the operator makes, through ``rollout_router.kube``.

Children are written with server-side apply (one PATCH creates or updates,
and fields we stop rendering are removed), so there is no read-modify-write.
Every call is retried a few times at once on a conflict, a throttle, a server
error or a dropped connection (``ATTEMPT_DELAYS``), so one failing write in five costs
a short pause rather than a whole handler retry; what still fails is a
``RetryableError`` (kopf backs off and retries the handler) or an ``ApiError``
(4xx: permanent).
"""
from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rollout_router.kube import objects
from rollout_router.kube.client import TRANSIENT, ApiError, Client
from rollout_router.kube.resources import PODS, Resource

from .spec import GROUP, KIND, PLURAL, VERSION

FIELD_MANAGER = "rollout-router-operator"
ATTEMPT_DELAYS = (0.2, 0.5, 1.0, 2.0)  # pauses between the attempts of one call (five attempts in all)
MERGE_PATCH = "application/merge-patch+json"
T = TypeVar("T")
ROLLOUTROUTERS = Resource(f"{GROUP}/{VERSION}", KIND, PLURAL, True)
REPLICASETS = Resource("apps/v1", "ReplicaSet", "replicasets", True)  # apps/v1: stable, as core/v1 pods
# One client per event loop: kopf runs one loop, tests start one per test.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Client] = weakref.WeakKeyDictionary()


class RetryableError(Exception):
    """A conflict, a throttle, a server error or a dropped connection: try again later."""


async def api_client() -> Client:
    """In-cluster service account, else KUBECONFIG (or ~/.kube/config); created on first use."""
    loop = asyncio.get_running_loop()
    if loop not in _clients:
        client = await Client.connect()
        if _clients.setdefault(loop, client) is not client:  # a concurrent first call connected too: keep one
            await client.close()
    return _clients[loop]


async def close() -> None:
    """Close this loop's client (kopf's cleanup)."""
    client = _clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.close()


async def _call(what: str, attempt: Callable[[Client], Awaitable[T]]) -> T:
    """``attempt`` with this loop's client, retried on retryable failures; then sorted for the caller."""
    for delay in (*ATTEMPT_DELAYS, None):
        try:
            return await attempt(await api_client())
        except ApiError as error:
            if not error.retryable:
                raise
            problem: Exception = error
        except TRANSIENT as error:
            problem = error
        if delay is None:
            raise RetryableError(f"{what}: {problem!r}") from problem
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def apply(manifest: dict) -> None:
    """Server-side apply, taking ownership of every field we render."""
    meta = manifest["metadata"]
    await _call(f"apply {manifest['kind']} {meta['namespace']}/{meta['name']}",
                lambda client: objects.apply(client, manifest, FIELD_MANAGER))


async def delete(api_version: str, kind: str, namespace: str, name: str) -> bool:
    """Delete one child; False if it was already gone."""
    return await _call(f"delete {kind} {namespace}/{name}",
                       lambda client: objects.delete(client, api_version, kind, namespace, name))


async def list_pods(namespace: str, label_selector: str) -> list[dict]:
    return await list_of(PODS, namespace, label_selector)


async def list_replicasets(namespace: str, label_selector: str) -> list[dict]:
    return await list_of(REPLICASETS, namespace, label_selector)


async def list_of(resource: Resource, namespace: str, label_selector: str) -> list[dict]:
    async def attempt(client: Client) -> list[dict]:
        items, _ = await objects.list_objects(client, resource, namespace, label_selector)
        return items
    return await _call(f"list {resource.plural} in {namespace}", attempt)


async def patch_status(namespace: str, name: str, status: dict) -> dict | None:
    """Merge-patch a RolloutRouter's status subresource: written here rather than by kopf, whose
    failed status patch (a 409, an outage longer than its backoffs) ends a timer for good. The status as
    the API server stored it (merged, nulls dropped, pruned), when it answered the object."""
    path = ROLLOUTROUTERS.path(namespace, name) + "/status"
    answer = await _call(f"patch status of {namespace}/{name}", lambda client: client.request(
        "PATCH", path, body={"status": status}, content_type=MERGE_PATCH))
    stored = answer.get("status") if isinstance(answer, dict) else None
    return stored if isinstance(stored, dict) else None

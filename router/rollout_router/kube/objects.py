"""Writing and reading objects: server-side apply, delete, list.

Server-side apply makes one PATCH create or update an object and remove the
fields the manager stopped sending, so there is no read-modify-write and no 409
to resolve.
"""
from __future__ import annotations

from .client import ApiError, Client
from .resources import Resource, find

APPLY_PATCH = "application/apply-patch+yaml"  # JSON is valid YAML


async def apply(client: Client, manifest: dict, field_manager: str) -> dict:
    """Create or update ``manifest`` as ``field_manager``, taking over fields other managers own."""
    meta = manifest["metadata"]
    resource = await find(client, manifest["apiVersion"], manifest["kind"])
    return await client.request("PATCH", resource.path(meta.get("namespace"), meta["name"]), body=manifest,
                                params={"fieldManager": field_manager, "force": "true"}, content_type=APPLY_PATCH)


async def delete(client: Client, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
    """Delete one object, dependents in the background; False if it was already gone, or if the API
    serves no such kind (no object of a kind whose CRD is not installed can exist)."""
    try:
        resource = await find(client, api_version, kind)
        await client.request("DELETE", resource.path(namespace, name), body={"propagationPolicy": "Background"})
    except ApiError as error:
        if error.status == 404:
            return False
        raise
    return True


async def list_objects(client: Client, resource: Resource, namespace: str | None,
                       selector: str = "") -> tuple[list[dict], str]:
    """The matching objects and the listing's resourceVersion (where a watch of them starts)."""
    body = await client.request("GET", resource.path(namespace), params={"labelSelector": selector} if selector else None)
    return body.get("items") or [], (body.get("metadata") or {}).get("resourceVersion", "")

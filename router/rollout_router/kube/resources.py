"""What a kind is called in URLs, read from the API's discovery documents instead of a hand-kept table.

``/api/v1`` and ``/apis/<group>/<version>`` list every resource the server
serves (its plural, kind, and whether it is namespaced), custom resources
included. Each client reads a group version once and again only when asked for
a kind it has not seen (a CRD installed since).
"""
from __future__ import annotations

from dataclasses import dataclass

from .client import ApiError, Client


@dataclass(frozen=True)
class Resource:
    """A kind as the API serves it, e.g. ``Resource("apps/v1", "Deployment", "deployments", True)``."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The collection's URL path, or one object's when ``name`` is given."""
        base = f"/apis/{self.api_version}" if "/" in self.api_version else f"/api/{self.api_version}"
        scope = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{base}{scope}/{self.plural}" + (f"/{name}" if name else "")


PODS = Resource("v1", "Pod", "pods", True)  # core/v1 pods, read by both sides: fixed by the API's stability promise


async def _discover(client: Client, api_version: str) -> dict[str, Resource]:
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    document = await client.request("GET", base)
    return {entry["kind"]: Resource(api_version, entry["kind"], entry["name"], bool(entry.get("namespaced")))
            for entry in document.get("resources") or [] if "/" not in entry["name"]}  # "pods/status": subresources


class UnknownKind(ApiError):
    """A 404: the API serves no such kind (its group version, or its CRD, is not installed)."""

    def __init__(self, api_version: str, kind: str):
        super().__init__(404, "NotFound", f"the API serves no {kind} in {api_version}")


async def find(client: Client, api_version: str, kind: str) -> Resource:
    """The resource serving ``kind`` in ``api_version``; ``UnknownKind`` if the server has none."""
    known = client.discovered.get(api_version)
    if known is None or kind not in known:
        try:
            known = client.discovered[api_version] = await _discover(client, api_version)
        except ApiError as error:
            if error.status == 404:  # no such group version at all
                raise UnknownKind(api_version, kind) from error
            raise
    if kind not in known:
        raise UnknownKind(api_version, kind)
    return known[kind]

"""Routes between routers, on the admin listener (token-protected like the other admin routes).

- ``GET /fleet/v1/info``: ``{"id", "http", "grpc"}``, where this router's traffic is served.
- ``GET /fleet/v1/loads``: ``{"id", "loads": {replica: n}}``, this router's own in-flight counts (never the
  peers' it added: each count is reported by the one router that holds it).
- ``POST /fleet/v1/handoff`` ``{"key": K}``: give up K's pin to its new owner; ``{"key", "replica"}``
  (``replica`` null when this router held no pin for K).

A router without session ownership answers 404 on each.
"""
from __future__ import annotations

import json

from ..context import RouterContext
from ..proxy.admin import GET, AdminAnswer, AdminRequest, Route, error


def _json(document: dict) -> AdminAnswer:
    return AdminAnswer(200, json.dumps(document).encode())


def _off() -> AdminAnswer:
    return error(404, "session ownership is off on this router (no --peer, fleet.peers or --peer-selector)")


def info(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    fleet = context.fleet
    if fleet is None:
        return _off()
    return _json({"id": fleet.self_id, "http": fleet.http_url, "grpc": fleet.grpc_target})


def loads(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    fleet = context.fleet
    if fleet is None:
        return _off()
    return _json({"id": fleet.self_id, "loads": context.replicas.own_loads()})


def handoff(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    fleet = context.fleet
    if fleet is None:
        return _off()
    try:
        body = json.loads(request.body or b"null")
    except ValueError:
        return error(400, "handoff body is not JSON; expected {\"key\": SESSION_KEY}")
    key = body.get("key") if isinstance(body, dict) else None
    if not isinstance(key, str) or not key:
        return error(400, "handoff body needs \"key\": a non-empty session key", "key")
    return _json({"key": key, "replica": fleet.handoff.surrender(key)})


ROUTES = [
    Route("/fleet/v1/info", GET, info),
    Route("/fleet/v1/loads", GET, loads),
    Route("/fleet/v1/handoff", ("POST",), handoff),
]

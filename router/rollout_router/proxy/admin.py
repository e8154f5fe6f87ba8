"""Endpoints about the router itself: health, readiness, metrics, status, sessions.

Plain functions of the router's context that return an ``AdminAnswer``, so any
listener can serve them (today the HTTP data path on the same port).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from urllib.parse import unquote

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..context import RouterContext
from ..observability import status
from .errors import error_body

SESSIONS_PREFIX = "/v1/sessions/"


@dataclasses.dataclass(frozen=True, slots=True)
class AdminAnswer:
    status: int
    body: bytes
    content_type: str = "application/json"


def _json(document: dict, code: int = 200) -> AdminAnswer:
    return AdminAnswer(code, json.dumps(document).encode())


def _error(code: int, message: str, param: str | None = None) -> AdminAnswer:
    return _json(error_body(code, message, param), code)


def healthz(context: RouterContext) -> AdminAnswer:
    return _json({"status": "ok"})


def readyz(context: RouterContext) -> AdminAnswer:
    """Ready once some replica can take a request, so Services skip an empty router."""
    ready = context.replicas.ready_count()
    if ready == 0:
        return _error(503, "no replica is ready")
    return _json({"status": "ready", "backends_ready": ready})


def metrics(context: RouterContext) -> AdminAnswer:
    return AdminAnswer(200, generate_latest(context.metrics.registry), CONTENT_TYPE_LATEST)


def status_document(context: RouterContext) -> AdminAnswer:
    return _json(status(context))


def release_session(context: RouterContext, key: str) -> AdminAnswer:
    """Drop a finished conversation's pin now instead of waiting for the idle timeout."""
    if not context.balancer.release_session(key):
        return _error(404, f"session {key!r} is not pinned", "key")
    return _json({"session": key, "released": True})


GET_ROUTES: dict[str, Callable[[RouterContext], AdminAnswer]] = {
    "/healthz": healthz, "/readyz": readyz, "/metrics": metrics, "/status": status_document,
}


def admin_answer(context: RouterContext, method: str, path: str) -> AdminAnswer | None:
    """The answer to an admin route, a 405 for a wrong method on one, None for any other path."""
    route = GET_ROUTES.get(path)
    if route is not None:
        return route(context) if method in ("GET", "HEAD") else _error(405, f"Method Not Allowed: {method} {path}")
    if path.startswith(SESSIONS_PREFIX) and "/" not in path[len(SESSIONS_PREFIX):] and path != SESSIONS_PREFIX:
        if method != "DELETE":
            return _error(405, f"Method Not Allowed: {method} {path}")
        return release_session(context, unquote(path[len(SESSIONS_PREFIX):]))
    return None

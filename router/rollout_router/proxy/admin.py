"""Endpoints about the router itself: health, readiness, metrics, status, sessions."""
from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..context import RouterContext
from ..observability import status
from .errors import error_response


class AdminRoutes:
    def __init__(self, context: RouterContext):
        self._context = context

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/status", self.status)
        app.router.add_delete("/v1/sessions/{key}", self.release_session)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        """Ready once some replica can take a request, so Services skip an empty router."""
        ready = self._context.replicas.ready_count()
        if ready == 0:
            return error_response(503, "no replica is ready")
        return web.json_response({"status": "ready", "backends_ready": ready})

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._context.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(status(self._context))

    async def release_session(self, request: web.Request) -> web.Response:
        """Drop a finished conversation's pin now instead of waiting for the idle timeout."""
        key = request.match_info["key"]
        if not self._context.balancer.release_session(key):
            return error_response(404, f"session {key!r} is not pinned", "key")
        return web.json_response({"session": key, "released": True})

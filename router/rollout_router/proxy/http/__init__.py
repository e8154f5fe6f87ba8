"""The HTTP listener: OpenAI-compatible paths forwarded byte for byte, admin routes answered here.

An asyncio Protocol server (uvloop when installed) parsing with llhttp
(``server``), keep-alive connections to replicas (``upstream``) and the
relay of one attempt (``relay``). Every request goes through ``forward``,
the attempt loop shared with gRPC: route, lease, one attempt, release once.
Timeouts are found by one periodic sweep, not by a timer per request.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from ...context import RouterContext
from ...policy import NoReplicaError
from ..admin import admin_answer
from ..attempts import AllRefused, forward
from ..auth import TokenFile
from ..errors import RouterError
from ..session_key import body_key
from ..workers import changes_routing, worker_answer
from . import wire
from .relay import CLIENT_CLOSED, Exchange, attempt
from .routes import FORWARDED_PATHS, REPLICA_HEADER, forwarded, unkeyed
from .server import ClientConnection, HttpRequest
from .upstream import KEEPALIVE_SECONDS, Pools

__all__ = ["CLIENT_CLOSED", "FORWARDED_PATHS", "HttpProxy", "REPLICA_HEADER"]

log = logging.getLogger(__name__)

SWEEP_SECONDS = 1.0


class HttpProxy:
    """Serves one port: forwards the OpenAI-compatible paths, answers the admin routes."""

    def __init__(self, context: RouterContext, admin_token: TokenFile | None = None):
        self.context = context
        self.admin_token = admin_token  # when set, routes that change routing want it as a bearer token
        self.pools = Pools()
        self.active: set[Exchange] = set()
        self.clients: set[ClientConnection] = set()
        self.now = time.monotonic()  # the sweep's coarse clock: stamps idle upstream connections
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task | None = None
        self._key_names: tuple[object, tuple[bytes, ...], frozenset[bytes]] = (None, (), frozenset())

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 picks a free port); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: ClientConnection(self), host, port, backlog=1024,
                                                reuse_address=True)
        self._sweeper = loop.create_task(self._sweep(), name="http-sweep")
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for client in list(self.clients):
            if client.transport is not None:
                client.transport.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        self.pools.close_idle(float("inf"))
        if self._server is not None:
            await self._server.wait_closed()

    def key_names(self) -> tuple[tuple[bytes, ...], frozenset[bytes]]:
        """The session-key headers, lower-cased, in precedence order; recomputed when settings change."""
        session = self.context.settings.session
        if self._key_names[0] is not session:
            names = tuple(name.lower().encode() for name in session.headers)
            self._key_names = (session, names, frozenset(names))
        return self._key_names[1], self._key_names[2]

    async def handle(self, client: ClientConnection, request: HttpRequest) -> None:
        """Answer one request; never raises (whatever goes wrong, the client gets JSON naming it)."""
        try:
            if request.error is not None:
                return self._refuse(client, request, request.error)
            if not forwarded(request.path):
                return self._admin(client, request)
            await self._forward(client, request)
        except Exception:
            log.exception("unexpected error on %s %s", request.method.decode(), request.path)
            self._refuse(client, request, RouterError(500, "internal router error; see the router's log"))

    async def _forward(self, client: ClientConnection, request: HttpRequest) -> None:
        try:
            key = None if unkeyed(request.path) else self._session_key(request)
        except RouterError as error:
            return self._refuse(client, request, error)
        headers = b"".join([b"%s: %s\r\n" % pair for pair in request.headers])  # once for every attempt
        metrics = self.context.metrics

        async def send(lease) -> None:
            started = time.monotonic()
            code = await attempt(self, client, request, headers, lease)
            if code is not None:
                metrics.observe(lease.replica.id, code, time.monotonic() - started)

        try:
            await forward(self.context, key, send)
        except NoReplicaError:
            self._refuse(client, request, RouterError(503, "no replica is available to serve this request"),
                         "no_replica")
        except AllRefused as error:
            self._refuse(client, request, RouterError(503, str(error)), "all_refused")

    def _session_key(self, request: HttpRequest) -> str | None:
        if request.keys:
            for name in self.key_names()[0]:
                value = request.keys.get(name)
                if value:
                    return value.decode("utf-8", "surrogateescape")
        session = self.context.settings.session
        if not session.body_fields:
            return None
        content_type = request.content_type.decode("latin-1") if request.content_type is not None else None
        return body_key(request.body, content_type, session)  # type: ignore[arg-type]

    def _admin(self, client: ClientConnection, request: HttpRequest) -> None:
        method = request.method.decode()
        if not self._authorized(method, request):
            self.context.metrics.errors.labels("http_401").inc()
            return client.write(wire.error_answer(
                401, "this route changes routing and needs Authorization: Bearer <token> (--admin-token-file)",
                close=request.close_after or not request.keep_alive, head_only=request.head_only,
                extra=((b"WWW-Authenticate", b'Bearer realm="rollout-router admin"'),)))
        query = request.target.partition(b"?")[2].decode("latin-1")
        answer = admin_answer(self.context, method, request.path) or worker_answer(
            self.context, method, request.path, query, request.body)  # type: ignore[arg-type]  # joined by now
        if answer is None:
            return self._refuse(client, request, RouterError(
                404, f"path {request.path} is not an OpenAI-compatible endpoint this router forwards"))
        if answer.status >= 400:
            self.context.metrics.errors.labels(f"http_{answer.status}").inc()
        client.write(wire.answer(answer.status, answer.body, answer.content_type.encode(),
                                 close=request.close_after or not request.keep_alive, head_only=request.head_only))

    def _authorized(self, method: str, request: HttpRequest) -> bool:
        """No token configured, a route that does not change routing, or the right bearer token."""
        if self.admin_token is None or not changes_routing(method, request.path):
            return True
        return self.admin_token.allows(next((v for n, v in request.headers if n.lower() == b"authorization"), None))

    def _refuse(self, client: ClientConnection, request: HttpRequest, error: RouterError,
                reason: str | None = None) -> None:
        """The router's own error answer."""
        self.context.metrics.errors.labels(reason or f"http_{error.status}").inc()
        client.write(self.error_bytes(error.status, error.message, request, param=error.param))

    def error_bytes(self, status: int, message: str, request: HttpRequest, replica: str | None = None,
                    param: str | None = None) -> bytes:
        extra = ((REPLICA_HEADER.encode(), replica.encode()),) if replica is not None else ()
        return wire.error_answer(status, message, param, close=request.close_after or not request.keep_alive,
                                 extra=extra, head_only=request.head_only)

    async def _sweep(self) -> None:
        """Once a second: time out silent replicas, close connections idle too long on either side."""
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self.now = time.monotonic()
            self.pools.close_idle(self.now - KEEPALIVE_SECONDS)
            self.expire_silent(SWEEP_SECONDS)
            for client in [c for c in self.clients if c.expired(self.now)]:
                if client.transport is not None:
                    client.transport.close()

    def expire_silent(self, elapsed: float) -> None:
        """Count ``elapsed`` seconds of silence against each exchange that received nothing since last time."""
        limit = self.context.settings.upstream_timeout_seconds
        if limit is None:
            return
        for exchange in list(self.active):
            if exchange.seen != exchange.swept or exchange.paused:  # bytes arrived, or a slow client paused us
                exchange.swept, exchange.silent = exchange.seen, 0.0
                continue
            exchange.silent += elapsed
            if exchange.silent >= limit:
                exchange.timeout()

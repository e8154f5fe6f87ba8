"""The admin listener: ``/metrics``, ``/status``, ``DELETE /v1/sessions/{key}`` and the probes, on their own port.

Loopback by default (``--admin-host 127.0.0.1 --admin-port 8081``), so a
router started by hand exposes nothing about its fleet to the network; in a
pod the operator binds it to all interfaces and a NetworkPolicy admits
Prometheus only. With ``--admin-token-file`` every route but the probes wants
``Authorization: Bearer <token>`` (401 JSON otherwise); the file is re-read
when it changes, so a rotated Secret applies without a restart.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hmac
import logging
import os
from collections.abc import AsyncGenerator
from pathlib import Path

from ...fleet.client import PER_PEER
from .. import admin, fleet_routes, rl_routes, workers
from ..context import RouterContext
from ..listener import Limits
from . import wire
from .connection.client import ClientConnection
from .connection.listener import HttpListener, write_admin
from .wire.request import HttpRequest

# What the admin listener serves: the router's own routes, the worker API of SGLang's router / vllm-router,
# the routes between the routers of a fleet, and the RL step's fleet operations (/v1/rl/*).
ROUTES = (*admin.ROUTES, *workers.ROUTES, *fleet_routes.ROUTES, *rl_routes.ROUTES)

log = logging.getLogger(__name__)

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8081
# Scrapers, probes and people: a few connections, small bodies, quick heads.
LIMITS = Limits(max_connections=128, max_body_bytes=1 << 20, max_buffered_bytes=8 << 20, header_timeout=10.0,
                body_timeout=30.0, min_body_rate=0)
# What each candidate peer of the fleet may hold on top: its watch of the loads and its calls (a handoff, a
# push, info), at most fleet/client.py's PER_PEER at once, so a fleet of any size (pods x workers) fits beside
# the scrapers.


GONE = (-1, -1, -1)  # the token file's stamp while it cannot be read


class TokenFile:
    """A bearer token read from a file, re-read whenever the file changes (a mounted Secret is swapped whole)."""

    def __init__(self, path: Path):
        self.path = path
        self._stamp: tuple[int, int, int] | None = self._stat()
        self._token = self._read()  # a token file missing or empty at start is an error at start

    def _stat(self) -> tuple[int, int, int]:
        stat = os.stat(self.path)
        return stat.st_ino, stat.st_mtime_ns, stat.st_size

    def _read(self) -> bytes:
        token = self.path.read_bytes().strip()
        if not token:
            raise ValueError(f"admin token file {self.path} is empty")
        return token

    def current(self) -> bytes:
        """The token now; an unreadable or empty new version is logged once and the last good one kept."""
        try:
            stamp = self._stat()
        except OSError:
            stamp = GONE
        if stamp == self._stamp:
            return self._token
        self._stamp = stamp  # this version is read (and said to be bad) once, not on every request
        try:
            if stamp == GONE:
                raise FileNotFoundError(f"{self.path} is gone")
            self._token = self._read()
            log.info("admin token file %s re-read", self.path)
        except (OSError, ValueError) as error:
            log.error("admin token file %s unreadable, keeping the previous token: %s", self.path, error)
        return self._token

    def allows(self, authorization: bytes | None) -> bool:
        scheme, _, credentials = (authorization or b"").strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.current())


class AdminListener(HttpListener):
    """Answers every admin route (``admin.ROUTES``); nothing here is forwarded."""

    name = "admin"

    def __init__(self, context: RouterContext, token: TokenFile | None = None):
        super().__init__(context)
        self.token = token
        self._limits, self._peers = LIMITS, 0  # the limits for that many candidate peers

    def limits(self) -> Limits:
        """``LIMITS``, with ``PER_PEER`` more connections for each candidate peer the fleet knows now."""
        fleet = self.context.fleet
        peers = 0 if fleet is None else fleet.candidates()
        if peers != self._peers:
            self._peers = peers
            self._limits = dataclasses.replace(LIMITS, max_connections=LIMITS.max_connections + PER_PEER * peers)
        return self._limits

    async def handle(self, client: ClientConnection, request: HttpRequest) -> None:
        """Answer one request; a bug is a JSON 500 naming the log, never a client left waiting for an answer."""
        try:
            answer, extra = self.answer(request)
        except Exception:
            log.exception("unexpected error on %s %s", request.method.decode(), request.path)
            answer, extra = admin.error(500, "internal router error; see the router's log"), ()
        if isinstance(answer, admin.Stream) and answer.lines is not None and not request.head_only:
            await stream(client, answer.lines())
            return
        if isinstance(answer, admin.Deferred) and answer.then is not None:
            try:
                answer = await answer.then()
            except Exception:
                log.exception("unexpected error on %s %s", request.method.decode(), request.path)
                answer = admin.error(500, "internal router error; see the router's log")
        write_admin(self, client, request, answer, extra)

    def answer(self, request: HttpRequest) -> tuple[admin.AdminAnswer, tuple[tuple[bytes, bytes], ...]]:
        """The answer and its extra headers; never raises for a client's input."""
        if request.error is not None:
            error = request.error
            return admin.error(error.status, error.message, error.param), ()
        path = request.path
        found = admin.find(path, routes=ROUTES)
        if not found:
            return admin.error(404, f"path {path} is not an admin route of this router"), ()
        if self.token is not None and not any(route.probe for route, _ in found) \
                and not self.token.allows(_header(request, b"authorization")):
            return (admin.error(401, "admin routes need Authorization: Bearer <token> (--admin-token-file)"),
                    ((b"WWW-Authenticate", b'Bearer realm="rollout-router admin"'),))
        query = request.target.partition(b"?")[2].decode("latin-1")
        body = request.body if isinstance(request.body, bytes) else b""
        answer = admin.admin_answer(self.context, request.method.decode(), path, query, body, routes=ROUTES)
        assert answer is not None
        return answer, ()


async def stream(client: ClientConnection, lines: AsyncGenerator[bytes, None]) -> None:
    """Write each line as a chunk until the client goes. A client that does not read misses lines once its
    writes pause (``WRITE_HIGH_WATER`` buffered; cut after ``WRITE_STALL_SECONDS``) rather than having more
    buffered: each line is a whole snapshot, so the next one it reads is current."""
    client.write(wire.status_line(200) + b"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
    try:
        async with contextlib.aclosing(lines):
            async for line in lines:
                if client.gone:
                    return
                if not client.write_paused:
                    client.write(wire.chunk(line))
    except Exception:
        log.exception("a streamed admin answer failed")
        client.abort()  # a chunked answer cut short must not look whole
        return
    client.write(wire.LAST_CHUNK)


def _header(request: HttpRequest, name: bytes) -> bytes | None:
    return next((value for key, value in request.headers if key.lower() == name), None)

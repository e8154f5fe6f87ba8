"""What every listener of the router shares: a bound on connections, the request deadlines, the byte budget.

A listener (HTTP: the traffic port and the admin port, ``http/listener.py``;
the gRPC port) accepts connections of its protocol (``connection``). Here: refusing connections beyond
``Limits.max_connections`` (503, one warning per episode, a counter), the
budget of request bytes held at once (heads and bodies, 503 when full), and
the sweep that once a second closes idle connections and answers 408 to heads
and bodies that arrive too slowly (slowloris), instead of a timer per request.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time

from ..core.budget import Budget, Share
from ..listening import EVERY_ADDRESS, bound_socket, dual_stack_socket
from ..settings import RouterSettings
from .context import RouterContext

log = logging.getLogger(__name__)

SWEEP_SECONDS = 1.0
BODY_GRACE_SECONDS = 10.0  # a body's rate is judged only after this long (TCP slow start, a client's pause)


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """The bounds a listener enforces on its clients (None: no deadline; 0 rate: any rate)."""

    max_connections: int
    max_body_bytes: int
    max_buffered_bytes: int
    header_timeout: float | None
    body_timeout: float | None
    min_body_rate: int


_TRAFFIC: list = [None, None]  # the settings the traffic limits were last computed from, and those limits
_ROOM: list[int | None] = [None]  # clients one traffic listener may hold within the descriptor limit


def limit_connections(room: int | None) -> None:
    """Cap every traffic listener's ``maxConnections`` at ``room`` (descriptors.connection_cap, at start)."""
    _ROOM[0], _TRAFFIC[0] = room, None


def traffic_limits(settings: RouterSettings) -> Limits:
    """The limits the traffic listeners (HTTP and gRPC) enforce, from the live settings; recomputed when they change."""
    if _TRAFFIC[0] is not settings:
        room = _ROOM[0]
        connections = settings.max_connections if room is None else min(settings.max_connections, room)
        _TRAFFIC[:] = [settings, Limits(connections, settings.max_body_bytes, settings.max_buffered_bytes,
                                        settings.header_timeout_seconds, settings.body_timeout_seconds,
                                        settings.min_body_bytes_per_second)]
    return _TRAFFIC[1]


class Listener:
    """One listening socket of clients; subclasses make their protocol's connections and set ``limits``."""

    name = "http"  # the ``listener`` label of its metrics
    refusal = "503"  # what a connection beyond ``max_connections`` is answered (in the log line)
    reuse_port = False  # True in a worker of ``serve --workers N``: the workers bind the same port (SO_REUSEPORT)

    def __init__(self, context: RouterContext, budget: Budget | None = None):
        self.context = context
        self.clients: set = set()  # ClientConnection (HTTP) or the gRPC listener's connections
        self.now = time.monotonic()  # the sweep's coarse clock
        self.swept = self.now  # that clock at the sweep before: what a connection used since then has read
        self.share = Share(budget or Budget())  # this listener's part of the budget (bound: ``max_buffered_bytes``)
        self.budget = self.share.budget
        self._server: asyncio.AbstractServer | None = None
        self._private: asyncio.AbstractServer | None = None  # a worker's own port, where its fleet peers reach it
        self._sweeper: asyncio.Task | None = None
        self._at_limit = False
        self.closing = False  # stopping: no new connections (``stop_accepting``); each protocol closes those open
        self.taking = 0  # connections taken from the accept queue as the listener closed, not yet clients
        self._taken: set[asyncio.Task] = set()
        metrics = context.metrics
        self._rejected = metrics.connections_rejected.labels(self.name)
        self.write_stalls = metrics.write_stalls.labels(self.name)
        metrics.client_connections.labels(self.name).set_function(lambda: len(self.clients))
        metrics.buffered_bytes.labels(self.name).set_function(lambda: self.share.buffered)

    def limits(self) -> Limits:
        raise NotImplementedError

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 picks a free port; ``::`` every IPv6 and IPv4 address); returns the port."""
        loop = asyncio.get_running_loop()
        if host in (EVERY_ADDRESS, f"[{EVERY_ADDRESS}]"):
            self._server = await loop.create_server(self.connection, sock=dual_stack_socket(port, self.reuse_port),
                                                    backlog=1024)
        else:
            self._server = await loop.create_server(self.connection, host, port, backlog=1024, reuse_address=True,
                                                    reuse_port=self.reuse_port or None)
        self._sweeper = loop.create_task(self._sweep(), name=f"{self.name}-sweep")
        return self._server.sockets[0].getsockname()[1]

    async def listen_privately(self, host: str) -> int:
        """Also listen on a port of this process alone (``host``, a free port; ``::`` IPv6 and IPv4; returns it):
        a worker of ``serve --workers N`` shares its public port with the others, so a turn forwarded to it comes
        here (from its siblings on loopback, or in a fleet of pods from the other pods, on the pod's address)."""
        self._private = await asyncio.get_running_loop().create_server(self.connection, sock=bound_socket(host, 0),
                                                                       backlog=1024)
        return self._private.sockets[0].getsockname()[1]

    def connection(self) -> asyncio.Protocol:
        """A new client connection's protocol."""
        raise NotImplementedError

    def stop_accepting(self) -> None:
        """Refuse new connections; those open are served until ``close``. The connections the kernel had already
        queued for a listening socket are taken first: closing it would reset them, requests sent and all."""
        self.closing = True
        for server in (self._server, self._private):
            if server is None or not server.is_serving():
                continue
            try:
                queued = [socket.socket(fileno=os.dup(sock.fileno())) for sock in server.sockets]  # type: ignore[attr-defined]
            except OSError as error:  # no descriptor to spare: what the kernel queued is reset as the socket closes
                log.warning("%s listener: the connections queued as it closed are reset: %s", self.name, error)
                queued = []
            server.close()
            for sock in queued:
                with sock:
                    for accepted in _queued(sock):
                        self._take(accepted)

    def _take(self, sock: socket.socket) -> None:
        """Serve a connection taken from the accept queue; counted in ``taking`` until it is a client."""
        self.taking += 1
        task = asyncio.get_running_loop().create_task(self._serve_taken(sock))
        self._taken.add(task)
        task.add_done_callback(self._taken.discard)

    async def _serve_taken(self, sock: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(self.connection, sock)
        except OSError:  # gone meanwhile
            sock.close()
        except Exception:
            sock.close()
            log.exception("%s listener: a connection taken from the accept queue could not be served", self.name)
        finally:
            self.taking -= 1

    async def close(self) -> None:
        self.stop_accepting()
        for client in list(self.clients):
            if client.transport is not None:
                client.transport.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for server in (self._server, self._private):
            if server is not None:
                await server.wait_closed()

    def admit(self) -> bool:
        """Whether one more connection fits; the first refusal of an episode is logged."""
        limit = self.limits().max_connections
        if len(self.clients) < limit:
            return True
        self._rejected.inc()
        if not self._at_limit:
            self._at_limit = True
            log.warning("%s listener: %d client connections open, the limit (maxConnections=%d); new connections "
                        "get %s until some close", self.name, len(self.clients), limit, self.refusal)
        return False

    @property
    def buffered(self) -> int:
        """The request bytes this listener holds (its metric; its share of the budget)."""
        return self.share.buffered

    def charge(self, size: int) -> bool:
        """Count ``size`` more request bytes held; False (nothing counted) when the budget has no room."""
        return self.share.charge(size, self.limits().max_buffered_bytes)

    def hold(self, size: int) -> None:
        """Count ``size`` bytes that are already held whatever the budget (a gRPC answer waiting for its client)."""
        self.share.hold(size)

    def release(self, size: int) -> None:
        self.share.release(size)

    async def _sweep(self) -> None:
        """Once a second: the listener's own chores (``tick``), then every client's deadlines. A bug in one visit is
        logged and the sweep goes on: ended, it would take every timeout, idle close and 408 with it."""
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self.swept, self.now = self.now, time.monotonic()
            try:
                self.tick(SWEEP_SECONDS)
            except Exception:
                log.exception("the %s listener's sweep failed", self.name)
            limits = self.limits()
            if self._at_limit and len(self.clients) < limits.max_connections:
                self._at_limit = False
            for client in list(self.clients):
                try:
                    client.check(self.now, limits)
                except Exception:
                    log.exception("the %s listener's sweep failed on a client connection", self.name)

    def tick(self, elapsed: float) -> None:
        """What a listener does once a sweep besides its clients' deadlines."""


def _queued(listening: socket.socket) -> list[socket.socket]:
    """The connections waiting in ``listening``'s accept queue (a duplicate of a listener's socket, which still
    listens until this one closes too)."""
    listening.setblocking(False)
    taken: list[socket.socket] = []
    while True:
        try:
            sock, _ = listening.accept()
        except (BlockingIOError, InterruptedError):
            return taken
        except OSError:  # the descriptor limit, say: what is left is reset as the socket closes
            log.warning("stopping: %d queued connections taken, the rest reset", len(taken))
            return taken
        sock.setblocking(False)
        taken.append(sock)

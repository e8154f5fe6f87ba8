"""A request whose replica a sibling worker chose (``decisions``): forwarded from here, its end told back.

The fast path of the traffic listener asks the key's owner worker instead of relaying through it; the answer
(or its absence) comes from the channel's callback, with no Task waiting. When the owner routes it, the
request goes to that replica as the fast path's own would (on an idle connection, else a new one; a pooled
one gone stale is tried once more on a new one). In every other case (the owner cannot decide at once, no
answer in time, the replica's connection cannot be opened) it is answered as before: ``HttpProxy.handle``,
which relays it through its owner.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ..decisions import DecisionClient, Routing
from ..turns import Turn
from .relay import STALE, Exchange, accepted, request_bytes
from .upstream import ReplicaPool, UpstreamConnection

if TYPE_CHECKING:
    from .server import ClientConnection, HttpRequest
    from .traffic import HttpProxy


class Delegated:
    """One request on its way through a decision asked of ``sibling``."""

    __slots__ = ("proxy", "client", "request", "sibling", "headers", "ident", "replica", "turn", "started",
                 "opening")

    def __init__(self, proxy: HttpProxy, client: ClientConnection, request: HttpRequest, sibling: str,
                 headers: bytes) -> None:
        self.proxy, self.client, self.request, self.sibling, self.headers = proxy, client, request, sibling, headers
        self.ident = 0
        self.replica = ""
        self.turn: Turn | None = None
        self.started = 0.0
        self.opening: asyncio.Task | None = None  # a connection being opened to the replica

    @property
    def decisions(self) -> DecisionClient:
        decisions = self.proxy.decisions
        assert decisions is not None
        return decisions

    def decided(self, ident: int, routing: Routing | None) -> None:
        """The owner's answer: forward to its replica on an idle connection, or on a new one; None: relay."""
        self.ident = ident
        if routing is None:
            return self._relay()
        self.replica, self.turn = routing
        if self.client.gone:  # nothing to send: the owner's lease and pin stay as an answered request leaves them
            self.decisions.finished(self.sibling, ident, True, 0, None)
            self._answered()
            return
        fleet = self.proxy.context.fleet
        if fleet is not None:
            fleet.delegated += 1
        pool = self.proxy.pools.get(self.replica)
        conn = pool.take()
        if conn is None:
            self._connect(pool)
        else:
            self._send(pool, conn, True)

    def _send(self, pool: ReplicaPool, conn: UpstreamConnection, reused: bool) -> None:
        assert self.turn is not None
        self.started = started = time.monotonic()
        self.turn.begin(started)
        Exchange(self.proxy, self.client, self.request, self.replica, conn, reused, turn=self.turn,
                 on_done=self.done).start(request_bytes(self.request, pool, self.headers))

    def _connect(self, pool: ReplicaPool) -> None:
        """Open a connection to the replica (a Task: the one wait of this path), then send on it."""
        assert self.client.loop is not None
        self.opening = self.client.loop.create_task(self._open(pool))

    async def _open(self, pool: ReplicaPool) -> None:
        try:
            conn = await pool.connect()
        except (OSError, TimeoutError):  # the owner's relay tries it again, and marks it down if it refuses
            self.decisions.finished(self.sibling, self.ident, False, 0, None)
            return self._relay()
        finally:
            self.opening = None
        if self.client.gone:
            conn.close()
            self.decisions.finished(self.sibling, self.ident, True, 0, None)
            return self._answered()
        self._send(pool, conn, False)

    def done(self, exchange: Exchange, result: str | None) -> None:
        """The exchange ended: the owner hears how (it releases the lease and tells its passive health), this
        worker records the request's metrics and its turn. A pooled connection gone stale before answering
        is tried once more on a new one (nothing was sent)."""
        if result == STALE:
            return self._connect(self.proxy.pools.get(self.replica))
        ok = accepted(exchange)
        self.decisions.finished(self.sibling, self.ident, ok, exchange.status, exchange.failure)
        metrics = self.proxy.context.metrics
        if exchange.code is not None:
            metrics.observe(self.replica, exchange.code, time.monotonic() - self.started)
        if ok and self.turn is not None:
            metrics.turn(self.turn)
        self._answered()

    def _answered(self) -> None:
        self.proxy.answering -= 1
        self.client.answered(self.request)

    def _relay(self) -> None:
        """Answer as if the fast path had not taken it: ``handle`` relays it through its owner."""
        self.proxy.answering -= 1
        self.client.answer_later(self.request, self.proxy.handle(self.client, self.request))

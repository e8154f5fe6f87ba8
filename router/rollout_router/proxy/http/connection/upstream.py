"""Connections to replicas: a bounded keep-alive pool per replica, one response at a time on each.

A pooled connection that the replica closed while it sat idle is dropped as
soon as the close arrives; the race that remains (the replica closes just as
a request is written) is what ``Exchange`` retries once on a fresh connection.
Idle connections are closed by the listener's sweep after ``KEEPALIVE_SECONDS``,
before the replica's own keep-alive timeout (uvicorn's is 5 s) can race us.
"""
from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

import httptools

if TYPE_CHECKING:
    from .relay import Exchange

POOL_SIZE = 64  # idle connections kept per replica; more concurrent requests open (and then close) more
KEEPALIVE_SECONDS = 4.0
CONNECT_SECONDS = 10.0

T = TypeVar("T")


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a replica; its parser's events go to the exchange it currently serves.

    One parser per connection, kept across responses (making one per response
    costs more than the rest of the bookkeeping); ``reset`` replaces it after a
    response whose body the parser cannot know is absent (HEAD).
    """

    def __init__(self, pool: ReplicaPool) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.closed = False
        self.idle_since = 0.0
        self.surplus = False  # bytes after an answer in the read that ended it: not to be pooled (``Exchange``)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:  # bytes nobody asked for: the connection cannot be trusted any more
            self.close()
            return
        exchange.feed(data)

    def on_message_begin(self) -> None:
        if self.exchange is None:  # a second answer in the read that ended the first: nobody asked for it
            self.surplus = True

    def reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)

    # llhttp callbacks, for the current exchange
    def on_status(self, reason: bytes) -> None:
        if self.exchange is not None:
            self.exchange.reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        exchange = self.exchange
        if exchange is not None and not exchange.status:  # a status: the head has ended, these are trailers (dropped)
            if len(name) == 14 and name.lower() == b"content-length":  # llhttp refuses a second one
                exchange.length = value
            else:
                exchange.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.exchange is not None:
            self.exchange.on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None:
            self.exchange.on_body(body)

    def on_message_complete(self) -> None:
        if self.exchange is not None:
            self.exchange.on_message_complete()

    def eof_received(self) -> bool:
        return False  # close our side too; the exchange learns in connection_lost

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.upstream_lost(exc)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        """Drop the connection at once (RST): the replica must notice a cancelled request right away."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class ReplicaPool:
    """Idle keep-alive connections to one replica, most recently used first."""

    def __init__(self, replica_id: str) -> None:
        url = urlsplit(replica_id)
        self.host = url.hostname or "localhost"
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.host_header = url.netloc.encode("idna")
        self.prefix = url.path.rstrip("/").encode()
        self._idle: list[UpstreamConnection] = []

    def take(self) -> UpstreamConnection | None:
        """An idle connection, or None when a new one must be opened."""
        idle = self._idle
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
        return None

    async def connect(self) -> UpstreamConnection:
        """A new connection; OSError when the replica refuses, TimeoutError when it does not answer."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(CONNECT_SECONDS):  # only when a connection is opened, not per request
            _, connection = await loop.create_connection(lambda: UpstreamConnection(self), self.host, self.port,
                                                         ssl=self.ssl)
        return connection

    async def exchange(self, send: Callable[[UpstreamConnection, bool], Awaitable[T | None]], fresh: bool = False
                       ) -> T:
        """``send(connection, reused)`` on an idle connection, and once more on a new one when it answers None
        (``fresh``: on a new one only, the idle one that went stale having been tried already).

        None means stale: the replica closed the reused connection before answering
        (the race a keep-alive pool cannot avoid), so nothing was done and the request
        is as safe to send again. A new connection is never stale. Connecting raises
        OSError when the replica refuses, TimeoutError when it does not answer.
        """
        connection = None if fresh else self.take()
        if connection is not None:
            result = await send(connection, True)
            if result is not None:
                return result
        result = await send(await self.connect(), False)
        if result is None:
            raise AssertionError("unreachable: a fresh connection is never stale")
        return result

    def give_back(self, connection: UpstreamConnection, now: float) -> None:
        if connection.closed or len(self._idle) >= POOL_SIZE:
            connection.close()
            return
        connection.idle_since = now
        self._idle.append(connection)

    def forget(self, connection: UpstreamConnection) -> None:
        if connection in self._idle:
            self._idle.remove(connection)

    def close_idle(self, older_than: float) -> None:
        """Close connections idle since before ``older_than`` (all of them with ``inf``)."""
        for connection in [c for c in self._idle if c.idle_since < older_than]:
            self._idle.remove(connection)
            if connection.transport is not None:
                connection.transport.close()

    def __len__(self) -> int:
        return len(self._idle)


class Pools:
    """A ``ReplicaPool`` per replica id, made on first use."""

    def __init__(self) -> None:
        self._pools: dict[str, ReplicaPool] = {}

    def get(self, replica_id: str) -> ReplicaPool:
        pool = self._pools.get(replica_id)
        if pool is None:
            pool = self._pools[replica_id] = ReplicaPool(replica_id)
        return pool

    def close_idle(self, older_than: float) -> None:
        for pool in self._pools.values():
            pool.close_idle(older_than)

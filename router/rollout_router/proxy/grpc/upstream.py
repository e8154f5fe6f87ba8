"""HTTP/2 connections to replicas (and to owner routers): one multiplexed connection per target, reused.

A target's connection carries every call to it at once, up to the stream
limit the replica announces; past that, or once the replica said GOAWAY,
another connection opens. Calls that find the target connecting wait for
that one connection. Streams the replica's GOAWAY says it never saw are
reported as refused (safe to send elsewhere).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from . import h2
from .conn import CONNECTION_WINDOW, MAX_HEAD, UPSTREAM_WINDOW, H2Connection
from .guard import ReplicaGuard
from .outbound import Owner, Stream

CONNECT_SECONDS = 10.0
MIN_WINDOW = 1024


def answer_window(max_buffered_bytes: int, max_calls: int) -> int:
    """Each replica stream's window: what one call's answer may hold for a client that does not read. Every call
    slot full of unread answers then holds at most ``maxBufferedBytes`` (``maxBufferedBytes // maxGrpcStreams``:
    26 KiB at the defaults), at most HTTP/2's default 64 KiB, at least 1 KiB."""
    return max(MIN_WINDOW, min(UPSTREAM_WINDOW, max_buffered_bytes // max_calls))


def _opening(window: int) -> bytes:
    settings = h2.settings_frame({h2.ENABLE_PUSH: 0, h2.INITIAL_WINDOW_SIZE: window, h2.MAX_HEADER_LIST_SIZE: MAX_HEAD})
    return h2.PREFACE + settings + h2.window_update(0, CONNECTION_WINDOW - h2.DEFAULT_WINDOW)


class UpstreamConnection(H2Connection):
    """The client side of one connection to a replica. Each stream's window is the pool's ``answer_window``,
    granted again only as the client takes the bytes: a client that stops reading holds at most that much of its
    call's answer."""

    def __init__(self, pool: Upstreams, target: str) -> None:
        super().__init__()
        self.stream_window = pool.window()
        self.pool, self.target = pool, target
        self.next_stream = 1
        self.guard = ReplicaGuard()
        self.going_away = False

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        transport.write(_opening(self.stream_window))

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.forget(self)
        super().connection_lost(exc)

    def usable(self) -> bool:
        return (not self.closed and not self.going_away and len(self.streams) < self.peer_max_streams
                and self.next_stream < h2.MAX_WINDOW - 2)

    def open(self, owner: Owner, headers: list[h2.Header], end: bool) -> Stream:
        """A new stream for ``owner``, its request head sent."""
        stream = Stream(self.next_stream, owner, self)
        self.next_stream += 2
        self.streams[stream.id] = stream
        self.send_headers(stream, headers, end)
        return stream

    def goaway_frame(self, last_stream_id: int, code: int) -> None:
        self.going_away = True
        self.pool.forget(self)
        for stream_id in [i for i in self.streams if i > last_stream_id]:
            stream = self.streams.pop(stream_id)
            if stream.owner is not None:
                stream.owner.on_lost(stream, True)
        self.close_if_idle()

    def close_if_idle(self) -> None:
        if not self.streams and self.transport is not None:
            self.closed = True
            self.transport.close()

    def forget(self, stream: Stream) -> None:
        super().forget(stream)
        if self.going_away:
            self.close_if_idle()

    def reset(self, stream: Stream, code: int = h2.CANCEL) -> None:
        super().reset(stream, code)
        if self.going_away:
            self.close_if_idle()


class Upstreams:
    """The connections to every target (``host:port``), opened on first use; ``window`` gives a new connection's
    stream window (read at connect: a reloaded budget applies to connections opened after it)."""

    def __init__(self, window: Callable[[], int] = lambda: UPSTREAM_WINDOW) -> None:
        self.window = window
        self._conns: dict[str, list[UpstreamConnection]] = {}
        self._connecting: dict[str, asyncio.Future[UpstreamConnection]] = {}

    def ready(self, target: str) -> UpstreamConnection | None:
        """A usable connection to ``target`` open now, or None."""
        for conn in self._conns.get(target, ()):
            if conn.usable():
                return conn
        return None

    async def get(self, target: str) -> UpstreamConnection:
        """A usable connection to ``target``; OSError when it refuses, TimeoutError when it does not answer."""
        conn = self.ready(target)
        if conn is not None:
            return conn
        pending = self._connecting.get(target)
        if pending is None:
            pending = self._connecting[target] = asyncio.ensure_future(self._connect(target))
            pending.add_done_callback(lambda _: self._connecting.pop(target, None))
        return await asyncio.shield(pending)

    async def _connect(self, target: str) -> UpstreamConnection:
        host, _, port = target.rpartition(":")
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(CONNECT_SECONDS):
            _, conn = await loop.create_connection(lambda: UpstreamConnection(self, target), host.strip("[]"),
                                                   int(port))
        self._conns.setdefault(target, []).append(conn)
        return conn

    def forget(self, conn: UpstreamConnection) -> None:
        conns = self._conns.get(conn.target)
        if conns is not None and conn in conns:
            conns.remove(conn)
            if not conns:
                del self._conns[conn.target]

    def targets(self) -> set[str]:
        return set(self._conns)

    def retire(self, target: str) -> None:
        """No new calls go to ``target``; its connections close once their calls are done."""
        for conn in self._conns.pop(target, []):
            conn.going_away = True
            conn.close_if_idle()

    def close(self) -> None:
        for target in list(self._conns):
            for conn in self._conns.pop(target):
                conn.closed = True
                if conn.transport is not None:
                    conn.transport.close()

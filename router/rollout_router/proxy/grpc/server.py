"""The server side of the gRPC listener: one HTTP/2 connection from a client, its new streams handed to the proxy.

Past the listener's ``maxConnections`` a connection is still read, but each of
its calls is answered RESOURCE_EXHAUSTED naming the limit and the connection
is told to go away (GOAWAY) and closed shortly after: the client learns why,
as an HTTP client gets its 503. The sweep's ``check`` closes connections whose
preface or header block does not arrive within ``headerTimeoutSeconds``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import h2, rules
from .conn import CONNECTION_WINDOW, MAX_HEAD, H2Connection
from .outbound import STREAM_WINDOW, Stream

if TYPE_CHECKING:
    from ..listener import Limits
    from .traffic import GrpcProxy

LINGER_SECONDS = 2.0  # a refused or closing connection is closed this long after it was told to go away
NOT_GRPC = b"this is the router's gRPC listener: calls are POST /service/method with content-type application/grpc\n"


class ClientConnection(H2Connection):
    track_ends = True

    def __init__(self, proxy: GrpcProxy) -> None:
        super().__init__()
        self.proxy = proxy
        self.refused = False
        self.gone = False
        self.preface = bytearray()  # read first (``preface_received``)
        self.head_clock = True  # a head begun is timed (``head_begun``, ``check``)
        self._opened_at: float | None = proxy.now  # the sweep's clock until the preface arrived
        self._closing_at: float | None = None
        self._gone_away: int | None = None  # the last stream id our GOAWAY named: later streams are refused
        self._idle_at: float | None = proxy.now  # the sweep's clock since the last stream closed
        self.max_streams = min(proxy.context.settings.max_grpc_streams,
                               proxy.context.settings.max_grpc_streams_per_connection)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        proxy = self.proxy
        self.refused = not proxy.admit()
        proxy.clients.add(self)  # a refused one too, until it is closed: it holds a descriptor
        transport.write(h2.settings_frame({h2.MAX_CONCURRENT_STREAMS: self.max_streams, h2.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                                           h2.MAX_HEADER_LIST_SIZE: MAX_HEAD})
                        + h2.window_update(0, CONNECTION_WINDOW - h2.DEFAULT_WINDOW))
        if proxy.closing:  # taken from the accept queue as the listener closed: it serves the calls open, no more
            self.go_away()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        self.proxy.clients.discard(self)
        super().connection_lost(exc)

    def preface_received(self, data: bytes) -> bytes | None:
        """The client's connection preface comes first: what follows it once it came whole; None while it has not,
        or when it is not one (the connection is closed)."""
        preface = self.preface
        assert preface is not None  # (read only while awaited)
        preface += data
        if len(preface) < len(h2.PREFACE):
            return None
        if not preface.startswith(h2.PREFACE):
            self.fail(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface (gRPC needs HTTP/2)")
            return None
        self.preface = self._opened_at = None
        return bytes(preface[len(h2.PREFACE):])

    def head_begun(self) -> None:
        """A header block begun, or a HEADERS frame not yet whole: the sweep's clock for it (``check``)."""
        self.head_since = self.proxy.now

    def headers_frame(self, stream_id: int, headers: list[h2.Header], end: bool) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:  # a second header block: trailers
            problem = rules.trailers_problem(headers, end)
            return self._stream_error(stream_id, h2.PROTOCOL_ERROR) if problem else super().headers_frame(
                stream_id, headers, end)
        if stream_id % 2 == 0 or stream_id <= self.last_peer_stream:
            closed = self._closed.get(stream_id)
            if closed is None:
                return self.fail(h2.PROTOCOL_ERROR, f"a new stream {stream_id} not above {self.last_peer_stream}")
            return None if closed else self.fail(h2.STREAM_CLOSED, f"HEADERS on closed stream {stream_id}")
        self.last_peer_stream = stream_id
        if self._gone_away is not None and stream_id > self._gone_away:  # sent after our GOAWAY: the client retries
            return self._stream_error(stream_id, h2.REFUSED_STREAM)  # it elsewhere (RFC 9113 6.8), not processed
        if len(self.streams) >= self.max_streams:
            self.proxy.refused("connection_stream_limit")
            return self._stream_error(stream_id, h2.REFUSED_STREAM)  # SETTINGS_MAX_CONCURRENT_STREAMS said so
        problem, method, path, length = rules.request_head(headers)
        if problem is not None:
            return self._stream_error(stream_id, h2.PROTOCOL_ERROR)  # a malformed request (RFC 9113 8.1.1)
        stream = Stream(stream_id, None, self)
        stream.ended, stream.expected = end, length
        self.streams[stream_id] = stream
        self._idle_at = None
        if self.refused:
            limit = self.proxy.limits().max_connections
            self.answer(stream, h2.RESOURCE_EXHAUSTED, f"the router has reached its client connection limit on the "
                                                       f"gRPC listener (maxConnections={limit}); retry later",
                        request_ended=end)
            self.go_away()
            return
        if method != b"POST":
            return self.not_grpc(stream, method)
        self.proxy.open_call(self, stream, headers, path, end)

    def not_grpc(self, stream: Stream, method: bytes) -> None:
        """Not a gRPC call (a browser, curl): HTTP 405 saying what this port takes; the stream stays half-closed
        until the client ends its side."""
        self.send_headers(stream, [(b":status", b"405"), (b"allow", b"POST"), (b"content-type", b"text/plain"),
                                   (b"content-length", str(len(NOT_GRPC)).encode())], method == b"HEAD")
        if method != b"HEAD":
            self.send_data(stream, NOT_GRPC, True)
        self.finish(stream)

    def on_held(self, size: int) -> None:
        """Answer bytes waiting for this client count in the listener's ``maxBufferedBytes`` budget (forced: they
        already arrived; new requests find less room)."""
        if size > 0:
            self.proxy.hold(size)
        else:
            self.proxy.release(-size)

    def idle(self, stream_id: int) -> bool:
        return stream_id > self.last_peer_stream or stream_id % 2 == 0

    def calm(self, reason: str, why: str) -> None:
        self.proxy.refused(reason)
        super().calm(reason, why)

    def answer(self, stream: Stream, code: int, message: str, extra: tuple[h2.Header, ...] = (),
               request_ended: bool = True) -> None:
        """A trailers-only answer from the router; the client's stream ends with it (and, if the client was
        still sending, an RST_STREAM NO_ERROR tells it to stop)."""
        self.send_headers(stream, h2.status_headers(code, message, extra), True)
        self.finish(stream, reset=not request_ended)

    def go_away(self) -> None:
        """Take no more streams; the sweep closes the connection ``LINGER_SECONDS`` after, once its calls ended."""
        if self._closing_at is None:
            self._closing_at, self._gone_away = self.proxy.now, self.last_peer_stream
            self.emit(h2.goaway(self.last_peer_stream, h2.NO_ERROR))

    def fail(self, code: int, why: str, stream_id: int = 0) -> None:
        if stream_id and code == h2.ENHANCE_YOUR_CALM:  # the client learns the limit it hit on its call
            self.emit(h2.headers_frames(stream_id, h2.encode(h2.status_headers(h2.RESOURCE_EXHAUSTED, why)), True))
            self.proxy.refused("header_too_large")
        super().fail(code, why, stream_id)

    def check(self, now: float, limits: Limits) -> None:
        """The sweep's visit: a preface or header block too slow, or a refused connection's linger, closes it."""
        if self.gone or self.transport is None:
            return
        timeout = limits.header_timeout
        started = self._opened_at if self._opened_at is not None else self.head_since
        if timeout is not None and started is not None and now - started > timeout:
            self.proxy.refused("header_timeout")
            self.fail(h2.ENHANCE_YOUR_CALM, f"no complete request head within headerTimeoutSeconds={timeout:g}")
        elif self._closing_at is not None:
            if now - self._closing_at > LINGER_SECONDS and not (self.streams and self.proxy.closing):
                self.transport.close()  # (a router stopping lets the calls in progress finish first)
        elif self.streams:
            self._idle_at = None
        elif self._idle_at is None:
            self._idle_at = now
        elif (idle := self.proxy.context.settings.grpc_idle_timeout_seconds) is not None and now - self._idle_at > idle:
            self.proxy.refused("idle_timeout")
            self.go_away()

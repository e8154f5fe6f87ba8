"""The client side of the HTTP listener: one asyncio Protocol per connection, parsed once by llhttp.

llhttp (through httptools) is strict: conflicting Content-Length and
Transfer-Encoding, duplicate lengths, bad chunk framing and bad tokens all
fail the parse, and the client gets a JSON 400 before the connection closes.
Heads are bounded (431), bodies by ``maxBodyBytes`` (413), and every byte
held counts against the listener's budget (``Listener.charge``, 503 when
full) until its request is answered. While a head is parsed the proxy keeps
only what it needs: the end-to-end headers as they came, the session key
from the configured headers, the Content-Type and Content-Encoding.
Requests are answered one at a time in arrival order (keep-alive and
pipelining); reading pauses while too many wait, and the next request waits
while the client's write buffer is above its high-water mark, so a client that
pipelines and never reads holds at most one answer beyond that mark. The
listener's sweep calls ``check``: idle connections close, slow heads and bodies
get 408, a client that reads nothing for ``WRITE_STALL_SECONDS`` is cut.
"""
from __future__ import annotations

import asyncio
import collections
from collections.abc import Coroutine
from typing import TYPE_CHECKING

import httptools

from ...errors import RouterError
from ...listener import BODY_GRACE_SECONDS
from .. import wire
from ..wire.request import (
    CONNECTION,
    EXPECT,
    HOST,
    KEY,
    LENGTH,
    MARK,
    TRANSFER,
    TYPE,
    HttpRequest,
    head_error,
    header_kinds,
)
from ..wire.routes import connection_tokens

if TYPE_CHECKING:
    from ...listener import Limits
    from .listener import HttpListener
    from .relay import Exchange

MAX_HEAD = 64 * 1024  # request line + headers, and a chunked body's trailers apart; more is a 431
MAX_HEADERS = 100  # header fields in a head (Envoy's max_headers_count); more is a 431
# What holding a request costs beyond its bytes (its objects: measured with tracemalloc, about 430 bytes for a
# request and 95 for a header field), charged to the budget with its head: a client pipelining thousands of tiny
# requests in one read, or sending tiny headers, is bounded by maxBufferedBytes like one sending big ones.
HELD_PER_REQUEST, HELD_PER_FIELD = 512, 128
IDLE_SECONDS = 75.0  # a client connection with nothing in flight is closed after this long without a byte
LINGER_SECONDS = 2.0  # after a last answer, unread request bytes are drained this long before closing
MAX_QUEUED = 16  # pipelined requests waiting before reading pauses
WRITE_HIGH_WATER = 256 * 1024  # client write buffer above which the replica's stream and the next request wait
WRITE_STALL_SECONDS = 60.0  # writes paused this long without the client draining: cut (nginx's send_timeout)


class ClientConnection(asyncio.Protocol):
    """Parses requests off one client connection and hands them, in order, to ``Listener.handle``."""

    def __init__(self, listener: HttpListener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # looked up once here, not per request (getpid on 3.11)
        self.exchange: Exchange | None = None  # the attempt whose response is being relayed, if any
        self.gone = False
        self.write_paused = False
        self._write_paused_at = 0.0  # the sweep's clock when writes last paused
        self._parser = httptools.HttpRequestParser(self)
        self._queue: collections.deque[HttpRequest] = collections.deque()
        self._request: HttpRequest | None = None
        self._key_names: frozenset[bytes] | None = None  # the listener's, when ``_kinds`` was built
        self._kinds: dict[bytes, int] = {}
        self._max_buffered = 0  # the budget's bound for the request being read
        self._busy = self._read_paused = self._broken = self._lingering = False
        self.active_at = listener.now  # the sweep's clock at the last byte read or answer written
        self._in_head, self._head_bytes = True, 0
        self._head_at: float | None = None  # the sweep's clock when the head being read began
        self._body_at: float | None = None  # ... when the body being read began

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes
        self.loop = asyncio.get_running_loop()
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        self._head_at = self.listener.now  # a new connection owes its first head as any other
        admitted = self.listener.admit()
        self.listener.clients.add(self)  # a refused one too, until it is closed: it holds a descriptor
        if not admitted:
            self.refuse()

    def refuse(self) -> None:
        """A connection beyond ``maxConnections``: a 503, then closed."""
        assert self.transport is not None
        self.write(wire.error_answer(503, "the router has reached its client connection limit "
                                          f"(maxConnections={self.listener.limits().max_connections}); "
                                          "retry later", close=True))
        self._linger(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        self._drop_queue()
        if self._request is not None:
            self._uncharge(self._request)
        self.listener.clients.discard(self)
        if self.exchange is not None:
            self.exchange.client_gone()

    def pause_writing(self) -> None:
        self.write_paused = True
        self._write_paused_at = self.listener.now
        if self.exchange is not None:
            self.exchange.pause_upstream()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.exchange is not None:
            self.exchange.resume_upstream()
        self._next()  # a pipelined request held back while the client was not reading

    def data_received(self, data: bytes) -> None:
        if self._broken:
            return  # lingering or refused: drained and dropped
        self.active_at = self.listener.now
        in_head, request = self._in_head, self._request
        if in_head:
            self._head_bytes += len(data)
        else:  # in a body: a read that brings none of it is framing or trailers (``_count_trailers``)
            size = request.size if request is not None else 0
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # an upgrade's request is answered, then the connection closed
            if self._request is not None:  # (marked ``close_after`` at its head, ``on_headers_complete``)
                self._message_done()
            self._stop_reading()
        except httptools.HttpParserError as error:
            self._reject(RouterError(400, f"malformed HTTP request: {error}"))
            return
        if not in_head and request is not None and request is self._request and not self._in_head:
            self._count_trailers(request, size, len(data))
        request = self._request
        if self._in_head and request is not None:  # a head cut across reads holds what came so far
            if request.head:
                self._charge(request, 0)
            if len(request.headers) > MAX_HEADERS:
                self._reject(_too_many_headers())
                return
        if self._head_bytes > MAX_HEAD:  # the head so far, or once it is complete the trailers so far
            what = "head exceeds" if self._in_head else "trailers exceed"
            self._reject(RouterError(431, f"request {what} {MAX_HEAD} bytes"))

    def _count_trailers(self, request: HttpRequest, size: int, read: int) -> None:
        """After a body's last chunk, trailer bytes count against ``MAX_HEAD`` as they come, not only as whole
        fields (``on_header``): llhttp holds a field that never ends itself. A read that brought body bytes
        starts the count again (trailers come after the whole body), so chunk framing never adds up."""
        if request.size == size:
            self._head_bytes += read
        else:
            self._head_bytes = 0

    # llhttp callbacks
    def on_message_begin(self) -> None:
        limits = self.listener.limits()
        self._request = HttpRequest(limits.max_body_bytes)
        self._max_buffered = limits.max_buffered_bytes
        names = self.listener.key_names()[1]
        if names is not self._key_names:
            self._key_names, self._kinds = names, header_kinds(names)
        self._head_at = self.listener.now

    def on_url(self, url: bytes) -> None:
        request = self._request
        assert request is not None
        request.target += url
        request.head += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Keep what forwarding needs: one lookup sorts the name (most are none of these: kept as they came)."""
        if not self._in_head:  # a trailer after a chunked body: read and dropped (the body goes on with a length)
            self._head_bytes += len(name) + len(value)
            return
        request = self._request
        assert request is not None
        request.head += len(name) + len(value)
        lower = name.lower()
        kind = self._kinds.get(lower)
        if kind is None:
            request.headers.append((name, value))
        elif kind >= KEY:  # forwarded, and read
            request.headers.append((name, value))
            if kind == KEY:
                if request.keys is None:
                    request.keys = {}
                request.keys.setdefault(lower, value)
            elif kind == TYPE:
                request.content_type = value
            else:
                request.content_encoding = value
        elif kind == HOST:  # hop-by-hop from here on, Host among them: the replica gets its own
            request.hosts += 1
        elif kind == MARK:  # read, never forwarded (``wire/request.py``, MARK)
            if request.keys is None:
                request.keys = {}
            request.keys.setdefault(lower, value)
        elif kind == CONNECTION:
            request.connection = value if request.connection is None else request.connection + b"," + value
        elif kind == TRANSFER:
            request.has_body = True
            if value.strip().lower() != b"chunked":
                request.error = RouterError(400, f"unsupported Transfer-Encoding {value.decode('latin-1')!r}; "
                                                 "only chunked is accepted")
        elif kind == EXPECT:
            request.expect = value.strip().lower() == b"100-continue"
        elif kind == LENGTH:
            request.has_body = value.strip() != b"0"
            self._check_length(request, int(value))

    def on_headers_complete(self) -> None:
        request = self._request
        assert request is not None
        if request.charged + request.head > MAX_HEAD:  # a whole head in one read: never seen by data_received
            request.error = RouterError(431, f"request head exceeds {MAX_HEAD} bytes")
        elif len(request.headers) > MAX_HEADERS:
            request.error = _too_many_headers()
        self._charge(request, HELD_PER_REQUEST + HELD_PER_FIELD * len(request.headers))
        self._in_head, self._head_at, self._body_at = False, None, self.listener.now
        self._head_bytes = 0  # from here it counts the trailers
        parser = self._parser
        request.method = parser.get_method()
        request.head_only = request.method == b"HEAD"
        request.keep_alive = parser.should_keep_alive()
        request.path = request.target.partition(b"?")[0].decode("utf-8", "surrogateescape")
        request.error = request.error or head_error(request, parser)
        if request.connection is not None:
            named = connection_tokens(request.connection)
            if named:
                request.headers = [(n, v) for n, v in request.headers if n.lower() not in named]
            if b"upgrade" in named:  # not offered: answered over HTTP/1.1, then closed (llhttp reads no further)
                request.close_after = True
        if request.error is not None:
            self._message_done()  # answer now without reading a body we will not forward
            self._stop_reading()
        elif request.expect:  # the body is read here before any replica is chosen
            if parser.get_http_version() == "1.1":
                self._continue()
            else:
                request.expect = False  # HTTP/1.0 has no 100 Continue

    def _continue(self) -> None:
        """``100 Continue`` to the request whose head asked for it, once the requests before it are answered (its
        body waits for it: a client pipelining one behind another would wait until its body timed out)."""
        request = self._request
        if request is None or not request.expect or self._busy or self._queue or request.size:
            return
        request.expect = False
        self.write(wire.CONTINUE)
        self._body_at = self.listener.now  # the body's clock starts when it was asked for

    def on_body(self, body: bytes) -> None:
        request = self._request
        if request is None or request.error is not None:
            return
        request.size += len(body)
        if request.size > request.limit:
            request.error = RouterError(413, f"request body exceeds maxBodyBytes={request.limit}")
        elif self._charge(request, len(body)):
            pieces = request.body
            assert isinstance(pieces, list)
            if not pieces:
                pieces.append(body)
            else:  # in pieces (chunks, reads): one growing buffer, not an object held per piece
                if type(pieces[0]) is bytes:
                    pieces[0] = bytearray(pieces[0])
                pieces[0] += body
            return
        self._message_done()
        self._stop_reading()

    def on_message_complete(self) -> None:
        if self._request is not None:
            self._message_done()
        self._in_head, self._head_bytes, self._body_at = True, 0, None

    # the budget of request bytes
    def _check_length(self, request: HttpRequest, length: int) -> None:
        """Refuse a declared body that cannot fit before reading any of it."""
        if length > request.limit:
            request.error = RouterError(413, f"request body of {length} bytes exceeds maxBodyBytes={request.limit}")
        elif self.listener.share.budget.held + request.head + length > self._max_buffered:  # bound: on_message_begin
            request.error = self._budget_error()

    def _charge(self, request: HttpRequest, size: int) -> bool:
        """Count ``size`` bytes held for ``request``, and its head bytes not counted yet (``request.head``: a
        head is charged at its end, or at the end of a read that brings part of it); when the budget is full,
        mark it 503 instead. The bound is read once per request (``on_message_begin``): this runs for each head
        and each piece of body.
        """
        size, request.head = size + request.head, 0
        error = request.error
        if error is not None and error.reason == "buffer_full":
            return False
        if self.listener.share.charge(size, self._max_buffered):
            request.charged += size
            return True
        request.error = self._budget_error()
        return False

    def _budget_error(self) -> RouterError:
        limit = self.listener.limits().max_buffered_bytes
        return RouterError(503, f"the router holds its limit of buffered request bytes (maxBufferedBytes={limit}); "
                                "retry later", reason="buffer_full")

    def _uncharge(self, request: HttpRequest) -> None:
        self.listener.release(request.charged)
        request.charged = 0

    def _drop_queue(self) -> None:
        for request in self._queue:
            self._uncharge(request)
        self._queue.clear()

    # queueing and answering
    def _message_done(self) -> None:
        request, self._request = self._request, None
        assert request is not None
        body = request.body
        assert isinstance(body, list)
        request.body = bytes(body[0]) if body else b""
        if request.error is not None:
            request.close_after = True
        self._queue.append(request)
        if len(self._queue) > MAX_QUEUED and not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()
        self._next()

    def _next(self) -> None:
        if self._busy or not self._queue or self.gone or self.write_paused:
            return
        self._busy = True
        self.listener.dispatch(self, self._queue.popleft())

    def answer_later(self, request: HttpRequest, answering: Coroutine[None, None, None]) -> None:
        """Answer ``request`` in a Task running ``answering`` (the listener's ``handle``), then ``answered``."""
        assert self.loop is not None  # connected: requests arrive only after connection_made
        self.loop.create_task(self._answer(request, answering))

    async def _answer(self, request: HttpRequest, answering: Coroutine[None, None, None]) -> None:
        try:
            await answering
        finally:
            self.answered(request)

    def answered(self, request: HttpRequest) -> None:
        """``request`` has its whole answer: its bytes leave the budget, then the next request starts, or the
        connection closes (not once it is cut: ``abort``)."""
        self._uncharge(request)
        self._busy = False
        self.active_at = self.listener.now
        transport = self.transport
        if transport is not None and not self.gone and not transport.is_closing():
            if request.close_after or not request.keep_alive:
                self._drop_queue()
                self._linger(transport)
            else:
                if self._read_paused and len(self._queue) <= MAX_QUEUED // 2:
                    self._read_paused = False
                    transport.resume_reading()
                self._next()
                if self._request is not None and self._request.expect:
                    self._continue()

    def last_in_line(self) -> bool:
        """No request read or being read behind the one being answered (stopping: its answer closes)."""
        return not self._queue and self._request is None

    def close_if_idle(self, idle_before: float) -> None:
        """Stopping: close the connection (FIN, then what the client still sends is drained) if nothing has
        happened on it since ``idle_before`` (the sweep's clock) and no request is being read, queued or answered
        here (that one closes it after its answer)."""
        if self._idle() and self.active_at < idle_before and self.transport is not None \
                and not self.transport.is_closing():
            self._linger(self.transport)

    def _idle(self) -> bool:
        """Nothing read, queued, answered or paused here: the connection can change hands."""
        return not (self._busy or self._queue or self._request is not None or self._broken or self._read_paused
                    or self.write_paused or self.gone)

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close after the last answer without losing it: send FIN, then drain what the client still sends.

        Closing with unread bytes would reset the connection, and a client still
        uploading a body we refused (413) could lose our answer with it.
        """
        self._broken = True
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._lingering = True
        self.active_at = self.listener.now
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()

    def eof_received(self) -> bool:
        """A client's FIN means it is gone (as aiohttp and uvicorn take it): what it waits for is cancelled."""
        return False

    def check(self, now: float, limits: Limits) -> None:
        """The sweep's visit: close an idle connection, answer 408 to a head or body arriving too slowly."""
        if self.gone:
            return
        if self._expired(now):
            if self.transport is not None:
                self.transport.close()
        elif self.write_paused and now - self._write_paused_at > WRITE_STALL_SECONDS:
            self.listener.write_stalls.inc()
            self.abort()  # what it left unread is lost anyway; the descriptor and buffers come back
        elif not self._broken and not self._read_paused:  # paused: the wait is ours, not the client's
            error = self._late(now, limits)
            if error is not None:
                self._reject(error)

    def _expired(self, now: float) -> bool:
        """Nothing in flight and no byte for too long (a lingering close waits less)."""
        if self._busy or self._queue:
            return False
        return now - self.active_at > (LINGER_SECONDS if self._lingering else IDLE_SECONDS)

    def _late(self, now: float, limits: Limits) -> RouterError | None:
        if self._head_at is not None and limits.header_timeout is not None \
                and now - self._head_at > limits.header_timeout:
            return RouterError(408, f"request head not complete within headerTimeoutSeconds={limits.header_timeout:g}",
                               reason="header_timeout")
        if self._body_at is None or self._request is None:
            return None
        elapsed = now - self._body_at
        if limits.body_timeout is not None and elapsed > limits.body_timeout:
            return RouterError(408, f"request body not complete within bodyTimeoutSeconds={limits.body_timeout:g}",
                               reason="body_timeout")
        rate = self._request.size / elapsed if elapsed > BODY_GRACE_SECONDS else None
        if rate is not None and rate < limits.min_body_rate:
            return RouterError(408, f"request body arrives at {rate:.0f} bytes/s, slower than "
                                    f"minBodyBytesPerSecond={limits.min_body_rate}", reason="body_too_slow")
        return None

    def _reject(self, error: RouterError) -> None:
        """A request we cannot parse or wait for: answer it after those before it, then close."""
        request = self._request or HttpRequest(0)
        request.error, request.close_after = request.error or error, True
        self._head_at = self._body_at = None
        self._request = request
        self._message_done()
        self._stop_reading()

    def _stop_reading(self) -> None:
        self._broken = True
        if self.transport is not None and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def write(self, data: bytes) -> None:
        if not self.gone and self.transport is not None:
            self.transport.write(data)

    def abort(self) -> None:
        """Cut the connection: the only way to tell a client that a response of known length broke off."""
        self._broken = True
        if self.transport is not None:
            self.transport.abort()

    def interim(self, head: bytes) -> None:
        """An informational (1xx) response, relayed to HTTP/1.1 clients only."""
        if self._parser.get_http_version() == "1.1":
            self.write(head)


def _too_many_headers() -> RouterError:
    return RouterError(431, f"request head has more than {MAX_HEADERS} header fields")

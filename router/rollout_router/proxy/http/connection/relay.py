"""One attempt on one replica: the request's bytes out, the response relayed to the client as it arrives.

The response head is parsed once (llhttp) and the client's built once per shape
(``heads``); body bytes pass through untouched for Content-Length responses and
are re-framed as chunks otherwise. A small
non-streaming answer of known length is held until complete and written in
one piece, so a replica that breaks off mid-body still gets the client a JSON
502; anything else streams, and a stream that breaks ends with an SSE error
event (or a cut connection when the client was promised a length). Whatever
one read of the replica brings is written to the client in one write. The
client's write buffer above its high-water mark pauses reading the replica
until it drains (and the replica's socket fills in turn), so a slow reader
never makes the router buffer a stream.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import httptools

from ....health import CLOSED, INVALID_RESPONSE, TIMEOUT
from ....replicas import Replica
from ...attempts import Refused, refused_or_short
from ...errors import error_body
from ...turns import TAIL_BYTES, Turn
from .. import wire
from ..wire.heads import lines, remembered
from .upstream import ReplicaPool, UpstreamConnection

if TYPE_CHECKING:
    from ...outcome import Routing
    from ..wire.request import HttpRequest
    from .client import ClientConnection
    from .port import Port

log = logging.getLogger(__name__)

BUFFER_LIMIT = 1 << 20  # non-streaming bodies of known length up to this size are relayed in one piece
MAX_RESPONSE_HEAD = 64 * 1024  # a replica's response head, in bytes read before it ends; more is a 502
MAX_RESPONSE_FIELDS = 100  # ... and in header fields (vLLM sends five)
SSE_DONE = b"data: [DONE]"
DONE_TAIL = len(SSE_DONE) + 4  # the stream's last bytes kept to find SSE_DONE (and the blank line after it)
CLIENT_CLOSED = 499  # nginx's code for "client went away", used in metrics only
STALE = "stale"  # result of an attempt whose reused connection was closed before any answer
UNREACHED = "unreached"  # result of a forward to the session's owner router that closed before any byte

# Exchange states
WAITING, BUFFERING, STREAMING, DONE = range(4)


class Exchange:
    """One request on one upstream connection; the connection's parser calls back into it."""

    __slots__ = ("proxy", "client", "request", "replica", "conn", "reused", "done", "state", "code",
                 "status", "reason", "headers", "head", "buffer", "out", "chunked", "sse", "done_seen", "tail",
                 "interim", "until_close", "seen", "swept", "silent", "paused", "timed_out", "failure", "forwarded",
                 "turn", "usage_tail", "on_done", "first_at", "length", "head_bytes", "feeding", "ending", "bare")

    def __init__(self, proxy: Port, client: ClientConnection, request: HttpRequest, replica: str,
                 conn: UpstreamConnection, reused: bool, forwarded: bool = False, turn: Turn | None = None,
                 on_done: Callable[[Exchange, str | None], None] | None = None) -> None:
        self.proxy, self.client, self.request, self.replica = proxy, client, request, replica
        self.turn = turn  # stamped with the first body byte; its answer's tail is read when it is measured
        self.first_at = 0.0  # when the first body byte came (0: none yet): a kept turn with no ``Turn`` records it
        self.usage_tail: bytes | None = b"" if turn is not None and turn.measure else None
        self.forwarded = forwarded  # to the owner router (fleet): its head already names the replica
        self.conn, self.reused = conn, reused
        # Who learns the end: a callback (the traffic listener's fast path, no Task waiting), else a future.
        self.on_done = on_done
        self.done: asyncio.Future[str | None] | None = None
        if on_done is None:
            assert client.loop is not None
            self.done = client.loop.create_future()
        self.state, self.status, self.reason = WAITING, 0, b""
        self.code: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []  # the replica's head as it came, but for Content-Length:
        self.length: bytes | None = None  # its value (``UpstreamConnection.on_header``)
        self.head = b""
        self.buffer: list[bytes] = []
        self.out: list[bytes] = []
        self.chunked = self.sse = self.done_seen = self.interim = self.until_close = False
        self.paused = self.timed_out = False
        self.failure: str | None = None  # why the replica failed before its response head (passive health)
        self.tail = b""
        self.seen, self.swept, self.silent = 0, 0, 0.0
        self.head_bytes = 0  # read while the response head had not ended
        self.bare = 0  # read since the last body bytes, once the head has ended: chunk framing, then trailers
        self.feeding = False  # in the parser's callbacks
        self.ending: tuple[bool, str | None] | None = None  # finished there: ended once the read is parsed

    def start(self, data: bytes) -> None:
        self.conn.exchange = self.client.exchange = self
        self.proxy.active.add(self)
        self.conn.write(data)

    # bytes from the replica
    def feed(self, data: bytes) -> None:
        self.seen += 1
        self.feeding = True
        state, pieces = self.state, len(self.out) + len(self.buffer)
        try:
            self.conn.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.fail("switched protocols, which the router does not relay", None)
        except httptools.HttpParserError as error:
            if self.state != DONE:
                self.fail(f"sent an invalid response ({error})", INVALID_RESPONSE)
            self.conn.surplus = True  # bytes after the answer: the connection is not to be trusted
        self.feeding = False
        ending = self.ending
        if ending is not None:  # the answer ended in this read, which is parsed to its end now
            self.ending = None
            self._end(ending[0] and not self.conn.surplus, ending[1])
        elif self.state == WAITING:  # a head that has not ended yet
            self.head_bytes += len(data)
            if self.head_bytes > MAX_RESPONSE_HEAD or len(self.headers) > MAX_RESPONSE_FIELDS:
                self.fail(self._head_too_big(), INVALID_RESPONSE)
        elif state == self.state and len(self.out) + len(self.buffer) == pieces:  # no body bytes in this read
            self._count_bare(len(data))
        else:
            self.bare = 0
        self.flush()

    def _count_bare(self, read: int) -> None:
        """Trailers are bounded as the head is: llhttp holds a field that never ends itself, and a replica sending
        trailers for ever would be read for ever. Reads without body bytes count; body bytes start again."""
        self.bare += read
        if self.bare > MAX_RESPONSE_HEAD:
            self.fail(f"sent over {MAX_RESPONSE_HEAD} bytes after its body's last bytes (trailers)", INVALID_RESPONSE)

    def _head_too_big(self) -> str:
        return f"sent a response head over {MAX_RESPONSE_HEAD} bytes or {MAX_RESPONSE_FIELDS} header fields"

    def on_headers_complete(self) -> None:
        parser = self.conn.parser
        status, headers, self.headers = parser.get_status_code(), self.headers, []
        if len(headers) > MAX_RESPONSE_FIELDS:  # a whole head in one read
            return self.fail(self._head_too_big(), INVALID_RESPONSE)
        if status == 101:
            return self.fail("answered 101 Switching Protocols, which the router does not relay", INVALID_RESPONSE)
        if status < 200:
            self.interim, self.length = True, None
            if status != 100:  # the body went out with the head; 103 and the like are the client's
                self.client.interim(wire.status_line(status, self.reason) + lines(headers) + b"\r\n")
            return
        self.status = status
        request = self.request
        version = None if self.forwarded else self.proxy.context.rl.versions.get(self.replica)
        sent_length = self.length
        built = remembered(status, self.reason, headers, sent_length is not None, parser.should_keep_alive(), request,
                           self.replica, self.forwarded, version)
        head, after, self.sse, self.chunked, self.until_close, close_after = built
        length = None
        if sent_length is not None:
            head, length = b"%sContent-Length: %s\r\n%s" % (head, sent_length, after), int(sent_length)
        request.close_after = close_after
        if request.head_only:
            self.out.append(head)
            self.code = status
            reusable = parser.should_keep_alive()
            self.conn.reset()  # the parser still expects the body a GET would have had
            self.finish(reusable)
        elif length is not None and length <= BUFFER_LIMIT and not self.sse:
            self.state, self.head = BUFFERING, head
        else:
            self.state = STREAMING
            self.out.append(head)
            if self.client.write_paused:
                self.pause_upstream()

    def on_body(self, body: bytes) -> None:
        """Runs for every event of a stream: the first-byte stamp is a number read, not worked out per event."""
        if not self.first_at:  # a stream's first event, not its head
            self.first_at = now = time.monotonic()
            if self.turn is not None:
                self.turn.first(now)
        if self.state == BUFFERING:
            self.buffer.append(body)
            return
        # wire.chunk's framing, written here
        self.out.append(b"%x\r\n%s\r\n" % (len(body), body) if self.chunked else body)
        if self.usage_tail is not None:
            self.usage_tail = (self.usage_tail + body)[-TAIL_BYTES:]
        if self.sse and not self.done_seen:
            # The client has the whole answer at `data: [DONE]`: OpenAI clients hang up right there,
            # before the replica's end of body, and that is a success, not a 499. Only the stream's last
            # DONE_TAIL bytes count: a chunk shorter than that is joined to the last bytes before it.
            if len(body) < DONE_TAIL:
                body = (self.tail[-DONE_TAIL:] + body)[-DONE_TAIL:]
            self.tail = body
            if b"[DONE]" in body and body[-DONE_TAIL:].rstrip().endswith(SSE_DONE):
                self.done_seen = True

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.state == DONE:
            return
        if self.state == BUFFERING:
            body = b"".join(self.buffer)
            self.out.append(self.head + body)
            if self.usage_tail is not None:
                self.usage_tail = body[-TAIL_BYTES:]
        elif self.chunked:
            self.out.append(wire.LAST_CHUNK)
        self.code = self.status
        self.finish(reusable=self.conn.parser.should_keep_alive())

    # endings
    def upstream_lost(self, exc: Exception | None) -> None:
        """The replica's connection closed under this exchange."""
        if self.state == DONE:
            return
        if self.state == STREAMING and self.until_close and exc is None:
            self.on_message_complete()  # a body delimited by the close has ended
        elif self.seen == 0 and self.reused:
            self.finish(reusable=False, result=STALE)
        elif self.seen == 0 and self.forwarded:
            self.finish(reusable=False, result=UNREACHED)
        else:
            self.fail(f"closed the connection ({type(exc).__name__ if exc else 'EOF'})")
        self.flush()

    def timeout(self) -> None:
        """The sweep found the replica silent too long (``firstByteTimeoutSeconds`` before the head, else
        ``upstreamTimeoutSeconds``)."""
        self.timed_out = True
        self.fail("timed out", TIMEOUT)
        self.flush()

    def client_gone(self) -> None:
        """The client hung up: stop the replica's work at once; a stream read to [DONE] still counts as done."""
        if self.state == DONE:
            return
        self.out.clear()
        self.code = self.status if self.done_seen else CLIENT_CLOSED
        self.finish(reusable=False)

    def fail(self, what: str, reason: str | None = CLOSED) -> None:
        """The replica failed this exchange: tell the client as well as the state of its response allows.

        ``reason`` is what passive health counts against the replica when no response head had arrived.
        """
        if self.state == DONE:
            return
        if self.state == WAITING:
            self.failure = reason
        answer, self.code = failure_answer(self.proxy, self.replica, self.request, self.state, what, self.timed_out,
                                           self.sse and self.chunked, self.forwarded)
        if answer is None:
            self.flush()
            self.client.abort()
        else:
            self.out.append(answer)
        self.finish(reusable=False)

    def finish(self, reusable: bool, result: str | None = None) -> None:
        """Detach from both connections and wake the attempt; the connection goes back to the pool if it can.

        A callback is called after the answer so far is written: it may start the client's next request, or
        close its connection."""
        self.state = DONE
        if self.usage_tail and self.turn is not None and self.code is not None and self.code < 400:
            self.turn.answer(self.usage_tail, self.replica)  # a whole answer (a stream read to [DONE] counts)
        conn = self.conn
        if conn.exchange is self:
            conn.exchange = None  # what else the read brings is nobody's (``UpstreamConnection.surplus``)
        if self.feeding:  # in the parser's callbacks: the rest of the read must hold nothing more
            self.ending = (reusable, result)
        else:
            self._end(reusable, result)

    def _end(self, reusable: bool, result: str | None) -> None:
        conn = self.conn
        if reusable and not conn.closed:
            if self.paused:
                conn.transport.resume_reading()  # type: ignore[union-attr]
            conn.pool.give_back(conn, self.proxy.now)
        else:
            conn.close()
        if self.client.exchange is self:
            self.client.exchange = None
        self.proxy.active.discard(self)
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            self.flush()
            on_done(self, result)
        elif self.done is not None and not self.done.done():
            self.done.set_result(result)

    def flush(self) -> None:
        out = self.out
        if out:
            self.client.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()

    # back-pressure
    def pause_upstream(self) -> None:
        if not self.paused and self.conn.transport is not None:
            self.paused = True
            self.conn.transport.pause_reading()

    def resume_upstream(self) -> None:
        if self.paused and self.conn.transport is not None:
            self.paused = False
            self.conn.transport.resume_reading()


def failure_answer(proxy: Port, replica: str, request: HttpRequest, state: int, what: str, timed_out: bool,
                   sse_chunked: bool, forwarded: bool = False) -> tuple[bytes | None, int]:
    """What a client is told when the replica fails its exchange in ``state``, counted: an error answer before a
    response head or while one was held, an SSE error event in a re-chunked stream, else None (the connection
    is cut, the only way to say an answer of known length broke off); and the code recorded. ``forwarded``: to
    the owner router, whose error names it."""
    metrics = proxy.context.metrics
    who = f"owner router {replica}" if forwarded else f"replica {replica}"
    tag = None if forwarded else replica
    if state == WAITING:
        status = 504 if timed_out else 502
        message = (f"{who} did not answer in time (firstByteTimeoutSeconds)" if timed_out else f"{who} failed: {what}")
        metrics.errors.labels("timeout" if timed_out else "upstream_error").inc()
        return proxy.error_bytes(status, message, request, tag), status
    metrics.errors.labels("upstream_broke_mid_response").inc()
    log.warning("replica %s broke off mid-response: %s", replica, what)
    if state == BUFFERING:
        return proxy.error_bytes(502, f"{who} broke off mid-response: {what}", request, tag), 502
    if sse_chunked:
        event = json.dumps(error_body(502, f"{who} failed mid-stream: {what}")).encode()
        return wire.chunk(b"data: " + event + b"\n\n") + wire.LAST_CHUNK, 502
    return None, 502


def request_bytes(request: HttpRequest, pool: ReplicaPool, headers: bytes) -> bytes:
    """The client's request as the replica gets it: its own head minus hop-by-hop headers, the same body."""
    body = request.body
    assert isinstance(body, bytes)
    length = b"Content-Length: %d\r\n" % len(body) if body or request.method not in (b"GET", b"HEAD") else b""
    return b"%s %s%s HTTP/1.1\r\nHost: %s\r\n%s%s\r\n%s" % (request.method, pool.prefix, request.target,
                                                          pool.host_header, headers, length, body)


Verdict = tuple[int | None, int, str | None, bool]  # an attempt's code, status, failure, accepted (``verdict``)
GONE: Verdict = (CLIENT_CLOSED, 0, None, True)  # the client left before anything was sent: it rejects nothing


async def attempt(proxy: Port, client: ClientConnection, request: HttpRequest, headers: bytes,
                  routing: Routing, fresh: bool = False) -> Verdict:
    """One attempt on the routed replica: how it ended (``verdict``: its code to record or None, the replica's
    status and failure, whether it accepted the request, its response head said < 400 or the client left first).
    Raises ``Refused`` (retry elsewhere: the connection was refused or timed out, nothing was sent).

    A reused keep-alive connection that the replica closed before answering is
    retried once on a fresh connection to the same replica (``fresh``: that retry, after the fast path's
    pooled connection went stale).
    """
    replica = routing.replica.id
    if client.gone:
        return GONE
    pool = proxy.pools.get(replica)

    async def send(conn: UpstreamConnection, reused: bool) -> Verdict | None:
        if not reused and client.gone:
            conn.close()
            return GONE
        exchange = Exchange(proxy, client, request, replica, conn, reused, turn=routing.turn)
        exchange.start(request_bytes(request, pool, headers))
        assert exchange.done is not None
        if await exchange.done == STALE:
            return None
        return verdict(exchange)

    try:
        return await pool.exchange(send, fresh)
    except OSError as error:
        raise connect_failure(routing.replica, error) from None


def connect_failure(replica: Replica, error: OSError) -> Exception:
    """What a failed connect to the routed replica raises: ``Refused`` (nothing was sent: as safe to retry as a
    refusal; a timeout also counts against the replica's health), or the router's own descriptor shortage."""
    if isinstance(error, TimeoutError):
        return Refused(f"connecting to {replica.id} timed out", TIMEOUT)
    return refused_or_short(error, str(error))


def verdict(exchange: Exchange) -> Verdict:
    """An ended exchange's code to record, the replica's status and failure for passive health (a failure before a
    response head, or a 5xx head, counts towards ejection), and whether the replica accepted the request."""
    return exchange.code, exchange.status, exchange.failure, accepted(exchange)


def accepted(exchange: Exchange) -> bool:
    """``answer_accepted`` for an attempt relayed here."""
    return answer_accepted(exchange.status, exchange.failure, exchange.code)


def answer_accepted(status: int, failure: str | None, code: int | str | None) -> bool:
    """The replica's own head said < 400 (``status``; 0: none came), or the client left before any verdict (which
    rejects nothing): every path's rule (the native lane's glue asks it too)."""
    if status:
        return status < 400
    return failure is None and code == CLIENT_CLOSED

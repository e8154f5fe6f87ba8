"""One gRPC call relayed: the client's stream on the listener joined to a stream on a replica (or owner router).

Everything passes as bytes: request DATA frames go to the replica as they
arrive (a one-message call's, vLLM's, once its message is whole: it is
routed then, so a stream reset before that costs no replica anything), response HEADERS, DATA and trailers come back the same way, with
``x-rolloutrouter-replica`` added to the response head. Nothing waits on a
task per message: frames are relayed from the connections' read callbacks,
and the call's own task only routes it and waits for its end.

Request bytes are counted against the listener's budget from arrival until
written to the replica; while a retry is still possible (no response yet, at
most ``REPLAY_LIMIT`` bytes) they are kept, and counted, so a refused attempt
can be replayed elsewhere. Each request message's length prefix is checked
against ``maxBodyBytes`` before its bytes are held.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...health import CLOSED, TIMEOUT
from . import h2
from .usage import LastMessage

if TYPE_CHECKING:
    from ..turns import Turn
    from .outbound import Stream
    from .server import ClientConnection
    from .traffic import GrpcProxy
    from .upstream import UpstreamConnection

log = logging.getLogger(__name__)

REFUSED = "refused"  # an attempt's outcome: the replica never saw the call; safe to send elsewhere
REPLAY_LIMIT = 4 << 20
REPLICA = b"x-rolloutrouter-replica"
WEIGHT_VERSION = b"x-weight-version"  # the answering replica's last reported weight_version (/v1/rl), as HTTP's
ROUTER_ANSWER = ((b"x-rolloutrouter-answered", b"router"),)  # on the router's own answers
# Connection-specific fields never cross a hop (RFC 9113 8.2.2); the pseudo-fields are rebuilt.
HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade", b"host", b"te"})
_RESET_STATUS = {h2.CANCEL: h2.CANCELLED, h2.REFUSED_STREAM: h2.UNAVAILABLE}


class PyCallFields:
    """The fields of a call the frame engine reads and writes as it relays its messages, its response head and its
    trailers (``Call`` sets them): the reference of ``_grpc_frames.CallFields`` (the same fields in C), which is
    ``Call``'s base where the engine runs, so that it reads and writes them without the C API's attribute lookups."""

    __slots__ = ("client", "stream", "upstream", "ustream", "turn", "last", "code", "first", "relayed", "answered",
                 "finished", "heard", "first_at")


if TYPE_CHECKING or h2.engine_call_fields is None:
    CallFields = PyCallFields
else:
    CallFields = h2.engine_call_fields


class Call(CallFields):
    __slots__ = ("proxy", "path", "metadata", "mark", "single", "chunks", "received", "written", "acked", "held",
                 "retained", "request_ended", "ended", "failure", "name", "forwarded", "waiting_since", "started_at",
                 "message_left", "prefix", "client_gone", "swept", "silent", "backlog", "started")

    def __init__(self, proxy: GrpcProxy, client: ClientConnection, stream: Stream, path: bytes,
                 metadata: list[h2.Header], single: bool, mark: bytes | None) -> None:
        self.proxy, self.client, self.stream = proxy, client, stream
        self.path, self.metadata, self.single = path, metadata, single
        self.mark = mark  # the fleet's hop mark the call came with: read, not in ``metadata``
        self.chunks: list[bytes] = []  # request bytes kept for a replay
        self.received = self.written = self.acked = self.held = 0
        self.retained, self.request_ended = True, False
        self.upstream: UpstreamConnection | None = None
        self.ustream: Stream | None = None
        self.ended: Callable[[str | None], None] | None = None  # told how the attempt in progress ended, once
        self.answered = self.first = self.finished = self.forwarded = self.client_gone = self.relayed = False
        self.code: int | None = None
        self.failure: str | None = None  # why the replica failed before answering (passive health)
        self.name = ""  # the replica (or owner router) of the current attempt
        self.waiting_since: float | None = None  # the sweep's clock when the whole request was sent
        self.started_at = proxy.now
        self.message_left, self.prefix = 0, b""
        self.heard = self.swept = 0  # frames from the replica, and how many the sweep had seen
        self.silent = 0.0  # seconds the sweep found no new frame from the replica
        self.backlog = 0  # response bytes relayed but not yet handed to the client's connection
        self.turn: Turn | None = None  # the attempt's turn: stamped with the first response message (turns.py)
        self.first_at = 0.0  # with no turn (a kept turn not measured): when the first response message came
        self.last: LastMessage | None = None  # the newest response message, when the turn is measured
        self.started = False  # routed (GrpcProxy.begin): a one-message call waits for its whole message
        stream.owner = self

    # the client's side
    def on_data(self, stream: Stream, data: bytes, end: bool) -> None:
        if stream is self.ustream:
            turn = self.turn
            if turn is not None:
                if turn.first_byte is None:
                    turn.first(time.monotonic())  # the first response message (a stream's first tokens)
            elif not self.first:
                self.first_at = time.monotonic()  # a kept turn with no ``Turn`` (unmeasured): its first message
            self.first = self.relayed = True
            self.heard += 1
            self.backlog += len(data)
            if self.last is not None:
                self.last.feed(data)
            self.client.send_data(self.stream, data, False)  # the response ends with its trailers
            if end:
                self._broken("ended its stream without a gRPC status")
            return
        if self.finished:
            return
        error = self._scan(data) if data else None
        if error is not None:
            return self.refuse(h2.RESOURCE_EXHAUSTED, error, "message_too_large")
        if data:
            if not self.proxy.charge(len(data)):
                return self.refuse(h2.RESOURCE_EXHAUSTED, self.proxy.budget_message(), "buffer_full")
            self.held += len(data)
            self.received += len(data)
            if self.retained:
                self.chunks.append(data)
        self.request_ended = self.request_ended or end
        if not self.started:  # a one-message call, held (and counted) until whole: the client may send on
            self.acked += len(data)
            self.client.consume(self.stream, len(data))
            if end:
                self.proxy.begin(self)
            return
        if self.ustream is not None:
            assert self.upstream is not None
            self.upstream.send_data(self.ustream, data, end)
            if end:
                self.waiting_since = self.proxy.now
            if self.received > REPLAY_LIMIT:
                self._unretain()

    def _scan(self, data: bytes) -> str | None:
        """Follow the request's length-prefixed messages; an error naming the limit when one is too large."""
        index, size = 0, len(data)
        if not self.message_left and not self.prefix and size >= 5 and int.from_bytes(data[1:5], "big") == size - 5:
            index = size  # one whole message (a vLLM request, most often): the loop below would end as it began
            limit = self.proxy.context.settings.max_body_bytes
            if size - 5 > limit:
                return f"request message of {size - 5} bytes exceeds maxBodyBytes={limit}"
        while index < size:
            if self.message_left:
                step = min(self.message_left, size - index)
                self.message_left -= step
                index += step
                continue
            need = 5 - len(self.prefix)
            self.prefix += data[index:index + need]
            index += need
            if len(self.prefix) == 5:
                length, self.prefix = int.from_bytes(self.prefix[1:], "big"), b""
                limit = self.proxy.context.settings.max_body_bytes
                if length > limit:
                    return f"request message of {length} bytes exceeds maxBodyBytes={limit}"
                self.message_left = length
        return None

    def on_headers(self, stream: Stream, headers: list[h2.Header], end: bool) -> None:
        if stream is not self.ustream:
            if end:  # gRPC clients send no trailers; an END_STREAM on HEADERS still ends the request
                self.on_data(stream, b"", True)
            return
        if self.finished:
            return
        self.heard += 1
        out = [h for h in headers if h[0] not in HOP]
        if not self.answered:
            out += self.answering()
        if not end:
            return self.client.send_headers(self.stream, out, False)
        self.first = True
        self.code = h2.grpc_status(headers)
        self.client.send_headers(self.stream, out, True)
        self.complete()

    def answering(self) -> list[h2.Header]:
        """The replica's first response head came: no retry any more; the fields the router adds to it (the
        replica that answered and its weights' version, on a call not forwarded). Called by the frame engine too,
        which relays the head itself."""
        self.answered = True
        self._unretain()
        if self.forwarded:
            return []
        out = [(REPLICA, self.name.encode())]
        version = self.proxy.context.rl.versions.get(self.name)
        if version is not None:  # a trainer drops samples of stale weights by it
            out.append((WEIGHT_VERSION, version.encode()))
        return out

    def on_written(self, stream: Stream, size: int) -> None:
        if stream is self.stream:  # response bytes reached the client's socket: the replica may send more
            self.backlog = max(0, self.backlog - size)
            if self.ustream is not None and self.upstream is not None:
                self.upstream.consume(self.ustream, size)
            return
        self.written += size  # request bytes reached the replica's socket: the client may send more
        fresh = min(size, self.received - self.acked)
        if fresh > 0:
            self.acked += fresh
            self.client.consume(self.stream, fresh)
        self._settle()

    def on_reset(self, stream: Stream, code: int) -> None:
        if stream is self.stream:
            return self.cancel()
        self.ustream = None
        if not self.answered and code == h2.REFUSED_STREAM and self.retained:
            return self._resolve(REFUSED)
        self._failed(_RESET_STATUS.get(code, h2.INTERNAL), f"reset the stream (HTTP/2 error {code})", CLOSED)

    def on_lost(self, stream: Stream, refused: bool) -> None:
        if stream is self.stream:
            return self.cancel()
        self.ustream = None
        if not self.answered and self.retained:
            return self._resolve(REFUSED)
        self._failed(h2.UNAVAILABLE, "closed the connection", CLOSED)

    # attempts
    async def attempt(self, target: str, name: str, forwarded: bool, extra: tuple[h2.Header, ...] = ()) -> str | None:
        """Send the call to ``target``; REFUSED when it never saw it, else None (``code``, ``failure`` say how
        it ended). Raises OSError or TimeoutError when no connection could be made."""
        self.prepare(name, forwarded)
        conn = await self.proxy.upstreams.get(target)
        if conn.closed:  # closed while we waited for it: once more, on a fresh one
            conn = await self.proxy.upstreams.get(target)
        if self.finished:
            return None
        if conn.closed:
            return REFUSED
        done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        resolve = done.set_result
        self.dispatch(conn, target, extra, resolve)
        try:
            return await done
        finally:
            if self.ended is resolve:  # (the task was cancelled: nothing waits for the end any more)
                self.ended = None
            self.proxy.active.discard(self)

    def prepare(self, name: str, forwarded: bool) -> None:
        """A new attempt on ``name`` (a replica, or an owner router when ``forwarded``)."""
        self.name, self.forwarded = name, forwarded
        self.answered = self.first = self.relayed = False
        self.first_at = 0.0
        self.code, self.failure, self.written, self.waiting_since = None, None, 0, None

    def dispatch(self, conn: UpstreamConnection, target: str, extra: tuple[h2.Header, ...],
                 ended: Callable[[str | None], None]) -> None:
        """Open the attempt's stream on ``conn`` (open) and send the request held so far; ``ended`` is told how the
        attempt ended (REFUSED or None), once (``attempt`` awaits it; ``GrpcProxy`` records it there)."""
        self.upstream, self.ended = conn, ended
        self.proxy.active.add(self)
        chunks, ended_request = self.chunks, self.request_ended
        head = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", self.path), (b":authority", target.encode()),
                (b"te", b"trailers"), *self.metadata, *extra]
        self.ustream = stream = conn.open(self, head, ended_request and not chunks)
        for index, chunk in enumerate(chunks):
            conn.send_data(stream, chunk, ended_request and index == len(chunks) - 1)
        if ended_request:
            self.waiting_since = self.proxy.now

    def accepted(self) -> bool:
        """The replica's answer rejects nothing: a message came, the call succeeded, or the client left first."""
        return self.relayed or self.code == h2.OK or self.client_gone

    # endings
    def complete(self) -> None:
        """The replica ended the response (trailers relayed): the call is done, the replica's stream forgotten (reset
        with NO_ERROR if the client is still sending), the client's finished, the attempt's end told (``ended``:
        recorded). Called by the frame engine too, once it has relayed the trailers itself."""
        self._close_upstream(h2.NO_ERROR if not self.request_ended else None)
        self._end_client()
        self._resolve(None)

    def timeout(self) -> None:
        """No response within the first-byte timeout: DEADLINE_EXCEEDED, a failure in the replica's streak."""
        what = f"owner router {self.name}" if self.forwarded else f"replica {self.name}"
        self.proxy.context.metrics.errors.labels("timeout").inc()
        self._failed(h2.DEADLINE_EXCEEDED, "", TIMEOUT,
                     f"{what} did not answer in time (firstByteTimeoutSeconds)")

    def sweep_silence(self, elapsed: float, limit: float, slack: float) -> None:
        """Count ``elapsed`` seconds against a response that has begun, while nothing new came from the replica
        and every byte relayed was handed to the client's connection (a client slow to read holds the replica
        back: not the replica's fault); past ``limit`` (``upstreamTimeoutSeconds``, plus ``slack`` for a forward)
        the call ends with DEADLINE_EXCEEDED, counted and logged as HTTP's mid-response failures are."""
        if self.heard != self.swept or self.backlog:
            self.swept, self.silent = self.heard, 0.0
            return
        self.silent += elapsed
        if self.silent >= limit + slack:
            what = f"owner router {self.name}" if self.forwarded else f"replica {self.name}"
            message = f"{what} sent nothing for {self.silent:g} s mid-response (upstreamTimeoutSeconds={limit:g})"
            self.proxy.context.metrics.errors.labels("upstream_broke_mid_response").inc()
            log.warning("%s", message)
            self._failed(h2.DEADLINE_EXCEEDED, "", TIMEOUT, message)

    def _broken(self, what: str) -> None:
        self._failed(h2.INTERNAL, what, CLOSED)

    def _failed(self, code: int, what: str, failure: str, message: str | None = None) -> None:
        """The replica failed the call: the client gets ``code`` (as trailers if the response had begun)."""
        if self.finished:
            return
        if not self.answered:
            self.failure = failure
        self._close_upstream(h2.CANCEL)
        who = f"owner router {self.name}" if self.forwarded else f"replica {self.name}"
        self.answer(code, message or f"{who} {what}" + (" mid-response" if self.answered else ""), router=False)
        self._resolve(None)

    def refuse(self, code: int, message: str, reason: str) -> None:
        """The router ends the call itself (a limit): the client is told why, the replica's stream is cancelled."""
        if self.finished:
            return
        self.proxy.context.metrics.errors.labels(reason).inc()
        self._close_upstream(h2.CANCEL)
        self.answer(code, message)
        self._resolve(None)

    def answer(self, code: int, message: str, router: bool = True) -> None:
        """End the client's stream with ``code``: trailers-only, or trailers after a response already begun."""
        if self.finished:
            return
        self.code = code
        if not self.answered:
            self.client.answer(self.stream, code, message, ROUTER_ANSWER if router else (), self.request_ended)
            self._release()
            return
        self.client.send_headers(self.stream, h2.status_headers(code, message)[2:], True)
        self._end_client()

    def cancel(self) -> None:
        """The client reset its stream or went away: stop the replica's work at once."""
        if self.finished:
            return
        self.client_gone = True
        self.code = h2.CANCELLED
        self._close_upstream(h2.CANCEL)
        self.client.forget(self.stream)
        self._release()
        self._resolve(None)

    def _close_upstream(self, code: int | None) -> None:
        stream, self.ustream = self.ustream, None
        if stream is not None and self.upstream is not None:
            if code is None:
                self.upstream.forget(stream)
            else:
                self.upstream.reset(stream, code)

    def _end_client(self) -> None:
        self.client.finish(self.stream, reset=not self.request_ended)
        self._release()

    def _release(self) -> None:
        self.finished = True
        self.chunks = []
        if self.held:
            self.proxy.release(self.held)
            self.held = 0
        self.proxy.calls.discard(self)

    def _resolve(self, outcome: str | None) -> None:
        ended = self.ended
        if ended is not None:
            self.ended = None
            self.proxy.active.discard(self)
            ended(outcome)

    def _unretain(self) -> None:
        """No retry any more: forget the kept request bytes (counted until written)."""
        if self.retained:
            self.retained = False
            self.chunks = []
            self._settle()

    def _settle(self) -> None:
        target = self.received if self.retained else self.received - self.written
        if 0 <= target < self.held:
            self.proxy.release(self.held - target)
            self.held = target

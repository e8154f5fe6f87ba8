"""Frames out, for either side of an HTTP/2 connection: what a stream writes within the peer's windows, what waits
for a window on its stream, and how a stream ends (reset, forgotten, finished).

Bytes a window has no room for wait on their stream, never on the connection:
one slow stream does not hold up the others. Frames built while one read is
handled are written together when it ends (``flush_dirty``), so messages that
arrive together leave in one write; frames written from elsewhere leave on the
next turn of the event loop. ``conn.H2Connection`` adds the reading side.
"""
from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Protocol

from . import h2

STREAM_WINDOW = 1 << 20  # what a peer may send on one stream before we pass it on
CLOSED_MEMORY = 256  # closed streams remembered, to tell a peer's late frames from its errors
_ENDING_HEAD = h2.END_HEADERS | h2.END_STREAM
_dirty: list[H2Output] = []
DIRTY = _dirty  # the connections with frames to write at the read's end (h2.work appends to it)
_reading = [False]  # a read is being handled (``h2.read``): it writes what it emits at its end (no callback needed)
READING = _reading


class Owner(Protocol):
    """What a stream reports to (the ``Call`` relaying it)."""

    def on_headers(self, stream: Stream, headers: list[h2.Header], end: bool) -> None: ...
    def on_data(self, stream: Stream, data: bytes, end: bool) -> None: ...
    def on_reset(self, stream: Stream, code: int) -> None: ...
    def on_lost(self, stream: Stream, refused: bool) -> None: ...
    def on_written(self, stream: Stream, size: int) -> None: ...


class Stream:
    """One stream as its connection sees it: the peer's window and what waits for it. The reference of
    ``_grpc_frames.Stream`` (the same fields in C), which is what ``Stream`` names where the frame engine runs."""

    __slots__ = ("id", "owner", "conn", "window", "pending", "unacked", "closing", "ended", "expected", "got")

    def __init__(self, stream_id: int, owner: Owner | None, conn: H2Output):
        self.id, self.owner, self.conn = stream_id, owner, conn
        self.window = conn.peer_window
        self.pending: collections.deque[tuple[bool, bytes, bool]] | None = None  # (is data, bytes, ends)
        self.unacked = 0  # bytes received and passed on, not yet returned to the peer
        self.closing: int | None = None  # finished by us: dropped (after this RST code, if any) once drained
        self.ended = False  # the peer sent END_STREAM
        self.expected: int | None = None  # the peer's content-length
        self.got = 0  # DATA bytes from the peer


PyStream = Stream  # the reference, under a name of its own (tests compare the two)
if not TYPE_CHECKING and h2.engine_stream is not None:
    Stream = h2.engine_stream  # the same fields in C, where the frame engine runs: it reads them without lookups


class PyConnFields:
    """The fields of a connection the frame engine reads and writes as it relays (``H2Output`` sets them): the
    reference of ``_grpc_frames.ConnFields`` (the same fields in C), which is ``H2Output``'s base where the engine
    runs, so that it reads and writes them without the C API's attribute lookups."""

    __slots__ = ("transport", "streams", "out", "blocked", "guard", "continuing", "window", "peer_window", "unacked",
                 "stream_window", "closed", "write_paused", "buffer", "yielding", "decoder", "preface", "head_clock",
                 "head_since")


if TYPE_CHECKING or h2.engine_conn_fields is None:
    ConnFields = PyConnFields
else:
    ConnFields = h2.engine_conn_fields


def flush_dirty() -> None:
    """Write what was emitted, one write per connection (``h2.read`` does this at a read's end itself)."""
    _reading[0] = False
    while _dirty:
        _dirty.pop().flush()


class H2Output(ConnFields, asyncio.Protocol):
    """The write side and the streams' endings; the subclass reads (``conn.H2Connection``).

    ``out`` (the bytes a read wrote, not flushed yet), ``blocked`` (streams waiting for a window) and ``drain`` are
    public: the frame engine (``_grpc_frames.pyx``) reads and calls them, with ``streams``, ``window`` and
    ``emit``, and ``H2Connection``'s ``on_frame``, ``headers_frame``, ``fail``, ``header_flood``, ``decoder``,
    ``unacked`` and ``continuing``."""

    track_ends = False  # whether a stream we finished stays open until the peer ends its side (the server does)

    def __init__(self) -> None:
        self.stream_window = STREAM_WINDOW  # the window we announce for each stream the peer sends on
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.peer_window = h2.DEFAULT_WINDOW  # the peer's initial window for each new stream
        self.window = h2.DEFAULT_WINDOW  # the peer's connection-level window
        self.closed = self.write_paused = False
        self.out: list[bytes] = []
        self.blocked: dict[int, Stream] = {}  # streams with bytes waiting for a window, in order
        self._closed: dict[int, bool] = {}  # recently closed stream ids: whether we reset them
        self.held = 0  # DATA bytes waiting on streams for the peer's windows or its reading

    def emit(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.out:
            _dirty.append(self)
            if not _reading[0]:  # emitted outside a read: written on the loop's next turn
                asyncio.get_running_loop().call_soon(self.flush)
        self.out.append(data)

    def flush(self) -> None:
        out = self.out
        if out and not self.closed and self.transport is not None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()

    def send_headers(self, stream: Stream, headers: list[h2.Header], end: bool) -> None:
        block = h2.encode(headers)
        if len(block) <= h2.FRAME_SIZE:  # one frame (every head and trailers a call sends, in practice)
            block = h2.frame(h2.HEADERS, _ENDING_HEAD if end else h2.END_HEADERS, stream.id, block)
        else:
            block = h2.headers_frames(stream.id, block, end)
        if stream.pending:
            stream.pending.append((False, block, end))
        else:
            self.emit(block)

    def send_data(self, stream: Stream, data: bytes, end: bool) -> None:
        """``data`` within the peer's windows; what does not fit waits on the stream."""
        if stream.pending is None and not self.write_paused:
            data = self._push(stream, data, end)  # type: ignore[assignment]
            if data is None:
                return
        if stream.pending is None:
            stream.pending = collections.deque()
            self.blocked[stream.id] = stream
        stream.pending.append((True, data, end))
        self._hold(len(data))

    def _push(self, stream: Stream, data: bytes, end: bool) -> bytes | None:
        """Write what the windows allow; the rest (None when everything, the end included, went out)."""
        if not data:
            if end:
                self.emit(h2.frame(h2.DATA, h2.END_STREAM, stream.id))
            return None
        while True:
            size = min(len(data), stream.window, self.window, h2.FRAME_SIZE)
            if size <= 0:
                return data
            last = size == len(data)
            self.emit(h2.frame(h2.DATA, h2.END_STREAM if end and last else 0, stream.id, data if last else data[:size]))
            stream.window -= size
            self.window -= size
            if stream.owner is not None:
                stream.owner.on_written(stream, size)
            if last:
                return None
            data = data[size:]

    def drain(self) -> None:
        """Send what waited, stream by stream, while the windows and the transport allow."""
        for stream_id, stream in list(self.blocked.items()):
            pending = stream.pending
            while pending and not self.write_paused and not self.closed:
                is_data, data, end = pending[0]
                if is_data:
                    rest = self._push(stream, data, end)
                    self._hold(len(rest) - len(data) if rest is not None else -len(data))
                    if rest is not None:
                        pending[0] = (True, rest, end)
                        break
                else:
                    self.emit(data)
                pending.popleft()
            if not pending:
                stream.pending = None
                del self.blocked[stream_id]
                if stream.closing is not None:
                    self._close_finished(stream)
            if self.write_paused or self.window <= 0:
                break

    def _hold(self, size: int) -> None:
        """``size`` more (or, negative, fewer) DATA bytes wait on this connection's streams."""
        if size:
            self.held += size
            self.on_held(size)

    def on_held(self, size: int) -> None:
        """What waits changed by ``size`` (the server side counts it in the listener's budget)."""

    def _drop_pending(self, stream: Stream) -> None:
        """Forget what waited on ``stream`` (it will never be sent)."""
        if stream.pending:
            self._hold(-sum(len(data) for is_data, data, _ in stream.pending if is_data))
        stream.pending = None

    def consume(self, stream: Stream, size: int) -> None:
        """``size`` bytes of ``stream`` were passed on: return them to the peer (in halves of the window)."""
        stream.unacked += size
        if stream.unacked >= self.stream_window // 2 and stream.id in self.streams:
            self.emit(h2.window_update(stream.id, stream.unacked))
            stream.unacked = 0

    def reset(self, stream: Stream, code: int = h2.CANCEL) -> None:
        """End ``stream`` from our side (RST_STREAM) and forget it."""
        if self.streams.pop(stream.id, None) is not None:
            self.emit(h2.rst_stream(stream.id, code))
            self._remember(stream.id, True)
        self.blocked.pop(stream.id, None)
        self._drop_pending(stream)
        stream.owner = None

    def forget(self, stream: Stream) -> None:
        """``stream`` ended both ways (or the peer reset it): stop tracking it, dropping what waited."""
        if self.streams.pop(stream.id, None) is not None:
            self._remember(stream.id, False)
        if stream.pending is not None:  # (most streams forgotten had nothing waiting)
            self.blocked.pop(stream.id, None)
            self._drop_pending(stream)
        stream.owner = None

    def finish(self, stream: Stream, reset: bool = False) -> None:
        """Our side of ``stream`` has ended: drop it once what waits has left, then, with ``reset``, tell the
        peer to stop sending (RST_STREAM NO_ERROR: it has its whole answer)."""
        stream.owner = None
        stream.closing = h2.NO_ERROR if reset else -1
        if not stream.pending:
            self._close_finished(stream)

    def _close_finished(self, stream: Stream) -> None:
        """Close a stream we finished: with its RST_STREAM, or once the peer's side has ended too (until then
        it is half-closed and still counts toward the peer's concurrent streams)."""
        reset = stream.closing == h2.NO_ERROR
        if (reset or stream.ended or not self.track_ends) and self.streams.pop(stream.id, None) is not None:
            self._remember(stream.id, reset)
            if reset:
                self.emit(h2.rst_stream(stream.id, h2.NO_ERROR))

    def _remember(self, stream_id: int, reset_by_us: bool) -> None:
        """Closed streams, the last ``CLOSED_MEMORY`` of them: frames on one we reset are ignored, on one the
        peer closed are its error."""
        self._closed[stream_id] = reset_by_us
        if len(self._closed) > CLOSED_MEMORY:
            del self._closed[next(iter(self._closed))]

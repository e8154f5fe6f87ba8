"""One HTTP/2 connection, either side: frames in, frames out, and flow control per stream.

What a connection reads goes, frame by frame, to the ``Call`` that owns the
stream (``on_headers``, ``on_data``, ``on_reset``, ``on_lost``); what a call
writes leaves within the peer's windows, and bytes a window has no room for
wait on their stream (never on the connection: one slow stream does not hold
up the others). Received bytes are returned to the sender per stream only once
the call has passed them on (``consume``), so a slow reader on one side stops
its writer on the other; the connection-level window is returned on receipt,
since every stream's own window already bounds what it can make us hold.

Frames built while one read is handled are written together when it ends
(``flush_dirty``), so messages that arrive together leave in one write; frames
written from elsewhere leave on the next turn of the event loop.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import Protocol

import hpack

from . import h2

log = logging.getLogger(__name__)

STREAM_WINDOW = 1 << 20  # what a peer may send on one stream before we pass it on
CONNECTION_WINDOW = 16 << 20
MAX_HEAD = 64 * 1024  # a header block larger than this ends the connection (as HTTP's 431 ends a request)
_dirty: list[H2Connection] = []


class Owner(Protocol):
    """What a stream reports to (the ``Call`` relaying it)."""

    def on_headers(self, stream: Stream, headers: list[h2.Header], end: bool) -> None: ...
    def on_data(self, stream: Stream, data: bytes, end: bool) -> None: ...
    def on_reset(self, stream: Stream, code: int) -> None: ...
    def on_lost(self, stream: Stream, refused: bool) -> None: ...
    def on_written(self, stream: Stream, size: int) -> None: ...


class Stream:
    """One stream as its connection sees it: the peer's window and what waits for it."""

    __slots__ = ("id", "owner", "conn", "window", "pending", "unacked", "closing")

    def __init__(self, stream_id: int, owner: Owner | None, conn: H2Connection):
        self.id, self.owner, self.conn = stream_id, owner, conn
        self.window = conn.peer_window
        self.pending: collections.deque[tuple[bool, bytes, bool]] | None = None  # (is data, bytes, ends)
        self.unacked = 0  # bytes received and passed on, not yet returned to the peer
        self.closing: int | None = None  # finished by us: dropped (after this RST code, if any) once drained


def flush_dirty() -> None:
    """Write what the read just handled produced, one write per connection."""
    while _dirty:
        _dirty.pop().flush()


class H2Connection(asyncio.Protocol):
    """Frames and flow control; subclasses add the side's own part (``headers_frame``, ``goaway_frame``)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.peer_window = h2.DEFAULT_WINDOW  # the peer's initial window for each new stream
        self.peer_max_streams = h2.MAX_WINDOW
        self.window = h2.DEFAULT_WINDOW  # the peer's connection-level window
        self.closed = self.write_paused = False
        self.last_peer_stream = 0
        self._buffer = bytearray()
        self._decoder = hpack.Decoder(MAX_HEAD)
        self._unacked = 0
        self._block: tuple[int, int, bytearray] | None = None  # a header block waiting for CONTINUATION
        self._out: list[bytes] = []
        self._blocked: dict[int, Stream] = {}  # streams with bytes waiting for a window, in order

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        streams, self.streams = self.streams, {}
        self._blocked.clear()
        for stream in streams.values():
            if stream.owner is not None:
                stream.owner.on_lost(stream, False)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._drain()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        frames, used = h2.split_frames(self._buffer)
        del self._buffer[:used]
        try:
            for kind, flags, stream_id, payload in frames:
                if self.closed:
                    break
                self._frame(kind, flags, stream_id, payload)
        finally:
            flush_dirty()

    # frames in
    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is not None and kind != h2.CONTINUATION:
            return self.fail(h2.PROTOCOL_ERROR, "a header block was interrupted")
        if kind == h2.DATA:
            self._data(flags, stream_id, payload)
        elif kind == h2.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == h2.CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == h2.WINDOW_UPDATE and len(payload) == 4:
            self._window_update(stream_id, int.from_bytes(payload, "big") & h2.MAX_WINDOW)
        elif kind == h2.SETTINGS and not flags & h2.ACK:
            self._settings(payload)
        elif kind == h2.PING and not flags & h2.ACK:
            self.emit(h2.frame(h2.PING, h2.ACK, 0, payload))
        elif kind == h2.RST_STREAM and len(payload) == 4:
            stream = self.streams.pop(stream_id, None)
            self._blocked.pop(stream_id, None)
            if stream is not None and stream.owner is not None:
                stream.owner.on_reset(stream, int.from_bytes(payload, "big"))
        elif kind == h2.GOAWAY and len(payload) >= 8:
            self.goaway_frame(int.from_bytes(payload[:4], "big") & h2.MAX_WINDOW, int.from_bytes(payload[4:8], "big"))
        elif kind == h2.PUSH_PROMISE:
            self.fail(h2.PROTOCOL_ERROR, "push is disabled")
        elif kind == -1:
            self.fail(0x6, "a frame exceeded SETTINGS_MAX_FRAME_SIZE")  # FRAME_SIZE_ERROR

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._unacked += len(payload)
        if self._unacked >= CONNECTION_WINDOW // 2:
            self.emit(h2.window_update(0, self._unacked))
            self._unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.owner is None:
            return  # a stream we reset or finished: its bytes are dropped (and counted above)
        data = h2.unpad(flags, payload)
        if data is None:
            return self.fail(h2.PROTOCOL_ERROR, "bad padding")
        if len(payload) > len(data):
            self.consume(stream, len(payload) - len(data))  # padding is ours to return at once
        stream.owner.on_data(stream, data, bool(flags & h2.END_STREAM))

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        block = h2.unpad(flags, payload)
        if block is None:
            return self.fail(h2.PROTOCOL_ERROR, "bad padding")
        if flags & h2.PRIORITY_FLAG:
            block = block[5:]
        if flags & h2.END_HEADERS:
            self._decoded(stream_id, flags, block)
        else:
            self._block = (stream_id, flags, bytearray(block))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is None or self._block[0] != stream_id:
            return self.fail(h2.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        _, first_flags, block = self._block
        block += payload
        if len(block) > MAX_HEAD:
            return self.fail(h2.ENHANCE_YOUR_CALM, f"a header block exceeded {MAX_HEAD} bytes", stream_id)
        if flags & h2.END_HEADERS:
            self._block = None
            self._decoded(stream_id, first_flags, bytes(block))  # END_STREAM is on the HEADERS frame

    def _decoded(self, stream_id: int, flags: int, block: bytes) -> None:
        try:
            headers = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as error:
            return self.fail(h2.COMPRESSION_ERROR, f"bad header block ({error})", stream_id)
        self.headers_frame(stream_id, headers, bool(flags & h2.END_STREAM))  # type: ignore[arg-type]

    def _settings(self, payload: bytes) -> None:
        grown = False
        for offset in range(0, len(payload) - 5, 6):
            key, value = int.from_bytes(payload[offset:offset + 2], "big"), int.from_bytes(payload[offset + 2:offset + 6], "big")
            if key == h2.INITIAL_WINDOW_SIZE:
                delta, self.peer_window = value - self.peer_window, value
                for stream in self.streams.values():
                    stream.window += delta
                grown = delta > 0
            elif key == h2.MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
        self.emit(h2.frame(h2.SETTINGS, h2.ACK, 0))
        if grown:
            self._drain()

    def _window_update(self, stream_id: int, increment: int) -> None:
        if stream_id == 0:
            self.window += increment
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            stream.window += increment
        self._drain()

    # what subclasses answer
    def headers_frame(self, stream_id: int, headers: list[h2.Header], end: bool) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None and stream.owner is not None:
            stream.owner.on_headers(stream, headers, end)

    def goaway_frame(self, last_stream_id: int, code: int) -> None:
        """The peer is closing; streams above ``last_stream_id`` were never seen by it."""

    # frames out
    def emit(self, data: bytes) -> None:
        if self.closed:
            return
        if not self._out:
            _dirty.append(self)
            asyncio.get_running_loop().call_soon(self.flush)
        self._out.append(data)

    def flush(self) -> None:
        out = self._out
        if out and not self.closed and self.transport is not None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()

    def send_headers(self, stream: Stream, headers: list[h2.Header], end: bool) -> None:
        block = h2.headers_frames(stream.id, h2.encode(headers), end)
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
            self._blocked[stream.id] = stream
        stream.pending.append((True, data, end))

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

    def _drain(self) -> None:
        """Send what waited, stream by stream, while the windows and the transport allow."""
        for stream_id, stream in list(self._blocked.items()):
            pending = stream.pending
            while pending and not self.write_paused and not self.closed:
                is_data, data, end = pending[0]
                if is_data:
                    rest = self._push(stream, data, end)
                    if rest is not None:
                        pending[0] = (True, rest, end)
                        break
                else:
                    self.emit(data)
                pending.popleft()
            if not pending:
                stream.pending = None
                del self._blocked[stream_id]
                if stream.closing is not None:
                    self._close_finished(stream)
            if self.write_paused or self.window <= 0:
                break

    def consume(self, stream: Stream, size: int) -> None:
        """``size`` bytes of ``stream`` were passed on: return them to the peer (in halves of the window)."""
        stream.unacked += size
        if stream.unacked >= STREAM_WINDOW // 2 and stream.id in self.streams:
            self.emit(h2.window_update(stream.id, stream.unacked))
            stream.unacked = 0

    def reset(self, stream: Stream, code: int = h2.CANCEL) -> None:
        """End ``stream`` from our side (RST_STREAM) and forget it."""
        if self.streams.pop(stream.id, None) is not None:
            self.emit(h2.rst_stream(stream.id, code))
        self._blocked.pop(stream.id, None)
        stream.owner = None

    def forget(self, stream: Stream) -> None:
        """``stream`` ended both ways (or the peer reset it): stop tracking it, dropping what waited."""
        self.streams.pop(stream.id, None)
        self._blocked.pop(stream.id, None)
        stream.owner = None

    def finish(self, stream: Stream, reset: bool = False) -> None:
        """Our side of ``stream`` has ended: drop it once what waits has left, then, with ``reset``, tell the
        peer to stop sending (RST_STREAM NO_ERROR: it has its whole answer)."""
        stream.owner = None
        stream.closing = h2.NO_ERROR if reset else -1
        if not stream.pending:
            self._close_finished(stream)

    def _close_finished(self, stream: Stream) -> None:
        if self.streams.pop(stream.id, None) is not None and stream.closing == h2.NO_ERROR:
            self.emit(h2.rst_stream(stream.id, h2.NO_ERROR))

    def fail(self, code: int, why: str, stream_id: int = 0) -> None:
        """A connection error: GOAWAY naming why, then close."""
        log.info("closing an HTTP/2 connection (%s): %s", type(self).__name__, why)
        self.emit(h2.goaway(self.last_peer_stream, code, why.encode()[:200]))
        self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

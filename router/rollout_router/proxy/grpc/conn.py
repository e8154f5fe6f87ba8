"""One HTTP/2 connection, either side: frames in and flow control per stream (frames out: ``outbound``).

What a connection reads goes, frame by frame, to the ``Call`` that owns the
stream (``on_headers``, ``on_data``, ``on_reset``, ``on_lost``); what a call
writes leaves within the peer's windows, and bytes a window has no room for
wait on their stream (never on the connection: one slow stream does not hold
up the others). Received bytes are returned to the sender per stream only once
the call has passed them on (``consume``), so a slow reader on one side stops
its writer on the other; the connection-level window is returned on receipt,
since every stream's own window already bounds what it can make us hold.

Frames built while one read is handled are written together when it ends
(``h2.read``), so messages that arrive together leave in one write; frames
written from elsewhere leave on the next turn of the event loop.

A read is handled by ``h2.read``: in the compiled frame engine
(``_grpc_frames.pyx``) a replica stream's DATA is passed to its client stream
and WINDOW_UPDATE frames are applied there, without a Python call per frame,
and a whole header block is decoded there (a relayed call's response head and
trailers passed on there too, with one Python call each: ``Call.answering``,
``Call.complete``), whenever no branch of the methods here but the plain one
could be taken; every other frame comes to ``on_frame``. ``h2.py_read`` (the
reference, and what runs without the engine) gives every frame to
``on_frame``.
"""
from __future__ import annotations

import asyncio
import logging

import hpack

from . import guard as budgets
from . import h2
from .call import HOP, Call
from .guard import FRAMES_PER_TURN, Guard
from .outbound import DIRTY, READING, H2Output, Stream

log = logging.getLogger(__name__)

UPSTREAM_WINDOW = h2.DEFAULT_WINDOW  # what a replica may send on one stream before the client drains it
CONNECTION_WINDOW = 16 << 20
MAX_HEAD = 64 * 1024  # a header block larger than this ends the connection (as HTTP's 431 ends a request)
_ON_STREAM = frozenset({h2.DATA, h2.HEADERS, h2.PRIORITY, h2.RST_STREAM, h2.CONTINUATION})  # never on stream 0
_ON_CONNECTION = frozenset({h2.SETTINGS, h2.PING, h2.GOAWAY})  # only on stream 0
_PLACED = _ON_STREAM | _ON_CONNECTION  # the types whose stream (0 or not) is prescribed
_LENGTHS = {h2.PRIORITY: 5, h2.RST_STREAM: 4, h2.PING: 8, h2.WINDOW_UPDATE: 4}
_CONTROL = frozenset({h2.PING, h2.SETTINGS, h2.PRIORITY})  # budgeted: each costs us work, two an answer
_SELF_DEPENDENT = 0x100  # not a wire flag: a HEADERS frame whose priority names its own stream
_HEAD_FRAMES = (h2.HEADERS, h2.CONTINUATION)  # a read that leaves one of these at the buffer's start left a head begun


class H2Connection(H2Output):
    """Frames in and flow control (the write side is ``H2Output``); subclasses add the side's own part
    (``headers_frame``, ``goaway_frame``)."""

    def __init__(self) -> None:
        super().__init__()
        self.peer_max_streams = h2.MAX_WINDOW
        self.last_peer_stream = 0
        self.buffer = bytearray()  # read, not yet handled (a frame not yet whole, or frames left for the next turn)
        self.decoder = h2.header_decoder(MAX_HEAD)  # this side's HPACK state (the frame engine decodes with it)
        self.unacked = 0
        self.continuing: tuple[int, int, bytearray] | None = None  # a header block waiting for CONTINUATION
        self.yielding = False  # reading paused while frames already read wait for the next turn
        self.preface: bytearray | None = None  # the peer's connection preface as far as it came, while awaited
        self.head_clock = False  # whether a head begun and not yet whole is timed (``head_begun``: the server's)
        self.head_since: float | None = None  # when the head in progress began (``head_begun`` sets it)
        self.guard = Guard()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        streams, self.streams = self.streams, {}
        self.blocked.clear()
        for stream in streams.values():
            self._drop_pending(stream)
            if stream.owner is not None:
                stream.owner.on_lost(stream, False)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.drain()

    def data_received(self, data: bytes) -> None:
        """Handle at most ``FRAMES_PER_TURN`` units of frame work (a header block decoded weighs the guard's
        ``head_work``) at once (``h2.read``); with more waiting, stop reading and go on next turn (one connection's
        burst cannot hold the event loop): ``yield_turn``. A client's connection preface comes first
        (``preface_received``); on the server's side a head left incomplete starts its clock (``head_begun``). The
        reference of ``_grpc_frames.ConnFields.data_received`` (the same in C, this method's replacement where the
        frame engine runs: every read comes here)."""
        if self.preface is not None:
            rest = self.preface_received(data)
            if rest is None:
                return
            data = rest
        buffer = self.buffer
        buffer += data
        more = h2.read(self, buffer, FRAMES_PER_TURN, self.guard.head_work, DIRTY, READING, Call)
        if more or self.yielding:
            self.yield_turn(more)
        if self.head_clock:
            if self.continuing is None and (len(buffer) < 4 or buffer[3] not in _HEAD_FRAMES):
                self.head_since = None  # (most reads: every frame handled, the buffer empty)
            elif self.head_since is None:
                self.head_begun()

    def _work(self) -> None:
        """The frames left from an earlier turn (``yield_turn``)."""
        self.yield_turn(h2.read(self, self.buffer, FRAMES_PER_TURN, self.guard.head_work, DIRTY, READING, Call))

    def yield_turn(self, more: bool) -> None:
        """Frames are left for the next turn (``more``): reading paused until they are handled; or none are left any
        more, and reading resumes."""
        if more != self.yielding and self.transport is not None:
            self.yielding = more
            (self.transport.pause_reading if more else self.transport.resume_reading)()
        if more:
            asyncio.get_running_loop().call_soon(self._work)

    # frames in
    def on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == h2.DATA and stream_id and self.continuing is None:  # a relayed message: none of the checks below apply
            return self.data_frame(flags, stream_id, payload)
        if self.continuing is not None and kind != h2.CONTINUATION:
            return self.fail(h2.PROTOCOL_ERROR, "a header block was interrupted")
        if kind == -1:
            return self.fail(h2.FRAME_SIZE_ERROR, "a frame exceeded SETTINGS_MAX_FRAME_SIZE")
        if (kind in _ON_STREAM) == (stream_id == 0) and kind in _PLACED:
            return self.fail(h2.PROTOCOL_ERROR, f"a frame of type {kind} on stream {stream_id}")
        length = _LENGTHS.get(kind)
        if length is not None and len(payload) != length:
            if kind == h2.PRIORITY:
                return self._stream_error(stream_id, h2.FRAME_SIZE_ERROR)
            return self.fail(h2.FRAME_SIZE_ERROR, f"a frame of type {kind} of {len(payload)} bytes")
        if kind in _CONTROL and not self.guard.control.take():
            return self.calm("h2_control_flood", f"more than {budgets.CONTROL_BURST} PING, SETTINGS or PRIORITY frames "
                                                 f"at over {budgets.CONTROL_RATE:g} a second")
        handler = _HANDLERS.get(kind)
        if handler is not None:  # frames of unknown types are ignored (RFC 9113 5.5)
            handler(self, flags, stream_id, payload)

    def data_frame(self, flags: int, stream_id: int, payload: bytes) -> None:
        """A DATA frame on a stream, no header block continued (``on_frame``'s first branch; the frame engine hands
        here those it does not relay itself)."""
        self.unacked += len(payload)
        if self.unacked >= CONNECTION_WINDOW // 2:
            self.emit(h2.window_update(0, self.unacked))
            self.unacked = 0
        end = bool(flags & h2.END_STREAM)
        if not self.guard.empty_ok(not payload and not end):
            return self.calm("h2_empty_frames", "empty frames that end nothing, one after another")
        stream = self.streams.get(stream_id)
        if stream is None:
            return self._closed_frame(stream_id, "DATA")
        data = h2.unpad(flags, payload) if flags & h2.PADDED else payload
        if data is None:
            return self.fail(h2.PROTOCOL_ERROR, "bad padding")
        if stream.ended:
            return self.fail(h2.STREAM_CLOSED, f"DATA on stream {stream_id} after its END_STREAM")
        stream.got += len(data)
        if stream.expected is not None and (stream.got > stream.expected or end and stream.got != stream.expected):
            return self._stream_error(stream_id, h2.PROTOCOL_ERROR)  # not what content-length said (8.1.1)
        if len(payload) > len(data) or stream.owner is None:  # padding, or a stream we finished: returned at once
            self.consume(stream, len(payload) - len(data) if stream.owner is not None else len(payload))
        if end:
            self._ended(stream)
        if stream.owner is not None:
            stream.owner.on_data(stream, data, end)

    def _closed_frame(self, stream_id: int, what: str) -> None:
        """A frame for a stream we do not hold: idle (never opened) or closed by the peer is the peer's error;
        a stream we reset may still see frames in flight (ignored)."""
        if self.idle(stream_id):
            self.fail(h2.PROTOCOL_ERROR, f"{what} on idle stream {stream_id}")
        elif self._closed.get(stream_id) is False:
            self.fail(h2.STREAM_CLOSED, f"{what} on closed stream {stream_id}")

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        block = h2.unpad(flags, payload)
        if block is None:
            return self.fail(h2.PROTOCOL_ERROR, "bad padding")
        if flags & h2.PRIORITY_FLAG:
            if int.from_bytes(block[:4], "big") & h2.MAX_WINDOW == stream_id:
                flags |= _SELF_DEPENDENT
            block = block[5:]
        if flags & h2.END_HEADERS:
            self.header_block(stream_id, flags, block)
        elif not self.guard.empty_ok(not block):
            self.calm("h2_empty_frames", "empty frames that end nothing, one after another")
        else:
            self.continuing = (stream_id, flags, bytearray(block))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuing is None or self.continuing[0] != stream_id:
            return self.fail(h2.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        if not self.guard.empty_ok(not payload and not flags & h2.END_HEADERS):
            return self.calm("h2_empty_frames", "empty CONTINUATION frames, one after another")
        _, first_flags, block = self.continuing
        block += payload
        if len(block) > MAX_HEAD:
            return self.fail(h2.ENHANCE_YOUR_CALM, f"a header block exceeded {MAX_HEAD} bytes", stream_id)
        if flags & h2.END_HEADERS:
            self.continuing = None
            self.header_block(stream_id, first_flags, bytes(block))  # END_STREAM is on the HEADERS frame

    def header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        """A whole header block of ``stream_id`` (its HEADERS frame's ``flags``), decoded and handed on. The frame
        engine does the same in C (``_header_block``) for a HEADERS frame that is the whole block, unpadded, with
        no priority, on a stream, while no block is being continued (what ``on_frame`` and ``_headers`` would hand
        here unchanged)."""
        try:
            headers, size = self.decoder.decode(block)
        except (hpack.HPACKError, IndexError, ValueError) as error:
            return self.fail(h2.COMPRESSION_ERROR, f"bad header block ({error or type(error).__name__})", stream_id)
        if not self.guard.headers.take(size):
            return self.header_flood()
        if flags & _SELF_DEPENDENT:
            return self._stream_error(stream_id, h2.PROTOCOL_ERROR)
        self.headers_frame(stream_id, headers, bool(flags & h2.END_STREAM))

    def header_flood(self) -> None:
        """The decoded-header budget is spent (``guard.headers``): the connection is closed (ENHANCE_YOUR_CALM)."""
        self.calm("h2_header_flood", f"decoded header bytes beyond {budgets.HEADER_BURST} at over "
                                     f"{budgets.HEADER_RATE:g} a second")

    def _priority(self, flags: int, stream_id: int, payload: bytes) -> None:
        if int.from_bytes(payload[:4], "big") & h2.MAX_WINDOW == stream_id:
            self._stream_error(stream_id, h2.PROTOCOL_ERROR)  # a stream cannot depend on itself (5.3.1)

    def _rst_stream(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.idle(stream_id):
            return self.fail(h2.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        if not self.guard.resets.take():
            return self.calm("h2_reset_flood", f"more than {budgets.RESET_BURST} streams reset at over {budgets.RESET_RATE:g} "
                                               "a second (rapid reset)")
        stream = self.streams.pop(stream_id, None)
        self.blocked.pop(stream_id, None)
        if stream is not None:
            self._remember(stream_id, False)
            self._drop_pending(stream)
            if stream.owner is not None:
                stream.owner.on_reset(stream, int.from_bytes(payload, "big"))

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if flags & h2.ACK:
            if payload:
                self.fail(h2.FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            return self.fail(h2.FRAME_SIZE_ERROR, "a SETTINGS frame whose length is not a multiple of 6")
        window = self.peer_window
        for offset in range(0, len(payload), 6):
            key, value = int.from_bytes(payload[offset:offset + 2], "big"), int.from_bytes(payload[offset + 2:offset + 6], "big")
            problem = _setting_problem(key, value)
            if problem is not None:
                return self.fail(h2.FLOW_CONTROL_ERROR if key == h2.INITIAL_WINDOW_SIZE else h2.PROTOCOL_ERROR,
                                 problem)
            if key == h2.INITIAL_WINDOW_SIZE:
                window = value
            elif key == h2.MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
        delta, self.peer_window = window - self.peer_window, window
        for stream in self.streams.values():
            stream.window += delta
            if stream.window > h2.MAX_WINDOW:
                return self.fail(h2.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE overflowed a stream's window")
        self._acknowledge(h2.frame(h2.SETTINGS, h2.ACK, 0))
        if delta > 0:
            self.drain()

    def _ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not flags & h2.ACK:
            self._acknowledge(h2.frame(h2.PING, h2.ACK, 0, payload))

    def _acknowledge(self, frame: bytes) -> None:
        """An ACK the peer asked for; past ``budgets.MAX_QUEUED_CONTROL`` of them while it does not read, it is cut off."""
        if not self.guard.queued_ok(self.write_paused):
            return self.calm("h2_control_flood", f"more than {budgets.MAX_QUEUED_CONTROL} acknowledgements queued for a "
                                                 "peer that does not read")
        self.emit(frame)

    def _goaway(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) < 8:
            return self.fail(h2.FRAME_SIZE_ERROR, "a GOAWAY frame shorter than 8 bytes")
        self.goaway_frame(int.from_bytes(payload[:4], "big") & h2.MAX_WINDOW, int.from_bytes(payload[4:8], "big"))

    def _push_promise(self, flags: int, stream_id: int, payload: bytes) -> None:
        self.fail(h2.PROTOCOL_ERROR, "push is disabled")

    def _window_update(self, flags: int, stream_id: int, payload: bytes) -> None:
        increment = int.from_bytes(payload, "big") & h2.MAX_WINDOW
        if stream_id == 0:
            if not increment or self.window + increment > h2.MAX_WINDOW:
                return self.fail(h2.FLOW_CONTROL_ERROR if increment else h2.PROTOCOL_ERROR,
                                 f"a connection WINDOW_UPDATE of {increment}")
            self.window += increment
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return self._closed_frame(stream_id, "WINDOW_UPDATE") if self.idle(stream_id) else None
            if not increment or stream.window + increment > h2.MAX_WINDOW:
                return self._stream_error(stream_id, h2.FLOW_CONTROL_ERROR if increment else h2.PROTOCOL_ERROR)
            stream.window += increment
        self.drain()

    def _ended(self, stream: Stream) -> None:
        """The peer ended its side of ``stream``; a stream we finished already is closed now."""
        stream.ended = True
        if stream.closing is not None and not stream.pending:
            self._close_finished(stream)

    def _stream_error(self, stream_id: int, code: int) -> None:
        """RST_STREAM with ``code`` (a stream error); the stream's call learns it was reset."""
        stream = self.streams.get(stream_id)
        if stream is None:
            self.emit(h2.rst_stream(stream_id, code))
            self._remember(stream_id, True)
            return
        owner = stream.owner
        self.reset(stream, code)
        if owner is not None:
            owner.on_reset(stream, code)

    def idle(self, stream_id: int) -> bool:
        """Whether ``stream_id`` was never opened (the server side knows; the client side does not check)."""
        return False

    def calm(self, reason: str, why: str) -> None:
        """The peer spent a budget: GOAWAY (ENHANCE_YOUR_CALM), counted by the side that knows its metrics."""
        self.fail(h2.ENHANCE_YOUR_CALM, why)

    # what subclasses answer
    def headers_frame(self, stream_id: int, headers: list[h2.Header], end: bool) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if end:
            self._ended(stream)
        if stream.owner is not None:
            stream.owner.on_headers(stream, headers, end)

    def goaway_frame(self, last_stream_id: int, code: int) -> None:
        """The peer is closing; streams above ``last_stream_id`` were never seen by it."""

    def preface_received(self, data: bytes) -> bytes | None:
        """What follows the peer's connection preface once it came whole (None: not yet, or not a preface), read
        while ``preface`` is not None: only a server awaits one (``ClientConnection``)."""
        return data

    def head_begun(self) -> None:
        """A header block began and is not whole after a read, with ``head_clock`` set: the server times it."""

    def fail(self, code: int, why: str, stream_id: int = 0) -> None:
        """A connection error: GOAWAY naming why, then close."""
        log.info("closing an HTTP/2 connection (%s): %s", type(self).__name__, why)
        self.emit(h2.goaway(self.last_peer_stream, code, why.encode()[:200]))
        self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()



py_data_received = H2Connection.data_received  # the reference, under a name of its own (tests compare the two)
if h2.engine_reading is not None:  # the frame engine reads: ``ConnFields.data_received`` (H2Output's base) is
    h2.engine_reading(FRAMES_PER_TURN, DIRTY, READING, Call, HOP)  # ``data_received`` above in C, with these
    del H2Connection.data_received


def _setting_problem(key: int, value: int) -> str | None:
    """Why a SETTINGS value is out of its range (RFC 9113 6.5.2), or None."""
    if key == h2.ENABLE_PUSH and value > 1:
        return f"SETTINGS_ENABLE_PUSH={value}"
    if key == h2.INITIAL_WINDOW_SIZE and value > h2.MAX_WINDOW:
        return f"SETTINGS_INITIAL_WINDOW_SIZE={value}"
    if key == h2.MAX_FRAME_SIZE and not h2.FRAME_SIZE <= value <= h2.MAX_FRAME_SIZE_LIMIT:
        return f"SETTINGS_MAX_FRAME_SIZE={value}"
    return None


_HANDLERS = {h2.DATA: H2Connection.data_frame, h2.HEADERS: H2Connection._headers, h2.PRIORITY: H2Connection._priority,
             h2.RST_STREAM: H2Connection._rst_stream, h2.SETTINGS: H2Connection._settings,
             h2.PUSH_PROMISE: H2Connection._push_promise, h2.PING: H2Connection._ping,
             h2.GOAWAY: H2Connection._goaway, h2.WINDOW_UPDATE: H2Connection._window_update,
             h2.CONTINUATION: H2Connection._continuation}

"""The little of HTTP/2 (RFC 9113) a gRPC relay needs: frames in and out, header blocks, gRPC statuses.

Frames are parsed from one growing buffer per connection and built as bytes;
header blocks are decoded by the compiled engine's HPACK decoder, or by ``hpack``
where it is not built (the peer's dynamic table lives in the connection's
decoder: ``header_decoder``) and encoded here without the dynamic table
(literal fields, never indexed), so our encoder keeps no state a peer must
track. Names are lower-case bytes, as HTTP/2 requires.
"""
from __future__ import annotations

import importlib
import os
import struct
from collections.abc import Iterable
from types import ModuleType
from typing import Protocol
from urllib.parse import quote

from ...core.sources import why_stale
from .blocks import BlockDecoder
from .frame_sources import source_hash

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20

# SETTINGS identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = \
    range(1, 7)

# Error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR = 0x5, 0x6
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x8, 0x9, 0xB

DEFAULT_WINDOW = 65_535
FRAME_SIZE = 16_384  # what every peer accepts; we advertise it too, so frames relay 1:1
MAX_WINDOW = (1 << 31) - 1
MAX_FRAME_SIZE_LIMIT = (1 << 24) - 1  # the largest SETTINGS_MAX_FRAME_SIZE a peer may announce

# gRPC status codes by number, named as grpc.StatusCode does (metrics label requests with the name).
STATUS_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED = 0, 1, 2, 3, 4
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14

ENCODED_ENTRIES, ENCODED_LARGEST = 256, 512  # blocks ``encode`` remembers, and the largest it remembers
_HEAD = struct.Struct(">IBI")  # length (24 bits) and type in one int, flags, stream id (R bit masked below)
Header = tuple[bytes, bytes]
_encoded: dict[tuple[Header, ...], bytes] = {}


def py_frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """A frame: its 9-byte head packed in one call (one per relayed message, so it is kept cheap), then the payload.
    The reference of ``_grpc_frames.frame`` (``frame`` is whichever runs)."""
    return _HEAD.pack(len(payload) << 8 | kind, flags, stream_id) + payload


def settings_frame(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in values.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK integer encoding (RFC 7541 5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def py_encode(headers: Iterable[Header]) -> bytes:
    """A header block of literal fields without indexing (no dynamic table: nothing for the peer to track).

    Stateless, so a block is a function of its fields alone: the blocks of small field lists are remembered
    (``ENCODED_ENTRIES`` of them, process-wide), since a replica's response heads and trailers repeat call after
    call. The reference of ``_grpc_frames.encode`` (``encode`` is whichever runs), which builds every block (in C
    that costs less than looking one up)."""
    key = tuple(headers)
    block = _encoded.get(key)
    if block is None:
        block = b"".join(b"\x00" + _integer(len(n), 7) + n + _integer(len(v), 7) + v for n, v in key)
        if len(block) <= ENCODED_LARGEST:
            if len(_encoded) >= ENCODED_ENTRIES:
                del _encoded[next(iter(_encoded))]
            _encoded[key] = block
    return block


def headers_frames(stream_id: int, block: bytes, end_stream: bool) -> bytes:
    """HEADERS (and CONTINUATION frames when the block is larger than a frame)."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= FRAME_SIZE:
        return frame(HEADERS, flags | END_HEADERS, stream_id, block)
    parts = [block[i:i + FRAME_SIZE] for i in range(0, len(block), FRAME_SIZE)]
    out = [frame(HEADERS, flags, stream_id, parts[0])]
    out += [frame(CONTINUATION, END_HEADERS if i == len(parts) - 1 else 0, stream_id, p)
            for i, p in enumerate(parts[1:], 1)]
    return b"".join(out)


def status_headers(code: int, message: str, extra: Iterable[Header] = ()) -> list[Header]:
    """A trailers-only answer's fields: HTTP 200, the gRPC status and its percent-encoded message."""
    return [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", str(code).encode()),
            (b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode()), *extra]


def grpc_status(headers: Iterable[Header]) -> int | None:
    for name, value in headers:
        if name == b"grpc-status":
            try:
                return int(value)
            except ValueError:
                return UNKNOWN
    return None


def status_name(code: int | None) -> str:
    return STATUS_NAMES[code] if code is not None and 0 <= code < len(STATUS_NAMES) else "UNKNOWN"


def py_split_frames(buffer: bytearray, limit: int, head_work: int = 1
                    ) -> tuple[list[tuple[int, int, int, bytes]], int, bool]:
    """The complete frames at the start of ``buffer`` worth at most ``limit`` units of work (a HEADERS or
    CONTINUATION frame ``head_work``, any other 1): (type, flags, stream id, payload), the bytes consumed, and
    whether the limit was what stopped it.

    A frame longer than we advertised is returned with its type as -1 (the
    caller closes the connection: FRAME_SIZE_ERROR). The reference of
    ``_grpc_frames.split_frames`` (``split_frames`` is whichever runs).
    """
    frames: list[tuple[int, int, int, bytes]] = []
    offset, size, work = 0, len(buffer), 0
    view = memoryview(buffer)
    try:
        while size - offset >= 9:
            if work >= limit:
                return frames, offset, True
            length_kind, flags, stream_id = _HEAD.unpack_from(buffer, offset)
            stream_id &= 0x7FFFFFFF
            length = length_kind >> 8
            if length > FRAME_SIZE:
                frames.append((-1, 0, 0, b""))
                return frames, size, False
            end = offset + 9 + length
            if end > size:
                break
            kind = length_kind & 0xFF
            work += head_work if kind == HEADERS or kind == CONTINUATION else 1
            frames.append((kind, flags, stream_id, bytes(view[offset + 9:end])))
            offset = end
    finally:
        view.release()
    return frames, offset, False


class _Reader(Protocol):
    closed: bool

    def on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None: ...
    def flush(self) -> None: ...


def py_work(conn: _Reader, buffer: bytearray, limit: int, head_work: int, dirty: list, relay: type) -> bool:
    """Handle the complete frames at the start of ``buffer`` worth at most ``limit`` units of work (as
    ``split_frames`` counts it), each by ``conn.on_frame``, removing them from ``buffer``; whether the limit was
    what stopped it (the connection goes on next turn). Frames after one that closed ``conn`` are dropped.

    The reference of ``_grpc_frames.work`` (``work`` is whichever runs), which handles a replica stream's DATA
    relayed to its client stream (``relay``, the call class, owning both; ``dirty``, the connections written at
    the read's end) and WINDOW_UPDATE frames itself, exactly as ``on_frame`` would, hands a HEADERS frame that is a
    whole plain header block to ``conn.header_block`` (where ``on_frame`` would pass it) and gives ``on_frame`` the
    rest."""
    frames, used, more = py_split_frames(buffer, limit, head_work)
    del buffer[:used]
    for kind, flags, stream_id, payload in frames:
        if conn.closed:
            return False
        conn.on_frame(kind, flags, stream_id, payload)
    return more and not conn.closed


def py_read(conn: _Reader, buffer: bytearray, limit: int, head_work: int, dirty: list, reading: list[bool],
            relay: type) -> bool:
    """One read of ``conn`` handled: ``reading[0]`` set while ``work`` handles it (so what is emitted waits for
    the read's end: outbound.begin_read), then the connections in ``dirty`` written (outbound.flush_dirty);
    whether frames are left for the next turn. The reference of ``_grpc_frames.read`` (``read`` is whichever
    runs)."""
    reading[0] = True
    try:
        more = py_work(conn, buffer, limit, head_work, dirty, relay)
    finally:
        reading[0] = False
        while dirty:
            dirty.pop().flush()
    return more and not conn.closed


def unpad(flags: int, payload: bytes) -> bytes | None:
    """A DATA or HEADERS payload without its padding; None when the padding is malformed."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        return None
    return payload[1:len(payload) - payload[0]]


def _engine() -> ModuleType | None:
    """The compiled frame engine's module, None where it is not built (imported by name: mypy has no stub of it)."""
    try:
        return importlib.import_module(f"{__package__}._grpc_frames")
    except ImportError:
        return None


def engine_unavailable() -> str | None:
    """Why the compiled frame engine does not run here (None: it does): not built, built from other sources than
    those beside it, or turned off (``ROLLOUT_ROUTER_GRPC_FRAMES=python``, how the tests run the reference)."""
    if os.environ.get("ROLLOUT_ROUTER_GRPC_FRAMES") == "python":
        return "ROLLOUT_ROUTER_GRPC_FRAMES=python"
    return why_stale(_engine(), source_hash(), "the compiled gRPC frame engine")


_compiled = _engine() if engine_unavailable() is None else None
frame, split_frames, work, read, encode = (
    (_compiled.frame, _compiled.split_frames, _compiled.work, _compiled.read, _compiled.encode) if _compiled is not None
    else (py_frame, py_split_frames, py_work, py_read, py_encode))
# A stream's fields in C (outbound.Stream names it where the engine runs), None where the reference runs; so are
# the fields the relay reads of a connection (outbound.H2Output's base) and of a call (call.Call's base)
engine_stream = _compiled.Stream if _compiled is not None else None
engine_conn_fields = _compiled.ConnFields if _compiled is not None else None
engine_call_fields = _compiled.CallFields if _compiled is not None else None
# A read's constants given to the engine, whose ``ConnFields.data_received`` is conn.H2Connection's in C (None: none)
engine_reading = _compiled.reading_with if _compiled is not None else None
# A request head's rules in C (rules.py's request_head and field_problem), None where their reference runs
engine_rules = (_compiled.request_head, _compiled.field_problem) if _compiled is not None else None
# A peer's header blocks: decoded in C (``_grpc_frames.HeaderDecoder``), or by hpack behind the memo of blocks.py
header_decoder = _compiled.HeaderDecoder if _compiled is not None else BlockDecoder

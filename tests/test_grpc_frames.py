"""The compiled frame engine (proxy/grpc/_grpc_frames.pyx) against its pure-Python reference in h2.py: the same
frames split from the same buffers (whole, cut short, oversized, with the work limit stopping them anywhere) and
the same bytes built. The rest of the suite runs whichever ``h2`` picked; ``ROLLOUT_ROUTER_GRPC_FRAMES=python``
runs it all on the reference."""
from __future__ import annotations

import importlib
import random
from types import ModuleType

import pytest

from rollout_router.proxy.grpc import h2


def _engine() -> ModuleType:
    reason = h2.engine_unavailable()
    if reason is not None and reason != "ROLLOUT_ROUTER_GRPC_FRAMES=python":
        pytest.skip(reason)
    return importlib.import_module("rollout_router.proxy.grpc._grpc_frames")


def _reading_engine() -> ModuleType:
    """The engine, where it reads: its ``read`` takes only connections with its fields (``ConnFields``, H2Output's
    base where it runs), which the reference's build does not have."""
    engine = _engine()
    if h2.engine_conn_fields is None:
        pytest.skip("the engine reads only connections with its fields (ROLLOUT_ROUTER_GRPC_FRAMES=python)")
    return engine


def _buffer(rng: random.Random) -> bytearray:
    """Frames of every type, some oversized, the last perhaps cut short; the R bit set on some stream ids."""
    out = bytearray()
    for _ in range(rng.randrange(0, 12)):
        size = rng.choice([0, 1, 5, 8, 100, h2.FRAME_SIZE, h2.FRAME_SIZE + 1]) if rng.random() < 0.9 else \
            rng.randrange(1 << 24)
        body = bytes(rng.randrange(256) for _ in range(min(size, 64))) * (size // 64 + 1)
        head = size.to_bytes(3, "big") + bytes((rng.randrange(12), rng.randrange(256))) + \
            rng.randrange(1 << 32).to_bytes(4, "big")
        out += head + body[:size]
    return out[:rng.randrange(len(out) + 1)] if rng.random() < 0.3 else out


@pytest.mark.parametrize("seed", range(200))
def test_split_frames_matches_the_reference(seed: int) -> None:
    engine, rng = _engine(), random.Random(seed)
    buffer = _buffer(rng)
    limit, head_work = rng.randrange(1, 20), rng.choice([1, 2, 4, 8])
    assert engine.split_frames(bytearray(buffer), limit, head_work) == h2.py_split_frames(buffer, limit, head_work)


def test_split_frames_masks_the_reserved_bit_and_copies() -> None:
    engine = _engine()
    buffer = bytearray(h2.py_frame(h2.DATA, h2.END_STREAM, 7, b"abc"))
    buffer[5] |= 0x80
    frames, used, more = engine.split_frames(buffer, 10, 1)
    assert (frames, used, more) == ([(h2.DATA, h2.END_STREAM, 7, b"abc")], 12, False)
    buffer[9:] = b"xyz"  # the payload returned is a copy, not a view of the buffer
    assert frames[0][3] == b"abc" and type(frames[0][3]) is bytes


@pytest.mark.parametrize("seed", range(50))
def test_frame_matches_the_reference(seed: int) -> None:
    engine, rng = _engine(), random.Random(seed)
    kind, flags, stream_id = rng.randrange(256), rng.randrange(256), rng.randrange(1 << 31)
    payload = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 9, 300, h2.FRAME_SIZE])))
    assert engine.frame(kind, flags, stream_id, payload) == h2.py_frame(kind, flags, stream_id, payload)
    assert engine.frame(kind, flags, stream_id) == h2.py_frame(kind, flags, stream_id)


def test_the_engine_runs_where_it_is_built() -> None:
    """``h2`` uses the compiled functions unless told not to (or they are not built, or stale)."""
    _engine()
    if h2.engine_unavailable() is None:
        assert h2.split_frames is not h2.py_split_frames and h2.frame is not h2.py_frame
    else:
        assert h2.split_frames is h2.py_split_frames and h2.frame is h2.py_frame


# The relay in C (``work``/``read``: a replica stream's DATA passed to its client stream, WINDOW_UPDATE applied)
# against the reference (``py_work``/``py_read``: every frame to ``H2Connection.on_frame``): one call relayed through
# real connections with recording transports, the same random frames read by each, everything observable compared.

class _Transport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class _Turn:
    first_byte: float | None = None

    def first(self, now: float) -> None:
        self.first_byte = now


def _relay(measured: bool, windows: tuple[int, int, int], Stream: type, timed: bool = True):
    from types import SimpleNamespace

    from rollout_router.proxy.grpc.call import Call
    from rollout_router.proxy.grpc.server import ClientConnection
    from rollout_router.proxy.grpc.upstream import UpstreamConnection
    from rollout_router.proxy.grpc.usage import LastMessage

    settings = SimpleNamespace(max_grpc_streams=100, max_grpc_streams_per_connection=100, max_body_bytes=1 << 20)
    proxy = SimpleNamespace(now=0.0, context=SimpleNamespace(settings=settings), calls=set(), closing=False,
                            release=lambda size: None, hold=lambda size: None, refused=lambda reason: None)
    client = ClientConnection(proxy)  # type: ignore[arg-type]
    upstream = UpstreamConnection(SimpleNamespace(window=lambda: windows[0], forget=lambda conn: None), "r:1")  # type: ignore[arg-type]
    client.transport, upstream.transport = _Transport(), _Transport()  # type: ignore[assignment]
    client.window = windows[1]
    stream = Stream(1, None, client)
    stream.window = windows[2]
    client.streams[1] = stream
    client.last_peer_stream = 1
    client.preface = client._opened_at = None  # its preface read: the client's frames go to the frame engine
    call = Call(proxy, client, stream, b"/s/m", [], False, None)  # type: ignore[arg-type]
    call.started = call.request_ended = call.answered = True
    ustream = Stream(1, call, upstream)
    upstream.streams[1] = ustream
    upstream.next_stream = 3
    call.upstream, call.ustream, call.name = upstream, ustream, "r"
    call.turn = _Turn() if timed else None  # type: ignore[assignment]  # None: a kept turn not measured (first_at)
    call.last = LastMessage() if measured else None
    return client, upstream, call


def _state(client, upstream, call) -> tuple:
    def stream(s) -> tuple:
        return None if s is None else (s.window, s.unacked, s.got, s.ended, s.closing, list(s.pending or ()))

    def conn(c) -> tuple:
        return (bytes(c.transport.out), c.transport.closed, c.window, c.unacked, c.held, c.closed, sorted(c.streams),
                dict(c._closed), bytes(c.buffer), [stream(s) for s in c.streams.values()])

    return (conn(client), conn(upstream), stream(call.stream), stream(call.ustream),
            (call.first, call.relayed, call.heard, call.backlog, call.finished, call.code,
             call.turn.first_byte is None if call.turn is not None else None, call.first_at != 0.0,
             call.last.last if call.last is not None else None))


def _message_bytes(rng: random.Random) -> bytes:
    body = bytes(rng.randrange(256) for _ in range(rng.choice([0, 3, 40, 700])))
    return b"\x00" + len(body).to_bytes(4, "big") + body


def _replica_frames(rng: random.Random) -> bytes:
    out = bytearray()
    for _ in range(rng.randrange(1, 8)):
        pick = rng.random()
        stream_id = 1 if rng.random() < 0.9 else rng.choice([2, 3, 5])
        if pick < 0.7:
            data = b"".join(_message_bytes(rng) for _ in range(rng.randrange(0, 3)))[:h2.FRAME_SIZE]
            flags = h2.END_STREAM if rng.random() < 0.03 else 0
            if rng.random() < 0.05:
                flags |= h2.PADDED
                data = bytes((2,)) + data + b"\x00\x00"
            out += h2.py_frame(h2.DATA, flags, stream_id, data)
        elif pick < 0.8:
            out += _header_frames(rng, stream_id)
        elif pick < 0.85:
            increment = rng.choice([0, 1, 500, 70_000, h2.MAX_WINDOW])
            out += h2.py_frame(h2.WINDOW_UPDATE, 0, rng.choice([0, stream_id]), increment.to_bytes(4, "big"))
        elif pick < 0.9:
            out += h2.py_frame(h2.WINDOW_UPDATE, 0, 1, b"\x00\x01")  # the wrong length
        elif pick < 0.95:
            out += h2.py_frame(h2.PING, 0, 0, b"12345678")
        else:
            out += h2.py_frame(h2.RST_STREAM, 0, 1, h2.CANCEL.to_bytes(4, "big"))
    return bytes(out)


def _header_frames(rng: random.Random, stream_id: int) -> bytes:
    """A response head or trailers (END_STREAM) as the replica would send them; some padded, some with a priority,
    some split into a CONTINUATION, some on stream 0 or bad HPACK: the engine takes only the plain whole block."""
    end = rng.random() < 0.5
    fields = [(b"grpc-status", b"0"), (b"grpc-message", b"")] if end else \
        [(b":status", b"200"), (b"content-type", b"application/grpc")]
    block = h2.py_encode(fields) if rng.random() < 0.95 else b"\xfe"  # an index past both tables
    flags = (h2.END_STREAM if end else 0) | h2.END_HEADERS
    pick = rng.random()
    if pick < 0.1:
        return h2.py_frame(h2.HEADERS, flags | h2.PADDED, stream_id, bytes((3,)) + block + b"\x00" * 3)
    if pick < 0.2:
        return h2.py_frame(h2.HEADERS, flags | h2.PRIORITY_FLAG, stream_id, (0).to_bytes(4, "big") + b"\x10" + block)
    if pick < 0.3:
        return h2.py_frame(h2.HEADERS, flags & ~h2.END_HEADERS, stream_id, block[:3]) + \
            h2.py_frame(h2.CONTINUATION, h2.END_HEADERS, stream_id, block[3:])
    return h2.py_frame(h2.HEADERS, flags, 0 if pick < 0.33 else stream_id, block)


def _client_frames(rng: random.Random) -> bytes:
    increment = rng.choice([0, 10, 1000, 40_000, h2.MAX_WINDOW])
    return h2.py_frame(h2.WINDOW_UPDATE, 0, rng.choice([0, 1, 1, 3]), increment.to_bytes(4, "big"))


def _run(seed: int, reader, stream: type, receive=None) -> list[tuple]:
    """The states after each read of one random relay, each read given to ``receive`` (by default the reference's
    ``H2Connection.data_received``, with ``reader`` as its ``h2.read``)."""
    from rollout_router.proxy.grpc import conn

    receive = receive or conn.py_data_received
    rng = random.Random(seed)
    client, upstream, call = _relay(rng.random() < 0.5, (rng.choice([1024, 4096, 65_535]),
                                                         rng.choice([300, 5000, 1 << 20]), rng.choice([300, 5000, 1 << 20])),
                                    stream, rng.random() < 0.6)
    states, original = [], conn.h2.read
    conn.h2.read = reader
    try:
        for _ in range(rng.randrange(1, 30)):
            if rng.random() < 0.75:
                data = _replica_frames(rng)
                cut = rng.randrange(len(data) + 1)
                receive(upstream, data[:cut])
                receive(upstream, data[cut:])
            else:
                receive(client, _client_frames(rng))
            states.append(_state(client, upstream, call))
    finally:
        conn.h2.read = original
    return states


@pytest.mark.parametrize("seed", range(300))
async def test_the_relay_in_c_matches_the_reference(seed: int) -> None:
    """A replica's frames (DATA of whole and split messages, ends, padding, unknown streams, valid and invalid
    WINDOW_UPDATEs, PING, a reset) and the client's WINDOW_UPDATEs, through a call with windows that run out: the
    compiled relay leaves every byte written, window, count and end as the reference does, on the engine's streams
    (``_grpc_frames.Stream``) and on the reference's (``outbound.PyStream``, which the engine leaves to Python); and
    so does the read itself in C (``ConnFields.data_received``)."""
    from rollout_router.proxy.grpc.outbound import PyStream

    engine = _reading_engine()
    expected = _run(seed, h2.py_read, PyStream)
    assert _run(seed, engine.read, engine.Stream) == expected
    assert _run(seed, h2.py_read, engine.Stream) == expected
    assert _run(seed, engine.read, PyStream) == expected
    assert _run(seed, engine.read, engine.Stream, engine.ConnFields.data_received) == expected


async def test_the_relay_differential_runs_both_paths() -> None:
    """The comparison above is between two paths: the reference's read runs the ``h2.read`` it is given (not the
    engine's read in C, which replaces ``data_received`` where it runs), and the client's frames reach it (its
    connection past its preface, not closed for a bad one)."""
    from rollout_router.proxy.grpc.outbound import PyStream

    seen: list[int] = []

    def reference(*args):
        seen.append(1)
        return h2.py_read(*args)

    _run(0, reference, PyStream)
    assert seen
    from rollout_router.proxy.grpc import conn

    client, _, _ = _relay(False, (65_535, 1000, 1000), PyStream)
    conn.py_data_received(client, h2.py_frame(h2.WINDOW_UPDATE, 0, 0, (10).to_bytes(4, "big")))
    assert client.window == 1010 and not client.closed


async def test_the_relay_in_c_takes_the_frames_it_is_for() -> None:
    """The equality above is not because the engine handed every frame back: a relayed message and a
    WINDOW_UPDATE never reach ``on_frame``."""
    engine = _reading_engine()
    client, upstream, call = _relay(False, (65_535, 1 << 20, 1 << 20), engine.Stream)
    call.turn.first_byte = 1.0
    seen: list[int] = []
    upstream.on_frame = lambda kind, *rest: seen.append(kind)  # type: ignore[method-assign]
    message = _message_bytes(random.Random(1))
    data = h2.py_frame(h2.DATA, 0, 1, message) + h2.py_frame(h2.WINDOW_UPDATE, 0, 0, (100).to_bytes(4, "big"))
    assert engine.read(upstream, bytearray(data), 200, 1, [], [False], type(call)) is False
    assert seen == [] and client.out == [] and call.heard == 1  # relayed, and written at the read's end
    assert client.transport.out == h2.py_frame(h2.DATA, 0, 1, message)
    assert upstream.window == h2.DEFAULT_WINDOW + 100


async def test_a_call_with_no_turn_keeps_its_first_messages_time() -> None:
    """A kept turn that is not measured has no ``Turn`` (traffic.py routes it with ``attempts.taken``): the relay
    stamps the call's ``first_at`` with its first message, once, in C as in the reference; a call with a turn
    stamps the turn and leaves ``first_at`` alone."""
    import time

    from rollout_router.proxy.grpc import conn
    from rollout_router.proxy.grpc.outbound import PyStream

    engine = _reading_engine()
    message = h2.py_frame(h2.DATA, 0, 1, _message_bytes(random.Random(2)))
    for read, stream in ((engine.read, engine.Stream), (h2.py_read, PyStream)):
        _, upstream, call = _relay(False, (65_535, 1 << 20, 1 << 20), stream, timed=False)
        before = time.monotonic()
        original, conn.h2.read = conn.h2.read, read
        try:
            conn.py_data_received(upstream, message)
            stamped = call.first_at
            conn.py_data_received(upstream, message)
        finally:
            conn.h2.read = original
        assert call.heard == 2 and before <= stamped <= time.monotonic() and call.first_at == stamped
        _, upstream, call = _relay(False, (65_535, 1 << 20, 1 << 20), stream)
        assert read(upstream, bytearray(message), 200, 1, [], [False], type(call)) is False
        assert call.turn.first_byte is not None and call.first_at == 0.0


async def test_the_engine_hands_a_whole_header_block_straight_to_the_connection() -> None:
    """A plain HEADERS frame (the whole block: END_HEADERS, no padding, no priority) skips ``on_frame``: the engine
    decodes it and hands it to ``headers_frame`` with its flags, and the trailers end the call as through
    ``on_frame``; a padded one does not."""
    engine = _reading_engine()
    client, upstream, call = _relay(False, (65_535, 1 << 20, 1 << 20), engine.Stream)
    seen: list[int] = []
    upstream.on_frame = lambda kind, *rest: seen.append(kind)  # type: ignore[method-assign]
    trailers = h2.py_encode([(b"grpc-status", b"0")])
    padded = h2.py_frame(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS | h2.PADDED, 1, b"\x00" + trailers)
    assert engine.read(upstream, bytearray(padded), 200, 1, [], [False], type(call)) is False
    assert seen == [h2.HEADERS] and not call.finished
    plain = h2.py_frame(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, 1, trailers)
    from rollout_router.proxy.grpc.outbound import DIRTY, READING  # what the trailers emit is written at the end
    assert engine.read(upstream, bytearray(plain), 200, 1, DIRTY, READING, type(call)) is False
    assert seen == [h2.HEADERS] and call.finished and call.code == h2.OK
    assert client.transport.out == h2.py_frame(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, 1, trailers)


@pytest.mark.parametrize("case", ["bad block", "budget spent", "response head", "trailers", "stream gone"])
async def test_the_engines_header_block_does_what_the_reference_does(case: str) -> None:
    """A plain whole header block through the engine (``_header_block``) and through the reference (``py_read``:
    ``on_frame``, ``_headers``, ``header_block``): a block that does not decode and one past the decoded-header
    budget close the connection with the same GOAWAY; a response head, trailers and a block for a stream the
    connection no longer holds leave the same bytes written to both sides, the same call and the same streams."""
    from types import SimpleNamespace

    from rollout_router.proxy.grpc.guard import Bucket
    from rollout_router.proxy.grpc.outbound import DIRTY, READING

    engine = _reading_engine()
    fields = [(b":status", b"200"), (b"content-type", b"application/grpc")] if case == "response head" else \
        [(b"grpc-status", b"0"), (b"grpc-message", b"")]
    block = b"\xfe" if case == "bad block" else h2.py_encode(fields)
    flags = h2.END_HEADERS | (0 if case == "response head" else h2.END_STREAM)
    frame = h2.py_frame(h2.HEADERS, flags, 3 if case == "stream gone" else 1, block)
    seen = []
    for reader in (h2.py_read, engine.read):
        client, upstream, call = _relay(False, (65_535, 1 << 20, 1 << 20), engine.Stream)
        call.answered = False  # (the head is the first the call hears: it names the replica and its weights)
        call.proxy.context.rl = SimpleNamespace(versions={"r": "v7"})
        if case == "budget spent":
            upstream.guard.headers = Bucket(0, 0.0)
        assert reader(upstream, bytearray(frame), 200, 1, DIRTY, READING, type(call)) is False
        seen.append((_state(client, upstream, call), call.answered, call.code))
    assert seen[0] == seen[1]
    closed = seen[0][0][1][5]
    assert closed == (case in ("bad block", "budget spent"))



@pytest.mark.parametrize("case", ["ok", "status not a number", "no status", "hop fields", "client closed",
                                  "answer waiting", "call finished", "first head", "first head forwarded",
                                  "first head, large", "second head", "trailers only"])
async def test_the_engine_relays_a_calls_head_and_trailers_as_the_reference_does(case: str) -> None:
    """The engine passes a call's first response head and, the call answered, its trailers (a plain whole block) to
    the client's stream itself, with one Python call each (``Call.answering``: the fields the router adds;
    ``Call.complete``: the call's end), not through ``headers_frame`` and ``on_headers``: the bytes written to both
    sides, the streams, the call's code and its end are the reference's, with a status that is not a number or
    none, connection-specific fields dropped, the client gone, a call forwarded (no fields added), a head larger
    than a frame (CONTINUATION); with the answer waiting on its stream, the call already finished, a second head
    or trailers with no head before them it leaves them to Python, which does the same."""
    from types import SimpleNamespace

    from rollout_router.proxy.grpc.outbound import DIRTY, READING

    engine = _reading_engine()
    head = case.startswith("first head") or case == "second head"
    fields = {"status not a number": [(b"grpc-status", b"x1")], "no status": [(b"grpc-message", b"m")],
              "hop fields": [(b"connection", b"close"), (b"grpc-status", b"0"), (b"te", b"trailers")],
              "first head, large": [(b":status", b"200"), (b"x-big", b"b" * (h2.FRAME_SIZE + 10))]}.get(
        case, [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"connection", b"x")] if head else
        [(b"grpc-status", b"0"), (b"grpc-message", b"")])
    frame = h2.py_frame(h2.HEADERS, h2.END_HEADERS | (0 if head else h2.END_STREAM), 1, h2.py_encode(fields))
    seen, ends = [], []
    for reader in (h2.py_read, engine.read):
        client, upstream, call = _relay(False, (65_535, 1 << 20, 1 << 20), engine.Stream)
        call.ended, call.proxy.active = ends.append, {call}
        call.proxy.context.rl = SimpleNamespace(versions={"r": "v7"})
        call.answered = not case.startswith("first head") and case != "trailers only"
        call.forwarded = case == "first head forwarded"
        call.chunks, call.received, call.held = [b"request"], 7, 7  # kept for a retry until the head came
        if case == "client closed":
            client.closed = True
        elif case == "answer waiting":
            client.send_data(call.stream, b"\x00" * 10, False)
            client.window = 0
            client.send_data(call.stream, b"\x00" * 10, False)
        elif case == "call finished":
            call.finished = True
        heads: list[tuple] = []
        if reader is engine.read and case not in ("answer waiting", "call finished", "second head", "trailers only"):
            upstream.headers_frame = lambda *args: heads.append(args)  # type: ignore[method-assign]
        assert reader(upstream, bytearray(frame), 200, 1, DIRTY, READING, type(call)) is False
        assert heads == []
        seen.append((_state(client, upstream, call), call.answered, call.code, call.ustream is None, call.retained,
                     call.chunks, call.held))
    assert seen[0] == seen[1]
    assert ends == ([] if case == "call finished" or head else [None, None])
    assert seen[0][2] == {"ok": h2.OK, "status not a number": h2.UNKNOWN, "no status": None,
                          "hop fields": h2.OK}.get(case, seen[0][2])
    if case == "hop fields":
        assert seen[0][0][0][0].endswith(h2.py_frame(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, 1,
                                                     h2.py_encode([(b"grpc-status", b"0")])))


_HEAD_FIELDS = [(b":method", b"POST"), (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/s/m"),
                (b":path", b""), (b":authority", b"r"), (b":status", b"200"), (b":", b"x"), (b"", b"x"),
                (b"content-length", b"12"), (b"content-length", b"1x"), (b"content-length", b"007"),
                (b"te", b"trailers"), (b"te", b"gzip"), (b"connection", b"close"), (b"Upgrade", b"h2c"),
                (b"keep-alive", b"1"), (b"host", b"r"), (b"X-Session-Id", b"s1"), (b"x-session-id", b"s1"),
                (b"content-type", b"application/grpc"), (b"x-\xff", b"\xff"), (b"transfer-encoding", b"chunked"),
                (b"proxy-connection", b"x")]


@pytest.mark.parametrize("seed", range(200))
def test_the_engines_request_head_rules_match_the_reference(seed: int) -> None:
    """``_grpc_frames.request_head`` and ``field_problem`` (RFC 9113 8.2, 8.3: every new call's head) against their
    reference in rules.py: well-formed gRPC heads and heads mutated (fields dropped, repeated, moved, added: pseudo
    fields after regular ones, unknown pseudo fields, empty :path, upper-case names, connection-specific fields, TE
    and content-length of every kind) give the same problem, :method, :path and content-length."""
    from rollout_router.proxy.grpc import rules

    engine = _engine()
    rng = random.Random(seed)
    for _ in range(50):
        head = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/s/m"), (b":authority", b"r"),
                (b"te", b"trailers"), (b"content-type", b"application/grpc"), (b"x-session-id", b"s1")]
        for _ in range(rng.choice([0, 0, 1, 2, 4])):
            pick = rng.random()
            if pick < 0.3 and head:
                del head[rng.randrange(len(head))]
            elif pick < 0.5 and head:
                head.insert(rng.randrange(len(head) + 1), head[rng.randrange(len(head))])
            else:
                head.insert(rng.randrange(len(head) + 1), rng.choice(_HEAD_FIELDS))
        assert engine.request_head(head) == rules.py_request_head(head)
        for name, value in head:
            assert engine.field_problem(name, value) == rules.py_field_problem(name, value)
    running = h2.engine_unavailable() is None
    assert (rules.request_head is engine.request_head) == running
    assert (rules.field_problem is engine.field_problem) == running


def test_the_engine_knows_the_connection_window() -> None:
    from rollout_router.proxy.grpc.conn import CONNECTION_WINDOW
    assert _engine().CONNECTION_HALF == CONNECTION_WINDOW // 2


@pytest.mark.parametrize("seed", range(30))
def test_encode_matches_the_reference(seed: int) -> None:
    """Header blocks built in C are py_encode's, byte for byte: lengths on either side of each prefix boundary
    (127, 128 + 127 ...), empty names and values, from lists, tuples and generators."""
    engine, rng = _engine(), random.Random(seed)
    for _ in range(50):
        fields = [(bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 126, 127, 128, 254, 255, 300]))),
                   bytes(rng.randrange(256) for _ in range(rng.choice([0, 5, 126, 127, 128, 16_510, 16_511, 70_000]))))
                  for _ in range(rng.randrange(0, 5))]
        expected = h2.py_encode(fields)
        assert engine.encode(fields) == expected and engine.encode(tuple(fields)) == expected
        assert engine.encode(iter(fields)) == expected


def test_the_engines_stream_starts_as_the_reference_does() -> None:
    """``_grpc_frames.Stream`` is ``outbound.PyStream`` in C: the same fields, the same starting values, each
    writable; ``outbound.Stream`` names it where the engine runs."""
    from types import SimpleNamespace

    from rollout_router.proxy.grpc import outbound

    engine = _engine()
    fields = ("id", "owner", "conn", "window", "pending", "unacked", "closing", "ended", "expected", "got")
    conn, owner = SimpleNamespace(peer_window=4321), object()
    compiled, reference = engine.Stream(7, owner, conn), outbound.PyStream(7, owner, conn)  # type: ignore[arg-type]
    assert [getattr(compiled, f) for f in fields] == [getattr(reference, f) for f in fields]
    assert set(fields) == set(outbound.PyStream.__slots__)
    for name, value in (("window", -5), ("unacked", 9), ("got", 3), ("ended", True), ("closing", 0), ("expected", 2),
                        ("pending", []), ("owner", None)):
        setattr(compiled, name, value)
        assert getattr(compiled, name) == value
    assert outbound.Stream is (engine.Stream if h2.engine_unavailable() is None else outbound.PyStream)


def test_the_engines_call_and_connection_fields_are_the_references() -> None:
    """``_grpc_frames.ConnFields`` and ``CallFields`` hold the fields of ``outbound.PyConnFields`` and
    ``call.PyCallFields`` (the relay reads them without the C API's lookups), each writable and read back as
    written from Python; ``H2Output`` and ``Call`` are built on them where the engine runs, on the references
    elsewhere."""
    from rollout_router.proxy.grpc import call, outbound

    engine = _engine()
    for compiled, reference in ((engine.ConnFields, outbound.PyConnFields), (engine.CallFields, call.PyCallFields)):
        fields = {name for name, value in vars(compiled).items() if type(value).__name__ == "getset_descriptor"}
        assert fields == set(reference.__slots__)
    conn, record = engine.ConnFields(), engine.CallFields()
    for name, value in (("transport", object()), ("streams", {1: None}), ("out", [b"x"]), ("blocked", {}),
                        ("guard", object()), ("continuing", (1, 0, bytearray())), ("window", -5),
                        ("peer_window", 70_000), ("unacked", 9), ("stream_window", 1 << 20), ("closed", True),
                        ("write_paused", True), ("preface", bytearray(b"PRI")), ("head_clock", True),
                        ("head_since", 2.5)):
        setattr(conn, name, value)
        assert getattr(conn, name) == value
    for name, value in (("client", object()), ("stream", object()), ("upstream", None), ("ustream", object()),
                        ("turn", None), ("last", object()), ("first", True), ("relayed", True), ("heard", 3),
                        ("code", 14), ("answered", True), ("finished", True), ("first_at", 2.5)):
        setattr(record, name, value)
        assert getattr(record, name) == value
    running = h2.engine_unavailable() is None
    assert (outbound.ConnFields is engine.ConnFields) == running and (call.CallFields is engine.CallFields) == running
    assert issubclass(outbound.H2Output, outbound.ConnFields) and issubclass(call.Call, call.CallFields)


@pytest.mark.parametrize("seed", range(40))
def test_a_measured_calls_last_message_is_the_same_fed_whole_or_in_pieces(seed: int) -> None:
    """``LastMessage.feed`` takes a frame that is one whole message (how a replica sends them, so how the relay
    passes them, once per message) without its loop: fed the same messages whole, or each in two or more random
    pieces (which only the loop handles: a message's first piece never looks whole), it keeps the same newest
    message after each one (compressed, empty and oversized ones too)."""
    from rollout_router.proxy.grpc import usage

    rng = random.Random(seed)
    messages = []
    for _ in range(rng.randrange(1, 8)):
        flag = 1 if rng.random() < 0.1 else 0
        size = rng.choice([0, 1, 5, 40, 700, usage.MESSAGE_LIMIT + 1]) if rng.random() < 0.95 else 3
        messages.append(bytes((flag,)) + size.to_bytes(4, "big") + bytes(rng.randrange(256) for _ in range(min(size, 64)))
                        * (size // 64 + 1))
    messages = [m[:5 + int.from_bytes(m[1:5], "big")] for m in messages]

    whole, pieces = usage.LastMessage(), usage.LastMessage()
    for message in messages:
        whole.feed(message)
        data, cut = message, rng.randrange(1, len(message))  # the first piece: never the whole message
        while data:
            piece, data = data[:cut], data[cut:]
            pieces.feed(piece)
            cut = rng.randrange(1, len(data) + 1) if data and rng.random() < 0.7 else len(data)
        assert whole.last == pieces.last

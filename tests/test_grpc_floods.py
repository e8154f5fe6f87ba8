"""The gRPC listener's per-connection HTTP/2 budgets (issue 21, findings 3, 5, 6, 9): floods end in GOAWAY
(ENHANCE_YOUR_CALM), counted; one connection gets its share of the call slots; idle connections are closed;
one connection's burst is parsed a slice per event-loop turn.

A raw HTTP/2 client sends what no gRPC library would.
"""
from __future__ import annotations

import asyncio

import grpc
import hpack
import pytest
from grpc import aio

from rollout_router.proxy.grpc import guard, h2
from rollout_router.proxy.grpc.conn import H2Connection
from rollout_router.proxy.grpc.upstream import UpstreamConnection, Upstreams, answer_window
from tests.support import running_router, wait_for
from tests.test_grpc_limits import sample
from tests.test_grpc_proxy import HEALTH_CHECK, GrpcReplica, backends


@pytest.fixture
async def replica():
    started = await GrpcReplica("127.0.0.66").start()
    yield started
    started.hold.set()
    await started.stop()


class Raw:
    """A bare HTTP/2 connection: frames in one write, frames read back one by one."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int) -> Raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(h2.PREFACE + h2.settings_frame({}))
        return cls(reader, writer)

    async def frames(self, timeout: float = 10.0):
        """(type, flags, stream id, payload) until the router closes the connection."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    head = await self.reader.readexactly(9)
                    payload = await self.reader.readexactly(int.from_bytes(head[:3], "big"))
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                yield head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload

    async def goaway(self) -> int | None:
        """The error code of the router's GOAWAY (None when it closed without one)."""
        async for kind, _, _, payload in self.frames():
            if kind == h2.GOAWAY:
                return int.from_bytes(payload[4:8], "big")
        return None

    def close(self) -> None:
        self.writer.close()


def head(path: str = "/test.Echo/Hold", extra: list[tuple[str, str]] | None = None,
         encoder: hpack.Encoder | None = None) -> bytes:
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "router"),
              ("content-type", "application/grpc"), ("te", "trailers"), *(extra or [])]
    return (encoder or hpack.Encoder()).encode(fields)


async def flooded(replica, frames: bytes, reason: str) -> None:
    """Send ``frames`` in one write: the router answers GOAWAY ENHANCE_YOUR_CALM and counts ``reason``; another
    client is served meanwhile and after."""
    async with running_router(backends([replica]), grpc=True) as (_, runtime):
        client = await Raw.connect(runtime.grpc_port)
        client.writer.write(frames)
        assert await client.goaway() == h2.ENHANCE_YOUR_CALM
        client.close()
        assert sample(runtime, "rolloutrouter_request_errors_total", reason=reason) == 1
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            answer = await channel.unary_unary("/test.Echo/Unary")(b"after", metadata=(("x-session-id", "o"),))
            assert answer.startswith(b"after|")


async def test_rapid_reset_is_answered_with_enhance_your_calm(replica):
    block = head()
    frames = b"".join(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, block) + h2.rst_stream(sid, h2.CANCEL)
                      for sid in range(1, 2 * (guard.RESET_BURST + 50), 2))
    await flooded(replica, frames, "h2_reset_flood")


async def test_a_ping_flood_is_answered_with_enhance_your_calm(replica):
    ping = h2.frame(h2.PING, 0, 0, b"12345678")
    await flooded(replica, ping * (guard.CONTROL_BURST + 50), "h2_control_flood")


async def test_a_settings_flood_is_answered_with_enhance_your_calm(replica):
    await flooded(replica, h2.settings_frame({}) * (guard.CONTROL_BURST + 50), "h2_control_flood")


async def test_empty_continuation_frames_are_answered_with_enhance_your_calm(replica):
    frames = h2.frame(h2.HEADERS, 0, 1, head()) + h2.frame(h2.CONTINUATION, 0, 1) * 5
    await flooded(replica, frames, "h2_empty_frames")


async def test_a_header_inserted_once_and_referenced_by_many_streams_is_budgeted_as_decoded_bytes(replica):
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/test.Echo/Unary"), (b":authority", b"r"),
              (b"content-type", b"application/grpc")]
    inserted = hpack.Encoder().encode([("x-big", "b" * 4000)])  # with incremental indexing: index 62
    frames = [h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, h2.encode(fields) + inserted)]
    for sid in range(3, 2 * 120, 2):  # each names it 14 times: 14 bytes on the wire, ~56 KB decoded
        frames.append(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, h2.encode(fields) + b"\xbe" * 14))
    assert sum(len(f) for f in frames) < 40_000 and 120 * 14 * 4000 > guard.HEADER_BURST
    await flooded(replica, b"".join(frames), "h2_header_flood")


async def test_an_hpack_bomb_in_one_small_block_is_refused_before_it_is_expanded(replica):
    """One 4 KB header inserted, then referenced 16,000 times in the same block: 20 KB on the wire, 64 MB decoded.
    The decoder stops at the 64 KiB head limit as it goes (this held before the HTTP/2 budgets, and must still)."""
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/test.Echo/Unary"), (b":authority", b"r"),
              (b"content-type", b"application/grpc")]
    block = h2.encode(fields) + hpack.Encoder().encode([("x-big", "b" * 4000)]) + b"\xbe" * 16_000
    async with running_router(backends([replica]), grpc=True) as (_, runtime):
        client = await Raw.connect(runtime.grpc_port)
        client.writer.write(h2.headers_frames(1, block, True))
        async for kind, _, sid, payload in client.frames():
            if kind == h2.HEADERS and sid == 1:
                assert ("grpc-status", str(h2.RESOURCE_EXHAUSTED)) in hpack.Decoder().decode(payload)
                break
        client.close()
        assert not replica.seen


async def test_a_table_size_update_beyond_the_announced_size_is_a_compression_error(replica):
    update = bytes((0x3F,)) + b"\xe0\xff\xff\xff\x0f"  # dynamic table size update to 2^32 - 1 (RFC 7541 6.3)
    async with running_router(backends([replica]), grpc=True) as (_, runtime):
        client = await Raw.connect(runtime.grpc_port)
        client.writer.write(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, update + head()))
        assert await client.goaway() == h2.COMPRESSION_ERROR
        client.close()
        assert not replica.seen


async def test_one_connection_gets_its_share_of_the_call_slots_and_refused_streams_beyond(replica):
    settings = backends([replica]).model_copy(update={"max_grpc_streams_per_connection": 3})
    async with running_router(settings, grpc=True) as (_, runtime):
        client = await Raw.connect(runtime.grpc_port)
        message = b"\x00\x00\x00\x00\x01h"
        client.writer.write(b"".join(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, head())
                                     + h2.frame(h2.DATA, h2.END_STREAM, sid, message) for sid in (1, 3, 5, 7)))
        announced, refused = None, None
        async for kind, flags, sid, payload in client.frames():
            if kind == h2.SETTINGS and not flags & h2.ACK:
                values = {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
                          for i in range(0, len(payload), 6)}
                announced = values[h2.MAX_CONCURRENT_STREAMS]
            if kind == h2.RST_STREAM:
                refused = (sid, int.from_bytes(payload, "big"))
                break
        assert announced == 3 and refused == (7, h2.REFUSED_STREAM)
        await wait_for(lambda: replica.active == 3)
        assert sample(runtime, "rolloutrouter_request_errors_total", reason="connection_stream_limit") == 1
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:  # another client is served
            answer = await channel.unary_unary("/test.Echo/Unary")(b"other", metadata=(("x-session-id", "o"),))
            assert answer.startswith(b"other|")
        client.close()


async def test_a_client_streaming_call_that_never_ends_its_request_gets_the_body_timeout(replica):
    settings = backends([replica]).model_copy(update={"body_timeout_seconds": 1.0})
    async with running_router(settings, grpc=True) as (_, runtime):
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            never_ends = asyncio.Event()

            async def requests():
                yield b"one"
                await never_ends.wait()

            call = channel.stream_unary("/test.Echo/Gather")(requests(), metadata=(("x-session-id", "g"),))
            with pytest.raises(aio.AioRpcError) as raised:
                await call
            assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert "bodyTimeoutSeconds=1" in raised.value.details()
        await wait_for(lambda: not runtime.grpc_proxy.calls)


async def test_an_idle_grpc_connection_is_told_goaway_and_closed(replica):
    settings = backends([replica]).model_copy(update={"grpc_idle_timeout_seconds": 0.5})
    async with running_router(settings, grpc=True) as (_, runtime):
        client = await Raw.connect(runtime.grpc_port)
        assert await client.goaway() == h2.NO_ERROR
        await wait_for(lambda: not runtime.grpc_proxy.clients)
        assert sample(runtime, "rolloutrouter_request_errors_total", reason="idle_timeout") == 1


class Transport:
    """Just enough of a transport to count writes and reading pauses."""

    def __init__(self) -> None:
        self.paused, self.closed, self.written = False, False, 0

    def write(self, data: bytes) -> None:
        self.written += data.count(h2.frame(h2.PING, h2.ACK, 0, b"12345678"))

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True


async def test_one_read_is_parsed_a_slice_per_event_loop_turn_with_reading_paused_meanwhile():
    conn, transport = H2Connection(), Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(h2.frame(h2.PING, 0, 0, b"12345678") * (guard.FRAMES_PER_TURN * 3))
    assert transport.written == guard.FRAMES_PER_TURN and transport.paused
    await wait_for(lambda: transport.written == guard.FRAMES_PER_TURN * 3 and not transport.paused)


async def test_a_clients_header_blocks_weigh_more_in_the_slice_parsed_per_turn():
    class Counting(H2Connection):
        heads = 0

        def headers_frame(self, stream_id: int, headers: list[h2.Header], end: bool) -> None:
            self.heads += 1

    conn, transport = Counting(), Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    per_turn = guard.FRAMES_PER_TURN // guard.HEAD_WORK
    conn.data_received(b"".join(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, head())
                                for sid in range(1, 2 * 3 * per_turn, 2)))
    assert conn.heads == per_turn and transport.paused
    await wait_for(lambda: conn.heads == 3 * per_turn and not transport.paused)


async def test_a_one_message_call_takes_a_replica_only_once_its_message_is_whole(replica):
    """A vLLM call's stream opened (and perhaps reset, as rapid reset does) before its message arrived costs no
    routing decision and no replica stream: the in-flight count stays 0 while it waits."""
    message = b"\x00\x00\x00\x00\x00"
    async with running_router(backends([replica]), grpc=True) as (_, runtime):
        client = await Raw.connect(runtime.grpc_port)
        client.writer.write(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, head(HEALTH_CHECK))  # no message yet
                            + h2.frame(h2.HEADERS, h2.END_HEADERS, 3, head(HEALTH_CHECK))
                            + h2.rst_stream(3, h2.CANCEL)  # reset before its message
                            + h2.frame(h2.HEADERS, h2.END_HEADERS, 5, head(HEALTH_CHECK))
                            + h2.frame(h2.DATA, h2.END_STREAM, 5, message))
        frames = client.frames()
        async for kind, flags, sid, _ in frames:  # stream 5's answer: the router has handled all three
            if kind == h2.HEADERS and flags & h2.END_STREAM and sid == 5:
                break
        assert len(runtime.grpc_proxy.calls) == 1 and runtime.replicas.total_inflight() == 0
        client.writer.write(h2.frame(h2.DATA, h2.END_STREAM, 1, message))
        async for kind, flags, sid, payload in frames:
            if kind == h2.HEADERS and flags & h2.END_STREAM and sid == 1:
                assert ("grpc-status", "0") in hpack.Decoder().decode(payload)  # the router's are not indexed
                break
        await wait_for(lambda: not runtime.grpc_proxy.calls and runtime.replicas.total_inflight() == 0)
        client.close()


async def test_a_one_message_call_larger_than_its_stream_window_is_held_whole_and_relayed(replica):
    """Held until whole, the message is still acknowledged to the client as it arrives: a message beyond the
    stream window (1 MiB) does not wait for a replica that has not been asked yet."""
    async with running_router(backends([replica]), grpc=True) as (_, runtime):
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            answer = await channel.unary_unary(HEALTH_CHECK)(b"p" * (3 << 20), timeout=20)
        assert answer == b"\x08\x01"
        await wait_for(lambda: runtime.grpc_proxy.buffered == 0 and runtime.replicas.total_inflight() == 0)


def waiting_bytes(runtime) -> int:
    """Answer bytes the router holds for its gRPC clients, counted from the streams themselves."""
    return sum(len(data) for client in runtime.grpc_proxy.clients for stream in client.streams.values()
               for is_data, data, _ in stream.pending or () if is_data)


async def test_500_never_reading_calls_hold_a_bounded_answer_each_counted_in_the_budget():
    flooding = await GrpcReplica("127.0.0.67", chunks=8).start()  # 2 MiB answers, sent as fast as allowed
    settings = backends([flooding]).model_copy(update={"max_grpc_streams": 1000})  # 256 MiB / 1000: 64 KiB windows
    try:
        async with running_router(settings, grpc=True) as (_, runtime):
            message = b"\x00\x00\x00\x00\x01f"
            clients = [await Raw.connect(runtime.grpc_port) for _ in range(5)]  # 100 calls each, never read
            for client in clients:
                client.writer.write(b"".join(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, head("/test.Echo/Flood"))
                                             + h2.frame(h2.DATA, h2.END_STREAM, sid, message)
                                             for sid in range(1, 200, 2)))
            await wait_for(lambda: len(flooding.seen) == 500, timeout=30)
            seen: list[int] = []  # the bytes waiting, once per poll, until the replica can send no more
            await wait_for(lambda: seen.append(waiting_bytes(runtime)) or len(seen) > 3 and seen[-1] == seen[-4]
                           and seen[-1] >= 450 * 65_535, timeout=60, interval=0.2)
            held = seen[-1]
            assert held <= 510 * 65_535  # a call's answer waits within the replica's 64 KiB window (was 1 MiB)
            assert runtime.grpc_proxy.buffered >= held  # and counts in maxBufferedBytes
            for client in clients:
                client.close()
            await wait_for(lambda: runtime.grpc_proxy.buffered == 0 and not runtime.grpc_proxy.calls, timeout=30)
    finally:
        await flooding.stop()


async def test_every_call_slot_full_of_unread_answers_holds_no_more_than_max_buffered_bytes():
    """The replica's stream window is maxBufferedBytes / maxGrpcStreams (at most 64 KiB): with every call slot
    taken by a client that never reads, what the router holds stays within the budget (it held 64 KiB a call)."""
    flooding = await GrpcReplica("127.0.0.68", chunks=8).start()
    budget, calls = 1 << 20, 50
    settings = backends([flooding]).model_copy(update={"max_grpc_streams": calls, "max_buffered_bytes": budget})
    window = answer_window(budget, calls)
    assert window < 65_535 and calls * 65_535 > budget
    try:
        async with running_router(settings, grpc=True) as (_, runtime):
            client = await Raw.connect(runtime.grpc_port)
            client.writer.write(b"".join(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, head("/test.Echo/Flood"))
                                         + h2.frame(h2.DATA, h2.END_STREAM, sid, b"\x00\x00\x00\x00\x01f")
                                         for sid in range(1, 2 * calls, 2)))
            await wait_for(lambda: len(flooding.seen) == calls, timeout=30)
            seen: list[int] = []
            await wait_for(lambda: seen.append(waiting_bytes(runtime)) or len(seen) > 3 and seen[-1] == seen[-4]
                           and seen[-1] >= (calls - 5) * window, timeout=60, interval=0.2)
            assert seen[-1] <= budget and runtime.grpc_proxy.buffered <= budget + 1024
            client.close()
            await wait_for(lambda: runtime.grpc_proxy.buffered == 0 and not runtime.grpc_proxy.calls, timeout=30)
    finally:
        await flooding.stop()


async def test_a_replica_connection_carrying_many_calls_meets_no_client_budget():
    """Every call to a replica shares one connection: its heads and resets are not a client's flood."""
    conn, transport = UpstreamConnection(Upstreams(), "127.0.0.1:1"), Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    inserted = hpack.Encoder().encode([("x-big", "b" * 4000)])
    frames = [h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, inserted)]
    frames += [h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, b"\xbe" * 14) for sid in range(3, 400, 2)]
    frames += [h2.frame(h2.PING, 0, 0, b"12345678")] * (guard.CONTROL_BURST + 50)
    conn.data_received(b"".join(frames))
    await wait_for(lambda: not conn.yielding)  # every frame handled, a slice a turn
    assert not conn.closed and not transport.closed

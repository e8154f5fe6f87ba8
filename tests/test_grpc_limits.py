"""The gRPC listener under hostile clients: many calls, many connections, huge messages and heads, slow uploads.

Each limit answers RESOURCE_EXHAUSTED (or DEADLINE_EXCEEDED for a deadline) with a message naming the setting,
is logged once per episode where it is a bound on clients, is counted, and leaks nothing: calls, in-flight
counts and buffered bytes all return to 0. The raw HTTP/2 client below is for what no gRPC library sends.
"""
from __future__ import annotations

import asyncio
import logging

import grpc
import hpack
import pytest
from grpc import aio

from rollout_router.proxy.grpc import h2
from tests.support import running_router, wait_for
from tests.test_grpc_proxy import GrpcReplica, backends


@pytest.fixture
async def replicas():
    started = [await GrpcReplica(f"127.0.0.{60 + i}").start() for i in range(2)]
    yield started
    for replica in started:
        replica.hold.set()
        await replica.stop()


def sample(runtime, name: str, **labels) -> float:
    return runtime.metrics.registry.get_sample_value(name, labels) or 0.0


async def hold(channel, session: str, body: bytes = b"h"):
    return channel.unary_unary("/test.Echo/Hold")(body, metadata=(("x-session-id", session),))


async def refused(call) -> aio.AioRpcError:
    with pytest.raises(aio.AioRpcError) as raised:
        await call
    return raised.value


def leak_free(runtime) -> bool:
    proxy = runtime.grpc_proxy
    return not proxy.calls and proxy.buffered == 0 and runtime.replicas.total_inflight() == 0


async def test_calls_beyond_max_grpc_streams_get_resource_exhausted_and_one_log_line(replicas, caplog):
    caplog.set_level(logging.WARNING, logger="rollout_router.proxy.grpc")
    settings = backends(replicas).model_copy(update={"max_grpc_streams": 3})
    async with running_router(settings, grpc=True) as (_, runtime):
        target, own = f"127.0.0.1:{runtime.grpc_port}", [("grpc.use_local_subchannel_pool", 1)]
        # A connection announces maxGrpcStreams as its stream limit (a gRPC client queues calls beyond it), so
        # the calls past the bound come on another connection, as from another client.
        async with aio.insecure_channel(target, options=own) as channel, \
                aio.insecure_channel(target, options=own) as other:
            held = [await hold(channel, f"s{i}") for i in range(3)]
            await wait_for(lambda: sum(r.active for r in replicas) == 3)
            assert sample(runtime, "rolloutrouter_grpc_calls") == 3
            for session in ("x", "y"):
                error = await refused(await hold(other, session))
                assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "maxGrpcStreams=3" in error.details()
            assert sample(runtime, "rolloutrouter_request_errors_total", reason="stream_limit") == 2
            assert len([r for r in caplog.records if "maxGrpcStreams=3" in r.message]) == 1
            for replica in replicas:
                replica.hold.set()
            assert [await call for call in held] == [b"released"] * 3
            response = await channel.unary_unary("/test.Echo/Unary")(b"after", metadata=(("x-session-id", "z"),))
            assert response.startswith(b"after|")
        await wait_for(lambda: leak_free(runtime))


async def test_connections_beyond_max_connections_get_resource_exhausted_naming_the_limit(replicas, caplog):
    caplog.set_level(logging.WARNING, logger="rollout_router.proxy.listener")
    settings = backends(replicas).model_copy(update={"max_connections": 2})
    async with running_router(settings, grpc=True) as (_, runtime):
        target = f"127.0.0.1:{runtime.grpc_port}"
        channels = [aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(3)]
        try:
            held = [await hold(channel, f"c{i}") for i, channel in enumerate(channels[:2])]
            await wait_for(lambda: sum(r.active for r in replicas) == 2)
            error = await refused(await hold(channels[2], "c2"))
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "maxConnections=2" in error.details()
            assert sample(runtime, "rolloutrouter_connections_rejected_total", listener="grpc") >= 1
            assert sample(runtime, "rolloutrouter_client_connections", listener="grpc") == 3
            assert any("grpc listener" in r.message and "maxConnections=2" in r.message for r in caplog.records)
            for replica in replicas:
                replica.hold.set()
            assert [await call for call in held] == [b"released"] * 2
        finally:
            for channel in channels:
                await channel.close()
        await wait_for(lambda: leak_free(runtime))


async def test_a_request_message_over_max_body_bytes_is_refused_before_the_replica_gets_it(replicas):
    settings = backends(replicas).model_copy(update={"max_body_bytes": 64 * 1024})
    async with running_router(settings, grpc=True) as (_, runtime):
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            call = channel.unary_unary("/test.Echo/Unary")(b"x" * (1 << 20), metadata=(("x-session-id", "big"),))
            error = await refused(call)
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "1048576 bytes exceeds maxBodyBytes=65536" in error.details()
            assert sample(runtime, "rolloutrouter_request_errors_total", reason="message_too_large") == 1
            assert not any(seen["request"] for r in replicas for seen in r.seen)  # nothing reached a handler
            ok = await channel.unary_unary("/test.Echo/Unary")(b"y" * 60_000, metadata=(("x-session-id", "ok"),))
            assert ok.startswith(b"y" * 10)
        await wait_for(lambda: leak_free(runtime))


async def test_request_bytes_held_share_the_max_buffered_bytes_budget(replicas):
    """Requests kept for a retry until their replica answers are held bytes: past the budget, RESOURCE_EXHAUSTED."""
    settings = backends(replicas).model_copy(update={"max_buffered_bytes": 100_000})
    async with running_router(settings, grpc=True) as (_, runtime):
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            held = [await hold(channel, f"b{i}", b"x" * 40_000) for i in range(2)]
            await wait_for(lambda: sum(r.active for r in replicas) == 2)
            assert runtime.grpc_proxy.buffered >= 80_000
            assert sample(runtime, "rolloutrouter_buffered_request_bytes", listener="grpc") >= 80_000
            error = await refused(await hold(channel, "b2", b"x" * 40_000))
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "maxBufferedBytes=100000" in error.details()
            assert runtime.http_proxy.budget is runtime.grpc_proxy.budget  # one budget with the HTTP traffic port
            for replica in replicas:
                replica.hold.set()
            assert [await call for call in held] == [b"released"] * 2
        await wait_for(lambda: leak_free(runtime))


class RawClient:
    """An HTTP/2 client that sends exactly the frames a test asks for."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.decoder = hpack.Decoder()

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(h2.PREFACE + h2.settings_frame({}))
        return cls(reader, writer)

    def head(self, path: str, session: str = "raw", padding: int = 0) -> bytes:
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "router"),
                  ("content-type", "application/grpc"), ("te", "trailers"), ("x-session-id", session),
                  *([("x-padding", "p" * padding)] if padding else [])]
        return hpack.Encoder().encode(fields)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def answer(self, stream_id: int, timeout: float = 10.0) -> dict[str, str] | None:
        """The header fields that end ``stream_id``, or None when the connection closes first (GOAWAY)."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    head = await self.reader.readexactly(9)
                except asyncio.IncompleteReadError:
                    return None
                length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
                sid = int.from_bytes(head[5:9], "big")
                payload = await self.reader.readexactly(length)
                if kind == h2.HEADERS and sid == stream_id and flags & h2.END_STREAM:
                    return {k.decode(): v.decode() for k, v in self.decoder.decode(payload, raw=True)}

    def close(self) -> None:
        self.writer.close()


async def test_a_slow_one_message_request_gets_deadline_exceeded_and_its_bytes_back(replicas):
    settings = backends(replicas).model_copy(update={"body_timeout_seconds": 1.0})
    async with running_router(settings, grpc=True) as (_, runtime):
        runtime.grpc_proxy.unary_methods = frozenset({b"/test.Echo/Unary"})
        client = await RawClient.connect(runtime.grpc_port)
        try:
            client.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, client.head("/test.Echo/Unary")))
            client.send(h2.frame(h2.DATA, 0, 1, b"\x00" + (1000).to_bytes(4, "big") + b"x" * 100))  # 100 of 1000
            await wait_for(lambda: runtime.grpc_proxy.buffered > 0)
            answer = await client.answer(1)
            assert answer is not None and answer["grpc-status"] == str(h2.DEADLINE_EXCEEDED)
            assert "bodyTimeoutSeconds=1" in answer["grpc-message"]
        finally:
            client.close()
        assert sample(runtime, "rolloutrouter_request_errors_total", reason="body_timeout") == 1
        await wait_for(lambda: leak_free(runtime))


async def test_a_head_that_never_completes_closes_the_connection_after_the_header_timeout(replicas):
    settings = backends(replicas).model_copy(update={"header_timeout_seconds": 1.0})
    async with running_router(settings, grpc=True) as (_, runtime):
        client = await RawClient.connect(runtime.grpc_port)
        try:
            block = client.head("/test.Echo/Unary")
            client.send(h2.frame(h2.HEADERS, 0, 1, block))  # no END_HEADERS, and no CONTINUATION ever
            await wait_for(lambda: runtime.grpc_proxy.clients)
            assert await client.answer(1) is None  # GOAWAY, then the connection closes
        finally:
            client.close()
        assert sample(runtime, "rolloutrouter_request_errors_total", reason="header_timeout") == 1
        await wait_for(lambda: not runtime.grpc_proxy.clients)


async def test_a_header_block_over_64_kib_gets_resource_exhausted_and_the_connection_closes(replicas):
    async with running_router(backends(replicas), grpc=True) as (_, runtime):
        client = await RawClient.connect(runtime.grpc_port)
        try:
            block = client.head("/test.Echo/Unary", padding=100_000)
            parts = [block[i:i + h2.FRAME_SIZE] for i in range(0, len(block), h2.FRAME_SIZE)]
            client.send(h2.frame(h2.HEADERS, 0, 1, parts[0]))
            for part in parts[1:]:
                client.send(h2.frame(h2.CONTINUATION, 0, 1, part))
            answer = await client.answer(1)
            assert answer is not None and answer["grpc-status"] == str(h2.RESOURCE_EXHAUSTED)
            assert "65536 bytes" in answer["grpc-message"]
            assert await client.answer(3) is None  # and the connection is gone
        finally:
            client.close()
        assert not any(r.seen for r in replicas)
        await wait_for(lambda: not runtime.grpc_proxy.clients)

"""The gRPC listener over real sockets: passthrough, stickiness, shared accounting, failures."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
import grpc
import pytest
from grpc import aio

from rollout_router.proxy.listener import SWEEP_SECONDS
from rollout_router.settings import RouterSettings
from tests.support import NO_PROBES, ScriptedReplica, running_router, wait_for

HEALTH_CHECK = "/vllm.grpc.engine.VllmEngine/HealthCheck"
HEALTHY = b"\x08\x01"  # HealthCheckResponse{healthy: true}


@dataclass
class GrpcReplica:
    """A raw-bytes gRPC server: vLLM's HealthCheck answers healthy, Echo answers once, Stream answers ``chunks`` times, Hold waits, StallAfterOne
    answers once and then waits, Flood answers ``chunks`` messages of 256 KiB as fast as it may, Gather (client
    streaming) reads every request message, sends its response head, then waits."""

    host: str
    chunks: int = 3
    hold: asyncio.Event = field(default_factory=asyncio.Event)
    seen: list[dict] = field(default_factory=list)
    active: int = 0
    cancelled: int = 0
    port: int = 0
    server: aio.Server | None = None

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> GrpcReplica:
        self.server = aio.server()
        self.server.add_generic_rpc_handlers((self,))
        self.port = self.server.add_insecure_port(f"{self.host}:{self.port or 0}")
        await self.server.start()
        return self

    async def stop(self) -> None:
        await self.server.stop(grace=None)

    def service(self, details):
        behaviours = {"/test.Echo/Unary": self._unary, "/test.Echo/Stream": self._stream,
                      "/test.Echo/Hold": self._hold, "/test.Echo/Fail": self._fail,
                      "/test.Echo/StallAfterOne": self._stall_after_one, "/test.Echo/Flood": self._flood,
                      "/test.Echo/Gather": self._gather, HEALTH_CHECK: self._health}
        behaviour = behaviours.get(details.method)
        if behaviour is None:
            return None
        if details.method in ("/test.Echo/Stream", "/test.Echo/StallAfterOne", "/test.Echo/Flood"):
            return grpc.unary_stream_rpc_method_handler(behaviour)
        if details.method == "/test.Echo/Gather":
            return grpc.stream_unary_rpc_method_handler(behaviour)
        return grpc.unary_unary_rpc_method_handler(behaviour)

    async def _health(self, request: bytes, context) -> bytes:
        """vLLM's HealthCheck, which the router's gRPC probe calls on every replica with a gRPC address."""
        return HEALTHY

    def _record(self, request: bytes, context) -> None:
        self.seen.append({"request": request, "metadata": dict(context.invocation_metadata())})

    async def _unary(self, request: bytes, context) -> bytes:
        self._record(request, context)
        return request + b"|" + self.target.encode()

    async def _stream(self, request: bytes, context):
        self._record(request, context)
        await context.send_initial_metadata((("x-upstream", "yes"),))
        for index in range(self.chunks):
            yield f"{request.decode()}-{index}".encode()
            await asyncio.sleep(0.01)
        context.set_trailing_metadata((("x-tokens", str(self.chunks)),))

    async def _hold(self, request: bytes, context) -> bytes:
        self._record(request, context)
        await self._stall()
        return b"released"

    async def _stall_after_one(self, request: bytes, context):
        self._record(request, context)
        yield b"first"
        await self._stall()

    async def _gather(self, requests, context) -> bytes:
        gathered = b"".join([request async for request in requests])
        self._record(gathered, context)
        await context.send_initial_metadata((("x-upstream", "yes"),))
        await self._stall()
        return gathered

    async def _stall(self) -> None:
        self.active += 1
        try:
            await self.hold.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1

    async def _flood(self, request: bytes, context):
        self._record(request, context)
        for index in range(self.chunks):
            yield bytes([index % 256]) * (256 << 10)

    async def _fail(self, request: bytes, context) -> bytes:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty")


@pytest.fixture
async def replicas():
    started = [await GrpcReplica(f"127.0.0.{40 + i}").start() for i in range(3)]
    yield started
    for replica in started:
        await replica.stop()


def backends(replicas, http_port: int = 1) -> RouterSettings:
    """Each gRPC replica is also named by an HTTP URL (its identity; nothing serves it here, so no probes)."""
    return RouterSettings(backends=[{"url": f"http://{r.host}:{http_port}", "grpc": r.target} for r in replicas],
                          connect_retries=3, health=NO_PROBES)


@pytest.fixture
async def router(replicas):
    async with running_router(backends(replicas), grpc=True) as (base, runtime):
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            yield base, runtime, channel


def url_of(replica) -> str:
    return f"http://{replica.host}:1"


async def unary(channel, method: str, body: bytes, session: str | None = None):
    metadata = (("x-session-id", session),) if session else ()
    call = channel.unary_unary(method)(body, metadata=metadata)
    response = await call
    return response, dict(await call.initial_metadata())


async def test_unary_calls_stick_to_one_replica(router, replicas):
    base, runtime, channel = router
    for session in ("a", "b", "c"):
        served = set()
        for turn in range(3):
            response, headers = await unary(channel, "/test.Echo/Unary", f"{session}{turn}".encode(), session)
            target = response.split(b"|")[1].decode()
            assert headers["x-rolloutrouter-replica"] == url_of(next(r for r in replicas if r.target == target))
            served.add(target)
        assert len(served) == 1
    counters = runtime.balancer.policy.counters
    assert counters.new_sessions == 3 and counters.affinity_kept == 6
    seen = [m for r in replicas for m in r.seen]
    assert all(m["metadata"]["x-session-id"] for m in seen)


async def test_a_clients_hop_mark_is_never_relayed(router, replicas):
    """As over HTTP (tests/test_proxy.py): the mark a call came with is not what the replica (or an owner) gets."""
    _, _, channel = router
    call = channel.unary_unary("/test.Echo/Unary")(b"x", metadata=(
        ("x-session-id", "s"), ("x-rolloutrouter-forwarded-by", "http://127.0.0.1:1")))
    await call
    [seen] = [m for r in replicas for m in r.seen]
    assert seen["metadata"]["x-session-id"] == "s" and "x-rolloutrouter-forwarded-by" not in seen["metadata"]


async def test_server_streaming_passes_messages_and_metadata_through(router):
    _, runtime, channel = router
    call = channel.unary_stream("/test.Echo/Stream")(b"tok", metadata=(("x-session-id", "s"),))
    messages = [m async for m in call]
    assert messages == [b"tok-0", b"tok-1", b"tok-2"]
    headers, trailers = dict(await call.initial_metadata()), dict(await call.trailing_metadata())
    assert headers["x-upstream"] == "yes" and "x-rolloutrouter-replica" in headers
    assert trailers["x-tokens"] == "3" and await call.code() is grpc.StatusCode.OK
    assert runtime.replicas.total_inflight() == 0


async def test_every_kept_call_routed_in_the_read_records_its_first_message(router):
    """A one-message call routed in the read that completed it (``GrpcProxy._here``) is routed as the HTTP lane
    routes (``attempts.taken``): a kept turn that is not measured has no ``Turn``, and its first message's time
    goes to the kept turns' time to first byte all the same (``Call.first_at``), once a call, as a measured one's
    does through its ``Turn``."""
    _, runtime, channel = router
    runtime.grpc_proxy.unary_methods = frozenset({b"/test.Echo/Stream"})  # one request message, as vLLM's Generate
    margin = runtime.metrics.margin
    started = time.monotonic()
    for turn in range(6):
        call = channel.unary_stream("/test.Echo/Stream")(f"t{turn}".encode(), metadata=(("x-session-id", "s"),))
        assert [m async for m in call] == [f"t{turn}-{i}".encode() for i in range(3)]
    took = time.monotonic() - started
    counts = {outcome: (sum(child.counts), child.sum) for outcome, child in margin._ttfb.items()}
    assert counts["new"][0] == 1 and counts["kept"][0] == 5
    assert 0 < counts["kept"][1] < took
    assert runtime.balancer.policy.counters.affinity_kept == 5 and runtime.replicas.total_inflight() == 0


async def test_grpc_and_http_share_one_inflight_count_per_replica():
    """A held gRPC call counts on its replica, so the next HTTP turn's margin decision sees it."""
    hosts = [f"127.0.0.{50 + i}" for i in range(2)]
    http_side = [await ScriptedReplica(h).start() for h in hosts]
    grpc_side = [await GrpcReplica(h).start() for h in hosts]
    settings = RouterSettings(backends=[{"url": h.url, "grpc": g.target} for h, g in zip(http_side, grpc_side)],
                              affinity_break_margin=0)
    try:
        async with running_router(settings, grpc=True) as (base, runtime), \
                aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel, aiohttp.ClientSession() as http:
            async def http_turn() -> str:
                async with http.post(f"{base}/v1/chat/completions", json={"messages": []},
                                     headers={"X-Session-ID": "conv"}) as response:
                    return response.headers["X-RolloutRouter-Replica"]
            pinned = await http_turn()
            runtime.balancer.policy.table.pin("other", pinned, time.monotonic())
            held = asyncio.ensure_future(unary(channel, "/test.Echo/Hold", b"h", "other"))
            await wait_for(lambda: runtime.replicas.loads()[pinned] == 1)
            async with http.get(f"{runtime.admin_url}/status") as response:
                status = await response.json()
            assert {b["url"]: b["inflight"] for b in status["backends"]}[pinned] == 1
            assert await http_turn() != pinned  # skew 1 (from gRPC) > margin 0: the HTTP turn moves
            assert runtime.balancer.policy.counters.affinity_broken == 1
            for g in grpc_side:
                g.hold.set()
            assert (await held)[0] == b"released"
            assert runtime.replicas.total_inflight() == 0
    finally:
        for server in (*http_side, *grpc_side):
            await server.stop()


async def test_client_cancel_cancels_upstream_and_releases(router, replicas):
    _, runtime, channel = router
    call = channel.unary_unary("/test.Echo/Hold")(b"h", metadata=(("x-session-id", "gone"),))
    await wait_for(lambda: sum(r.active for r in replicas) == 1)
    assert runtime.replicas.total_inflight() == 1
    call.cancel()
    await wait_for(lambda: sum(r.cancelled for r in replicas) == 1)
    await wait_for(lambda: runtime.replicas.total_inflight() == 0)
    assert runtime.balancer.policy.sessions() == 1


async def test_upstream_status_and_details_reach_the_client(router):
    _, runtime, channel = router
    with pytest.raises(aio.AioRpcError) as raised:
        await unary(channel, "/test.Echo/Fail", b"", "s")
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT and raised.value.details() == "prompt is empty"
    assert runtime.replicas.total_inflight() == 0
    with pytest.raises(aio.AioRpcError) as raised:  # a vLLM method this replica lacks: relayed as unary
        await unary(channel, "/vllm.grpc.engine.VllmEngine/Embed", b"", "s")
    assert raised.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_refused_replica_is_retried_elsewhere_and_marked_down(router, replicas):
    _, runtime, channel = router
    _, headers = await unary(channel, "/test.Echo/Unary", b"x", "s")
    pinned = next(r for r in replicas if url_of(r) == headers["x-rolloutrouter-replica"])
    await pinned.stop()
    response, headers = await unary(channel, "/test.Echo/Unary", b"y", "s")
    assert headers["x-rolloutrouter-replica"] != url_of(pinned) and response.startswith(b"y|")
    assert url_of(pinned) not in runtime.replicas.loads()
    assert runtime.balancer.policy.counters.repinned_replica_gone == 1
    assert runtime.replicas.total_inflight() == 0


async def test_no_grpc_replica_answers_unavailable():
    settings = RouterSettings(backends=["http://127.0.0.1:1"])  # HTTP only
    async with running_router(settings, grpc=True) as (_, runtime):
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            with pytest.raises(aio.AioRpcError) as raised:
                await unary(channel, "/test.Echo/Unary", b"x", "s")
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "no replica with a gRPC port" in raised.value.details()


async def test_a_removed_replica_keeps_its_channel_until_its_calls_drain(router, replicas):
    _, runtime, channel = router
    call = channel.unary_unary("/test.Echo/Hold")(b"h", metadata=(("x-session-id", "drain"),))
    await wait_for(lambda: sum(r.active for r in replicas) == 1)
    holder = next(r for r in replicas if r.active)
    runtime.replicas.remove(url_of(holder))  # the pod went unready mid-call
    runtime.grpc_proxy.prune()
    holder.hold.set()
    assert await call == b"released"
    runtime.grpc_proxy.prune()  # drained now: its channel can go
    assert holder.target not in runtime.replicas.grpc_targets()


async def test_a_silent_replica_gets_deadline_exceeded_after_the_first_byte_timeout_and_is_ejected(replicas):
    settings = backends(replicas).model_copy(update={
        "first_byte_timeout_seconds": 0.2,
        "health": NO_PROBES.model_copy(update={"consecutive_failures": 1})})
    async with running_router(settings, grpc=True) as (_, runtime):
        runtime.grpc_proxy.unary_methods = frozenset({b"/test.Echo/Hold"})  # one request message, as vLLM's Generate
        runtime.balancer.policy.table.pin("s", url_of(replicas[0]), time.monotonic())
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            with pytest.raises(aio.AioRpcError) as raised:
                await unary(channel, "/test.Echo/Hold", b"h", "s")
            assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert "did not answer in time" in raised.value.details()
            await wait_for(lambda: replicas[0].cancelled == 1)  # the replica's work is stopped
            assert url_of(replicas[0]) not in runtime.replicas.loads()
            response, headers = await unary(channel, "/test.Echo/Unary", b"again", "s")
            assert headers["x-rolloutrouter-replica"] != url_of(replicas[0])
        assert runtime.balancer.repinned == {"ejected": 1} and runtime.replicas.total_inflight() == 0
        assert runtime.balancer.policy.sessions() == 1


def silence_limited(replicas, seconds: float) -> RouterSettings:
    return backends(replicas).model_copy(update={"upstream_timeout_seconds": seconds})


async def test_a_replica_silent_mid_stream_ends_the_call_with_deadline_exceeded_and_releases_it(replicas):
    async with running_router(silence_limited(replicas, 0.5), grpc=True) as (_, runtime):
        runtime.balancer.policy.table.pin("s", url_of(replicas[0]), time.monotonic())
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            call = channel.unary_stream("/test.Echo/StallAfterOne")(b"go", metadata=(("x-session-id", "s"),),
                                                                    timeout=20)  # the client's own deadline: later
            messages = []
            with pytest.raises(aio.AioRpcError) as raised:
                async for message in call:
                    messages.append(message)
            assert messages == [b"first"]  # what came before the silence reached the client
            assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert "sent nothing" in raised.value.details() and "upstreamTimeoutSeconds=0.5" in raised.value.details()
        await wait_for(lambda: replicas[0].cancelled == 1)  # the replica's work is stopped
        assert runtime.replicas.total_inflight() == 0
        assert runtime.balancer.policy.pinned("s", time.monotonic()) == url_of(replicas[0])  # the pin stays


async def test_a_client_slow_to_read_is_not_a_silent_replica(replicas):
    """64 MiB of messages outgrow every window and socket buffer between the replica and a client that stops
    reading for 4 sweeps (> upstreamTimeoutSeconds=1.5): the replica is held back by the client, and the call
    still completes."""
    for replica in replicas:
        replica.chunks = 256
    async with running_router(silence_limited(replicas, 1.5), grpc=True) as (_, runtime):
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            call = channel.unary_stream("/test.Echo/Flood")(b"go")
            stream = call.__aiter__()
            first = await stream.__anext__()
            proxy, since = runtime.grpc_proxy, runtime.grpc_proxy.now  # the sweep's clock, moved once a sweep
            await wait_for(lambda: proxy.now >= since + 3.9 * SWEEP_SECONDS, timeout=15)  # 4 sweeps of no reading
            rest = [message async for message in stream]
            assert [first, *rest] == [bytes([i % 256]) * (256 << 10) for i in range(256)]
            assert await call.code() is grpc.StatusCode.OK
        assert runtime.replicas.total_inflight() == 0


async def test_a_client_streaming_call_whose_replica_falls_silent_after_its_head_ends_too(replicas):
    async with running_router(silence_limited(replicas, 0.5), grpc=True) as (_, runtime):
        async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
            call = channel.stream_unary("/test.Echo/Gather")(iter([b"a", b"b"]), timeout=20)
            with pytest.raises(aio.AioRpcError) as raised:
                await call
            assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert "sent nothing" in raised.value.details()
        await wait_for(lambda: sum(r.cancelled for r in replicas) == 1)
        assert [r.seen[0]["request"] for r in replicas if r.seen] == [b"ab"]
        assert runtime.replicas.total_inflight() == 0


class StreamRefuser(asyncio.Protocol):
    """A replica whose HTTP/2 connection stays open but refuses every stream (RST_STREAM REFUSED_STREAM), as a
    server at its stream limit does; ``streams`` counts the refusals, ``connections`` the connections made."""

    streams = 0
    connections = 0

    def connection_made(self, transport) -> None:
        from rollout_router.proxy.grpc import h2
        self.transport, self.buffer = transport, bytearray()
        StreamRefuser.connections += 1
        transport.write(h2.py_frame(h2.SETTINGS, 0, 0))

    def data_received(self, data: bytes) -> None:
        from rollout_router.proxy.grpc import h2
        self.buffer += data
        if self.buffer.startswith(h2.PREFACE):
            del self.buffer[:len(h2.PREFACE)]
        frames, used, _ = h2.py_split_frames(self.buffer, 1000)
        del self.buffer[:used]
        for kind, flags, stream_id, _payload in frames:
            if kind == h2.SETTINGS and not flags & h2.ACK:
                self.transport.write(h2.py_frame(h2.SETTINGS, h2.ACK, 0))
            elif kind == h2.HEADERS:
                StreamRefuser.streams += 1
                self.transport.write(h2.rst_stream(stream_id, h2.REFUSED_STREAM))


async def test_a_stream_refused_on_an_open_connection_is_retried_elsewhere(replicas):
    """A one-message call routed and started from the read that completed it, on a connection already open, whose
    replica refuses the stream (REFUSED_STREAM: it never saw the call): the call is retried on another replica as a
    refused connect is, counted as a retry, and every replica is put back."""
    server = await asyncio.get_running_loop().create_server(StreamRefuser, "127.0.0.48", 0)
    refuser = f"127.0.0.48:{server.sockets[0].getsockname()[1]}"
    StreamRefuser.streams = StreamRefuser.connections = 0
    settings = RouterSettings(backends=[{"url": "http://127.0.0.48:1", "grpc": refuser},
                                        {"url": url_of(replicas[0]), "grpc": replicas[0].target}],
                              connect_retries=3, down_seconds=0.01, health=NO_PROBES)
    try:
        async with running_router(settings, grpc=True) as (_, runtime):
            async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
                for index in range(20):  # vLLM's HealthCheck: a one-message call, started from the read
                    response, headers = await unary(channel, HEALTH_CHECK, b"", f"s{index}")
                    assert headers["x-rolloutrouter-replica"] == url_of(replicas[0]) and response == HEALTHY
                    await asyncio.sleep(0.02)  # the refuser's downSeconds over: routable again
            retries = runtime.metrics.retries.child(runtime.metrics.backend_label("http://127.0.0.48:1")).value
            assert StreamRefuser.streams >= 2 and StreamRefuser.connections == 1  # refused on an open connection
            assert retries == StreamRefuser.streams
            assert runtime.replicas.total_inflight() == 0
    finally:
        server.close()
        await server.wait_closed()


async def test_a_bug_starting_a_call_from_the_read_answers_internal_and_puts_the_replica_back(router, monkeypatch):
    """A one-message call started from the read (its replica's connection open) whose attempt fails to start with a
    bug: the client is told INTERNAL, as a bug on the call's task tells it, and the replica is put back."""
    from rollout_router.proxy.grpc.call import Call

    _, runtime, channel = router
    await unary(channel, HEALTH_CHECK, b"", "bug")  # the replica's connection, open
    monkeypatch.setattr(Call, "dispatch", lambda *args: 1 / 0)
    with pytest.raises(aio.AioRpcError) as raised:
        await unary(channel, HEALTH_CHECK, b"", "bug")
    assert raised.value.code() is grpc.StatusCode.INTERNAL
    assert runtime.replicas.total_inflight() == 0 and not runtime.grpc_proxy.active

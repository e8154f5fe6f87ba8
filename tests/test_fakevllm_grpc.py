"""fake-vllm's gRPC frontend: vLLM's VllmEngine service on the engine the HTTP side uses."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
from aiohttp import web
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from rollout_router.fakevllm import FakeVllmConfig, create_app, start_grpc
from rollout_router.fakevllm.api import ENGINE
from rollout_router.fakevllm.engine import Engine
from rollout_router.fakevllm.tokens import output_word, tokenize
from tests.support import wait_for
from tests.test_fakevllm import (
    assert_idle,
    assert_stops_cleanly_on_sigterm,
    fake_vllm_process,
    printed_line,
    scrape,
    words,
)


@dataclasses.dataclass
class Replica:
    url: str
    target: str
    app: web.Application
    stub: pb_grpc.VllmEngineStub

    @property
    def engine(self) -> Engine:
        return self.app[ENGINE]


@contextlib.asynccontextmanager
async def serving(host: str = "127.0.0.5", **knobs: object) -> AsyncIterator[Replica]:
    """One replica with both frontends on ``host``, each on a free port."""
    app = create_app(FakeVllmConfig(**knobs))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    server, port = await start_grpc(app, host, 0)
    channel = grpc.aio.insecure_channel(f"{host}:{port}")
    try:
        yield Replica(f"http://{host}:{runner.addresses[0][1]}", f"{host}:{port}", app,
                      pb_grpc.VllmEngineStub(channel))
    finally:
        await channel.close()
        await server.stop(0.5)
        await runner.cleanup()


def generate(ids: list[int] | None = None, max_tokens: int | None = None, stream: bool = True,
             request_id: str = "", text: str | None = None) -> pb.GenerateRequest:
    params = pb.SamplingParams() if max_tokens is None else pb.SamplingParams(max_tokens=max_tokens)
    request = pb.GenerateRequest(request_id=request_id, sampling_params=params, stream=stream)
    if text is not None:
        request.text = text
    elif ids is not None:
        request.tokenized.CopyFrom(pb.TokenizedInput(input_ids=ids))
    return request


def expected_ids(num_prompt: int, count: int) -> list[int]:
    return tokenize(" ".join(output_word(num_prompt, i) for i in range(count)))


# --------------------------------------------------------------------------- Generate


async def test_streaming_generate_sends_chunks_then_complete():
    async with serving() as replica:
        prompt = tokenize(words(20))
        call = replica.stub.Generate(generate(prompt, max_tokens=7, request_id="r1"),
                                     metadata=(("x-session-id", "conv-1"),))
        messages = [m async for m in call]
        assert await call.code() == grpc.StatusCode.OK
        kinds = [m.WhichOneof("response") for m in messages]
        assert kinds[-1] == "complete" and set(kinds[:-1]) == {"chunk"}
        chunks = [m.chunk for m in messages[:-1]]
        streamed = [t for c in chunks for t in c.token_ids]
        assert streamed == expected_ids(20, 7)
        assert all(c.completion_tokens == len(c.token_ids) and c.prompt_tokens == 20 for c in chunks)
        assert all(c.cached_tokens == 0 and c.index == 0 for c in chunks)
        done = messages[-1].complete
        # Like vLLM's servicer, the complete of a stream repeats the last delta.
        assert done.finish_reason == "length" and list(done.output_ids) == list(chunks[-1].token_ids)
        assert done.completion_tokens == len(done.output_ids) and done.prompt_tokens == 20

        # No max_tokens: the default length, finished by an "EOS"; text input is tokenized.
        messages = [m async for m in replica.stub.Generate(generate(text="a b c"))]
        assert sum(len(m.chunk.token_ids) for m in messages[:-1]) == 16
        assert messages[-1].complete.finish_reason == "stop" and messages[-1].complete.prompt_tokens == 3
        assert_idle(replica.engine)


async def test_non_streaming_generate_sends_one_complete():
    async with serving(speed=10) as replica:
        messages = [m async for m in replica.stub.Generate(generate(tokenize("x y z w"), 9, stream=False))]
        assert len(messages) == 1
        done = messages[0].complete
        assert list(done.output_ids) == expected_ids(4, 9)
        assert (done.finish_reason, done.prompt_tokens, done.completion_tokens) == ("length", 4, 9)
        assert_idle(replica.engine)


# --------------------------------------------------------------------------- unary rpcs


async def test_health_model_server_info_and_loads():
    async with serving(served_model_name="m1", max_model_len=4096, block_size=8, num_blocks=512,
                       max_num_seqs=32) as replica:
        stub = replica.stub
        health = await stub.HealthCheck(pb.HealthCheckRequest())
        assert health.healthy and health.message
        info = await stub.GetModelInfo(pb.GetModelInfoRequest())
        assert info.served_model_name == "m1" and info.is_generation and not info.supports_vision
        assert info.max_context_length == 4096 and info.max_req_input_len == 4096
        assert info.vocab_size > max(tokenize(words(50)))
        loads = await stub.GetLoads(pb.GetLoadsRequest())
        assert loads.dp_rank_count == 1 and len(loads.loads) == 1 and loads.timestamp
        idle = loads.loads[0]
        assert (idle.num_running_reqs, idle.num_waiting_reqs, idle.token_usage) == (0, 0, 0)
        assert idle.max_total_num_tokens == 8 * 512 and idle.max_running_requests == 32

        call = stub.Generate(generate(tokenize(words(100)), max_tokens=3000))
        await call.read()
        busy = (await stub.GetLoads(pb.GetLoadsRequest())).loads[0]
        assert busy.num_running_reqs == 1 and busy.num_total_reqs == 1
        assert busy.num_used_tokens >= 100 and busy.token_usage == busy.num_used_tokens / (8 * 512)
        server = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert server.server_type == "vllm-grpc" and server.active_requests == 1
        assert server.block_size == 8 and server.max_num_seqs == 32 and server.uptime_seconds > 0
        assert server.last_receive_timestamp > 0
        call.cancel()
        await wait_for(lambda: not replica.engine.scheduler.running)
        assert (await stub.GetLoads(pb.GetLoadsRequest())).loads[0].num_running_reqs == 0


# --------------------------------------------------------------------------- aborts


async def test_cancel_and_abort_free_the_request(caplog):
    caplog.set_level(logging.DEBUG)
    async with serving() as replica, aiohttp.ClientSession() as session:
        engine, stub = replica.engine, replica.stub
        prompt = tokenize(words(100))
        # A client that cancels mid-stream, and one that gives up on a plain call.
        call = stub.Generate(generate(prompt, max_tokens=5000))
        assert (await call.read()).WhichOneof("response") == "chunk"
        assert len(engine.scheduler.running) == 1 and engine.pool.num_used > 0
        call.cancel()
        await wait_for(lambda: not engine.scheduler.running)
        assert_idle(engine)
        plain = stub.Generate(generate(prompt, max_tokens=5000, stream=False))
        reading = asyncio.create_task(plain.read())
        await wait_for(lambda: engine.scheduler.running)
        plain.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        await wait_for(lambda: not engine.scheduler.running)
        assert_idle(engine)

        # Abort by id: the stream ends as vLLM's does, an empty chunk then "abort".
        victim = stub.Generate(generate(prompt, max_tokens=5000, request_id="victim"))
        first = await victim.read()
        await stub.Abort(pb.AbortRequest(request_ids=["victim", "unknown"]))
        rest = []
        while (message := await victim.read()) is not grpc.aio.EOF:
            rest.append(message)
        assert rest[-1].complete.finish_reason == "abort" and len(rest[-1].complete.output_ids) == 0
        assert rest[-2].WhichOneof("response") == "chunk" and len(rest[-2].chunk.token_ids) == 0
        tokens = list(first.chunk.token_ids) + [t for m in rest[:-1] for t in m.chunk.token_ids]
        assert tokens == expected_ids(100, len(tokens))
        assert_idle(engine)

        metrics = await scrape(session, replica.url)
        assert metrics[("vllm:num_requests_running", "")] == 0
        assert metrics[("vllm:kv_cache_usage_perc", "")] == 0
        assert metrics[("vllm:request_success_total", "abort")] == 3
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


# --------------------------------------------------------------------------- errors


async def test_bad_input_is_invalid_argument_and_other_rpcs_unimplemented():
    async with serving(max_model_len=64) as replica:
        cases = [
            (generate([]), "cannot be empty"),
            (generate(text=""), "cannot be empty"),
            (generate(), "no input"),
            (generate(tokenize(words(60))), "maximum context length is 64"),
            (generate(tokenize(words(10)), max_tokens=60), "maximum context length is 64"),
            (generate([1, 2], max_tokens=0), "max_tokens must be at least 1"),
        ]
        for request, message in cases:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                [m async for m in replica.stub.Generate(request)]
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
            assert message in error.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await replica.stub.Embed(pb.EmbedRequest(tokenized=pb.TokenizedInput(input_ids=[1])))
        assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert_idle(replica.engine)


# --------------------------------------------------------------------------- shared engine


async def test_grpc_hits_the_prefix_cache_an_http_request_filled():
    async with serving() as replica, aiohttp.ClientSession() as session:
        prompt = words(40)
        async with session.post(f"{replica.url}/tokenize", json={"prompt": prompt}) as response:
            ids = (await response.json())["tokens"]
        async with session.post(f"{replica.url}/v1/completions",
                                json={"prompt": prompt, "max_tokens": 2}) as response:
            assert (await response.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        messages = [m async for m in replica.stub.Generate(generate(ids, max_tokens=3))]
        done = messages[-1].complete
        assert done.cached_tokens == 32 == messages[0].chunk.cached_tokens  # full blocks of 39 tokens
        metrics = await scrape(session, replica.url)
        assert metrics[("vllm:prompt_tokens_total", "")] == 80
        assert metrics[("vllm:generation_tokens_total", "")] == 5
        assert metrics[("vllm:prefix_cache_queries_total", "")] == 80
        assert metrics[("vllm:prefix_cache_hits_total", "")] == 32
        assert metrics[("vllm:request_success_total", "length")] == 2
        assert metrics[("vllm:time_to_first_token_seconds_count", "")] == 2
        assert_idle(replica.engine)


# --------------------------------------------------------------------------- CLI


async def test_cli_serves_http_and_grpc_until_sigterm():
    async with fake_vllm_process("--host", "127.0.0.6", "--port", "0", "--grpc-port", "0", "--speed", "10") as proc:
        http_line, grpc_line = await printed_line(proc), await printed_line(proc)
        assert http_line.startswith("fake-vllm listening on http://127.0.0.6:")
        assert grpc_line.startswith("fake-vllm grpc listening on 127.0.0.6:")
        url, target = http_line.rsplit(" ", 1)[1], grpc_line.rsplit(" ", 1)[1]
        assert url.rsplit(":", 1)[1] != target.rsplit(":", 1)[1]
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.VllmEngineStub(channel)
            assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy
            messages = [m async for m in stub.Generate(generate(tokenize("p q r"), 4, stream=False))]
            assert messages[-1].complete.completion_tokens == 4
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/health") as response:
                assert response.status == 200
            assert (await scrape(session, url))[("vllm:generation_tokens_total", "")] == 4
        await assert_stops_cleanly_on_sigterm(proc)

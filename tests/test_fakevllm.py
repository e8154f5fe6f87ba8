"""The simulated vLLM replica: prefix cache, scheduler, timing, HTTP surface, metrics, CLI."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from rollout_router.fakevllm import FakeVllmConfig, add_arguments, create_app
from rollout_router.fakevllm.api import ENGINE
from rollout_router.fakevllm.cli import config_from_args
from rollout_router.fakevllm.engine import Engine
from rollout_router.fakevllm.metrics import Metrics
from rollout_router.fakevllm.prefix_cache import BlockPool, extend_hashes
from rollout_router.fakevllm.scheduler import Request, Scheduler, Status
from rollout_router.fakevllm.tokens import output_word, tokenize, word_id
from rollout_router.health import probe
from tests.support import run_in_virtual_time, wait_for

# --------------------------------------------------------------------------- helpers


@contextlib.asynccontextmanager
async def serving(host: str = "127.0.0.2", **knobs: object) -> AsyncIterator[tuple[str, web.Application]]:
    app = create_app(FakeVllmConfig(**knobs))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    try:
        yield f"http://{host}:{runner.addresses[0][1]}", app
    finally:
        await runner.cleanup()


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[tuple[str, str], float]:
    """Sample values by (name, finished_reason or "")."""
    async with session.get(f"{url}/metrics") as response:
        return samples(await response.text())


def samples(text: str) -> dict[tuple[str, str], float]:
    """Sample values of a metrics page by (name, finished_reason or "")."""
    return {(s.name, s.labels.get("finished_reason", "")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@contextlib.asynccontextmanager
async def running_engine(**knobs: object) -> AsyncIterator[Engine]:
    """A bare engine loop (no HTTP), for tests on a ``VirtualClockLoop``."""
    config = FakeVllmConfig(**knobs)
    engine = Engine(config, Metrics(config.served_model_name))
    task = asyncio.create_task(engine.run())
    try:
        yield engine
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def token_times(engine: Engine, prompt: str, max_tokens: int) -> list[float]:
    """When each token of one request arrives, from its submission, on the loop's clock."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    return [loop.time() - start async for _ in engine.submit(tokenize(prompt), max_tokens)]


def assert_idle(engine: Engine) -> None:
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert engine.pool.num_used == 0 and not engine._streams
    engine.pool.check()


# --------------------------------------------------------------------------- prefix cache


def test_pool_hits_only_full_blocks_of_a_matching_prefix():
    pool = BlockPool(num_blocks=8, block_size=4)
    tokens = list(range(10))  # two full blocks and a partial one
    hashes: list[int] = []
    extend_hashes(hashes, tokens, 4)
    assert len(hashes) == 2
    blocks = pool.allocate(3)
    assert pool.num_free + pool.num_used == 8 and pool.num_used == 3
    for block, h in zip(blocks, hashes):
        pool.cache(block, h)
    pool.free(blocks)
    pool.check()
    assert pool.num_used == 0
    assert pool.cached_prefix(hashes) == blocks[:2]  # freed blocks stay reusable

    other_tail: list[int] = []
    extend_hashes(other_tail, tokens[:4] + [99, 5, 6, 7], 4)
    assert pool.cached_prefix(other_tail) == blocks[:1]
    # Same second block after a different first block: the chained hash misses.
    other_head: list[int] = []
    extend_hashes(other_head, [99, 1, 2, 3] + tokens[4:8], 4)
    assert pool.cached_prefix(other_head) == []


def test_pool_evicts_least_recently_freed_and_request_tails_first():
    pool = BlockPool(num_blocks=8, block_size=2)
    a, b = pool.allocate(3), pool.allocate(2)
    a_hashes: list[int] = []
    b_hashes: list[int] = []
    extend_hashes(a_hashes, [1, 2, 3, 4, 5, 6], 2)
    extend_hashes(b_hashes, [7, 8, 9, 10], 2)
    for blocks, hashes in ((a, a_hashes), (b, b_hashes)):
        for block, h in zip(blocks, hashes):
            pool.cache(block, h)
    pool.free(a)
    pool.free(b)
    never_used = [5, 6, 7]
    assert pool.free_order() == never_used + [2, 1, 0] + [4, 3]

    pool.touch(pool.cached_prefix(b_hashes[:1]))  # a hit makes block 3 recent again
    pool.free([b[0]])
    assert pool.free_order() == never_used + [2, 1, 0, 4, 3]

    fresh = pool.allocate(4)  # the untouched blocks, then a's tail
    assert [block.id for block in fresh] == [5, 6, 7, 2]
    assert pool.cached_prefix(a_hashes) == a[:2]
    assert pool.cached_prefix(b_hashes) == b
    pool.check()


def test_pool_refuses_what_does_not_fit_counting_pinned_hits():
    pool = BlockPool(num_blocks=4, block_size=2)
    hashes: list[int] = []
    extend_hashes(hashes, [1, 2, 3, 4], 2)
    blocks = pool.allocate(2)
    for block, h in zip(blocks, hashes):
        pool.cache(block, h)
    pool.free(blocks)
    hit = pool.cached_prefix(hashes)
    assert pool.can_allocate(2, hit) and not pool.can_allocate(3, hit)
    with pytest.raises(MemoryError):
        pool.allocate(5)


PREFIXES = [[], [word_id(w) for w in "a shared system prompt".split()]]


@settings(max_examples=300, deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 4]),
    num_blocks=st.integers(6, 16),
    max_num_seqs=st.integers(1, 4),
    budget=st.integers(1, 16),
    ops=st.lists(st.one_of(
        st.tuples(st.just("add"), st.integers(0, 1), st.lists(st.integers(0, 2), min_size=1, max_size=6),
                  st.integers(1, 10)),
        st.tuples(st.just("step")),
        st.tuples(st.just("abort"), st.integers(0, 50)),
    ), min_size=4, max_size=60),
)
def test_scheduler_keeps_pool_invariants(block_size, num_blocks, max_num_seqs, budget, ops):
    pool = BlockPool(num_blocks, block_size)
    scheduler = Scheduler(pool, max_num_seqs, budget)
    requests: list[Request] = []
    queries = hits = 0

    def step() -> None:
        nonlocal queries, hits
        planned = scheduler.schedule()
        assert len(scheduler.running) <= max_num_seqs
        assert sum(n for _, n in planned.scheduled) <= budget
        queries, hits = queries + planned.cache_queries, hits + planned.cache_hits
        scheduler.complete(planned)

    def check() -> None:
        pool.check()
        held: dict[int, int] = {}
        for request in scheduler.running:
            assert request.status is Status.RUNNING
            assert len(request.blocks) * block_size >= request.num_computed
            for block in request.blocks:
                held[block.id] = held.get(block.id, 0) + 1
        assert all(not r.blocks for r in scheduler.waiting)
        assert {b.id: b.ref_cnt for b in pool.blocks if b.ref_cnt} == held
        assert pool.num_used == len(held)
        for request in requests:
            if request.num_cached_tokens is not None:
                assert request.num_cached_tokens % block_size == 0
                assert request.num_cached_tokens < request.num_prompt_tokens

    for op in ops:
        if op[0] == "add":
            _, prefix, suffix, max_tokens = op
            prompt = PREFIXES[prefix] + suffix
            request = Request(str(len(requests)), list(prompt), len(prompt), max_tokens)
            if scheduler.blocks_for(len(prompt) + max_tokens) <= num_blocks:
                scheduler.add(request)
                requests.append(request)
        elif op[0] == "step":
            step()
        elif requests:
            scheduler.abort(requests[op[1] % len(requests)])
        check()
    for _ in range(10_000):
        if not scheduler.has_work():
            break
        step()
        check()
    assert pool.num_used == 0 and hits <= queries
    for request in requests:
        assert request.status in (Status.FINISHED, Status.ABORTED)
        if request.status is Status.FINISHED:
            expected = [word_id(output_word(request.num_prompt_tokens, i)) for i in range(request.max_tokens)]
            assert request.tokens[request.num_prompt_tokens:] == expected


# --------------------------------------------------------------------------- timing


# Simulated time (VirtualClockLoop): each duration is exactly the sum of the engine's step costs,
# however loaded the machine running the test.


def test_cached_prefix_gives_lower_time_to_first_token():
    async def first_tokens() -> tuple[Engine, float, float]:
        async with running_engine() as engine:
            uncached = (await token_times(engine, words(2000), 2))[0]
            cached = (await token_times(engine, words(2000), 2))[0]
            return engine, uncached, cached

    engine, uncached, cached = run_in_virtual_time(first_tokens())
    assert uncached == pytest.approx(engine.config.step_seconds(1, 2000))  # one step prefills all 2000 tokens
    assert cached == pytest.approx(engine.config.step_seconds(1, 2000 - 1984)) and cached < uncached
    metrics = samples(engine.metrics.render().decode())
    assert metrics[("vllm:prefix_cache_queries_total", "")] == 4000
    assert metrics[("vllm:prefix_cache_hits_total", "")] == 1984  # full blocks of 1999 tokens
    assert metrics[("vllm:time_to_first_token_seconds_count", "")] == 2
    assert metrics[("vllm:time_to_first_token_seconds_sum", "")] == pytest.approx(uncached + cached)


def test_bigger_batch_decodes_slower():
    async def decode_spans() -> tuple[Engine, float, float]:
        async with running_engine(decode_ms_per_seq=0.5) as engine:
            alone = await token_times(engine, words(8, "probe"), 20)
            crowd = [asyncio.create_task(token_times(engine, words(8, f"c{i}"), 40)) for i in range(32)]
            await wait_for(lambda: len(engine.scheduler.running) == 32)
            batched = await token_times(engine, words(8, "probe"), 20)
            await asyncio.gather(*crowd)
            assert_idle(engine)
            return engine, alone[-1] - alone[0], batched[-1] - batched[0]

    engine, alone, batched = run_in_virtual_time(decode_spans())
    assert alone == pytest.approx(19 * engine.config.step_seconds(1, 0))
    assert batched == pytest.approx(19 * engine.config.step_seconds(33, 0))  # the crowd outlasts the probe
    assert batched > alone


async def test_preemption_and_waiting_keep_outputs_right():
    knobs = {"block_size": 4, "num_blocks": 16, "max_num_seqs": 3}
    async with serving(**knobs) as (url, app), aiohttp.ClientSession() as session:

        async def complete(i: int) -> dict:
            body = {"prompt": words(10, f"p{i}"), "max_tokens": 30}
            async with session.post(f"{url}/v1/completions", json=body) as response:
                return await response.json()

        tasks = [asyncio.create_task(complete(i)) for i in range(5)]
        await wait_for(lambda: len(app[ENGINE].scheduler.waiting) > 0)
        metrics = await scrape(session, url)
        assert metrics[("vllm:num_requests_waiting", "")] > 0
        results = await asyncio.gather(*tasks)
        metrics = await scrape(session, url)
        assert metrics[("vllm:num_preemptions_total", "")] > 0
        expected = " ".join(output_word(10, i) for i in range(30))
        assert all(r["choices"][0]["text"] == expected for r in results)
        assert all(r["usage"]["completion_tokens"] == 30 for r in results)
        assert_idle(app[ENGINE])


# --------------------------------------------------------------------------- OpenAI surface


async def test_openai_client_streams_and_completes():
    async with serving(host="127.0.0.3") as (url, app):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x")
        try:
            assert [m.id for m in (await client.models.list()).data] == ["tiny"]
            messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
            chat = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=5)
            assert chat.choices[0].finish_reason == "length"
            assert chat.usage.completion_tokens == 5 and chat.usage.prompt_tokens == 7
            assert chat.id.startswith("chatcmpl-") and chat.model == "tiny"

            stream = await client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=5, stream=True,
                stream_options={"include_usage": True})
            chunks = [chunk async for chunk in stream]
            assert chunks[0].choices[0].delta.role == "assistant"
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == chat.choices[0].message.content
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
            assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 12

            text_stream = await client.completions.create(model="tiny", prompt="a b c", stream=True)
            pieces = [chunk async for chunk in text_stream]
            assert len(pieces) == 16 and pieces[-1].choices[0].finish_reason == "stop"
            assert all(p.usage is None for p in pieces)
            done = await client.completions.create(model="tiny", prompt="a b c")
            assert done.choices[0].text == "".join(p.choices[0].text for p in pieces)
            assert done.choices[0].finish_reason == "stop" and done.usage.completion_tokens == 16
        finally:
            await client.close()
        assert_idle(app[ENGINE])


async def test_next_turn_hits_the_cache_over_the_previous_reply():
    async with serving() as (url, app):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x")
        try:
            turn = [{"role": "user", "content": words(40)}]
            first = await client.chat.completions.create(model="tiny", messages=turn, max_tokens=30)
            assert first.usage.prompt_tokens_details.cached_tokens == 0
            turn += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "and then"}]
            second = await client.chat.completions.create(model="tiny", messages=turn, max_tokens=3)
            computed = first.usage.prompt_tokens + 30 - 1  # the last sampled token is never computed
            assert second.usage.prompt_tokens_details.cached_tokens == computed // 16 * 16
        finally:
            await client.close()


async def test_errors_look_like_vllm():
    async with serving(max_model_len=64) as (url, app), aiohttp.ClientSession() as session:
        cases = [
            ("/v1/chat/completions", b"{not json", 400, None),
            ("/v1/chat/completions", b"[1, 2]", 400, None),
            ("/v1/chat/completions", b'{"model": "tiny"}', 400, "messages"),
            ("/v1/completions", b'{"prompt": "a", "max_tokens": 0}', 400, "max_tokens"),
            ("/v1/completions", b'{"prompt": ""}', 400, "prompt"),
            ("/v1/completions", json.dumps({"prompt": words(60)}).encode(), 400, "input_tokens"),
            ("/v1/completions", b'{"prompt": "a", "model": "big"}', 404, "model"),
            ("/v1/completions", b'{"prompt": "a", "stream_options": {"include_usage": true}}', 400, None),
            ("/tokenize", b'{"model": "tiny"}', 400, None),
        ]
        for path, body, status, param in cases:
            async with session.post(f"{url}{path}", data=body) as response:
                assert response.status == status, (path, body)
                error = (await response.json())["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["code"] == status and error["param"] == param and error["message"]
                assert error["type"] == ("BadRequestError" if status == 400 else "NotFoundError")
        assert_idle(app[ENGINE])


async def test_tokenize_health_and_models():
    async with serving(served_model_name="m1") as (url, app), aiohttp.ClientSession() as session:
        async with session.get(f"{url}/health") as response:
            assert response.status == 200
        assert await probe(url, "/health", 5.0) is None  # what the router's health probe sees
        async with session.get(f"{url}/v1/models") as response:
            assert (await response.json())["data"][0]["id"] == "m1"
        async with session.post(f"{url}/tokenize", json={"prompt": "a b  c"}) as response:
            body = await response.json()
        assert body["count"] == 3 and body["tokens"] == tokenize("a b c")
        chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x y"}]}]}
        async with session.post(f"{url}/tokenize", json=chat) as response:
            assert (await response.json())["tokens"] == tokenize("user: x y\nassistant:")


# --------------------------------------------------------------------------- metrics


VLLM_SAMPLES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count",
    "vllm:time_to_first_token_seconds_sum",
}


async def test_metrics_have_vllm_names_and_move_per_server():
    async with (serving(host="127.0.0.2", served_model_name="a") as (url_a, _),
                serving(host="127.0.0.3", served_model_name="b") as (url_b, _),
                aiohttp.ClientSession() as session):
        async with session.get(f"{url_a}/metrics") as response:
            text = await response.text()
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        assert VLLM_SAMPLES <= {s.name for s in samples}
        assert all(s.labels["model_name"] == "a" and s.labels["engine"] == "0" for s in samples)

        body = {"prompt": "one two three", "max_tokens": 4}
        async with session.post(f"{url_a}/v1/completions", json=body) as response:
            assert response.status == 200
        a, b = await scrape(session, url_a), await scrape(session, url_b)
        assert a[("vllm:prompt_tokens_total", "")] == 3 and a[("vllm:generation_tokens_total", "")] == 4
        assert a[("vllm:request_success_total", "length")] == 1
        assert a[("vllm:prefix_cache_queries_total", "")] == 3
        assert a[("vllm:time_to_first_token_seconds_count", "")] == 1
        assert b[("vllm:prompt_tokens_total", "")] == 0 and b[("vllm:request_success_total", "length")] == 0


# --------------------------------------------------------------------------- disconnects


async def test_client_disconnect_aborts_streaming_and_plain_requests(caplog):
    caplog.set_level(logging.DEBUG)
    async with serving() as (url, app), aiohttp.ClientSession() as session:
        engine = app[ENGINE]
        body = {"prompt": words(100), "max_tokens": 5000, "stream": True}
        response = await session.post(f"{url}/v1/completions", json=body)
        await response.content.readline()
        assert len(engine.scheduler.running) == 1 and engine.pool.num_used > 0
        response.close()
        await wait_for(lambda: not engine.scheduler.running)
        assert_idle(app[ENGINE])

        plain = asyncio.create_task(session.post(f"{url}/v1/completions", json={**body, "stream": False}))
        await wait_for(lambda: engine.scheduler.running)
        plain.cancel()
        await wait_for(lambda: not engine.scheduler.running)
        assert_idle(app[ENGINE])

        metrics = await scrape(session, url)
        assert metrics[("vllm:num_requests_running", "")] == 0
        assert metrics[("vllm:kv_cache_usage_perc", "")] == 0
        assert metrics[("vllm:request_success_total", "abort")] == 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


# --------------------------------------------------------------------------- CLI


def test_cli_flags_map_onto_the_config():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--max-batched-tokens", "512", "--speed", "4", "--served-model-name", "q"])
    config = config_from_args(args)
    assert (config.max_num_batched_tokens, config.speed, config.served_model_name) == (512, 4.0, "q")
    assert (args.host, args.port) == ("127.0.0.1", 8000)
    with pytest.raises(ValueError):
        FakeVllmConfig(block_size=0)


@contextlib.asynccontextmanager
async def fake_vllm_process(*flags: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """``fake-vllm`` through its CLI entry points, in a child process; killed if the test did not stop it."""
    script = ("import argparse, sys\n"
              "from rollout_router.fakevllm import add_arguments, run\n"
              "p = argparse.ArgumentParser(); add_arguments(p); run(p.parse_args(sys.argv[1:]))\n")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script, *flags,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def printed_line(proc: asyncio.subprocess.Process) -> str:
    return (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()


async def assert_stops_cleanly_on_sigterm(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    assert (await proc.stderr.read()) == b""


async def test_cli_serves_until_sigterm():
    async with fake_vllm_process("--host", "127.0.0.4", "--port", "0", "--speed", "10") as proc:
        line = await printed_line(proc)
        assert line.startswith("fake-vllm listening on http://127.0.0.4:")
        url = line.rsplit(" ", 1)[1]
        async with aiohttp.ClientSession() as session, session.get(f"{url}/health") as response:
            assert response.status == 200
        await assert_stops_cleanly_on_sigterm(proc)

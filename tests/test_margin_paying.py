"""Is the margin paying? The cost of each moved turn (the prefill its new replica reports), the time to
first byte by outcome, the gap and pin age at each break: a router in front of fake-vllm replicas, breaks
forced by load from outside this router (``ReplicaSet.set_external``, as the fleet load view sets it)."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import aiohttp
from aiohttp import web
from grpc import aio
from prometheus_client.parser import text_string_to_metric_families
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from rollout_router.fakevllm import FakeVllmConfig, create_app, start_grpc
from rollout_router.fakevllm.tokens import tokenize
from rollout_router.settings import RouterSettings
from tests.support import NO_PROBES, running_router

PREFILL_SECONDS = 0.3
SYSTEM = "You are a careful solver. Think step by step and check every answer twice before you reply. " * 4


@contextlib.asynccontextmanager
async def fake_replicas(count: int, grpc: bool = False) -> AsyncIterator[list[dict]]:
    """``count`` fake-vllm replicas on loopback (HTTP, and gRPC when asked): their backend entries."""
    runners, servers, entries = [], [], []
    try:
        for index in range(count):
            host = f"127.0.0.{60 + index}"
            app = create_app(FakeVllmConfig(speed=20.0))
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, host, 0).start()
            runners.append(runner)
            entry = {"url": f"http://{host}:{runner.addresses[0][1]}"}
            if grpc:
                server, port = await start_grpc(app, host, 0)
                servers.append(server)
                entry["grpc"] = f"{host}:{port}"
            entries.append(entry)
        yield entries
    finally:
        for server in servers:
            await server.stop(0.5)
        for runner in runners:
            await runner.cleanup()


def settings(backends: list[dict], sample: float = 1.0) -> RouterSettings:
    return RouterSettings(backends=backends, affinity_break_margin=2, health=NO_PROBES,
                          metrics={"keptPrefillSampleRate": sample})


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape by (name, sorted labels)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def scrape(http: aiohttp.ClientSession, runtime) -> dict[tuple[str, tuple], float]:
    async with http.get(f"{runtime.admin_url}/metrics") as response:
        return samples(await response.text())


async def status(http: aiohttp.ClientSession, runtime) -> dict:
    async with http.get(f"{runtime.admin_url}/status") as response:
        return await response.json()


def prefilled(usage: dict) -> int:
    """What the replica's own usage says it prefilled."""
    return usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]


async def chat(http: aiohttp.ClientSession, base: str, session: str, content: str,
               stream: bool = False, usage: bool = True) -> tuple[str, dict | None]:
    """One turn; (the replica that served it, the usage its answer reported)."""
    body: dict = {"model": "tiny", "messages": [{"role": "system", "content": SYSTEM},
                                                {"role": "user", "content": content}], "max_tokens": 4}
    if stream:
        body |= {"stream": True, **({"stream_options": {"include_usage": True}} if usage else {})}
    async with http.post(f"{base}/v1/chat/completions", json=body, headers={"X-Session-ID": session}) as response:
        assert response.status == 200, await response.text()
        replica = response.headers["x-rolloutrouter-replica"]
        if not stream:
            return replica, (await response.json())["usage"]
        events = [json.loads(line[6:]) for line in (await response.text()).splitlines()
                  if line.startswith("data: {")]
        return replica, next((e["usage"] for e in reversed(events) if e.get("usage")), None)


@dataclasses.dataclass
class Expected:
    """What the replicas' own usage said the forced workload prefilled."""

    moved: int = 0
    kept: int = 0
    breaks: int = 0


Ask = Callable[[str, int, bool], Awaitable[tuple[str, dict | None]]]


async def forced_breaks(runtime, ask: Ask, streams: Sequence[bool] = (False, True, False)) -> Expected:
    """One session per entry of ``streams``: a new turn, a kept turn, then a turn forced off its replica by
    load from outside this router beyond the margin. ``ask(session, turn, stream)`` sends turn ``turn``
    (each a longer prompt than the last) and returns the replica that served it and the usage it reported."""
    expected = Expected()
    for index, stream in enumerate(streams):
        session = f"s{index}"
        pinned, _ = await ask(session, 0, stream)
        _, kept = await ask(session, 1, stream)
        assert kept is not None
        expected.kept += prefilled(kept)
        runtime.replicas.set_external(pinned, 5)  # load beyond the margin on the pinned replica: a break
        moved_to, moved = await ask(session, 2, stream)
        runtime.replicas.set_external(pinned, 0)
        assert moved_to != pinned and moved is not None
        expected.moved += prefilled(moved)
        expected.breaks += 1
    return expected


def check_counted(metrics: dict, status: dict, expected: Expected) -> None:
    """The router's counters and /status say what the replicas' usage said."""
    margin = status["margin"]
    assert metrics[("rolloutrouter_repin_prefill_tokens_total", (("reason", "margin"),))] == expected.moved
    assert metrics[("rolloutrouter_repin_prefill_turns_total", (("reason", "margin"),))] == expected.breaks
    assert metrics[("rolloutrouter_kept_prefill_tokens_total", ())] == expected.kept
    assert metrics[("rolloutrouter_break_gap_count", ())] == expected.breaks
    assert metrics[("rolloutrouter_break_pin_age_seconds_count", ())] == expected.breaks
    for outcome in ("new", "kept", "broken"):
        assert metrics[("rolloutrouter_time_to_first_byte_seconds_count", (("outcome", outcome),))] == expected.breaks
        assert metrics[("rolloutrouter_time_to_first_byte_seconds_sum", (("outcome", outcome),))] > 0
    assert margin["repin_prefill_tokens"] == expected.moved and margin["kept_prefill_tokens"] == expected.kept
    assert margin["breaks"] == expected.breaks and margin["ttfb"]["moved"]["turns"] == expected.breaks


async def test_moved_turns_count_the_prefill_their_replica_reported():
    async with fake_replicas(2) as backends, running_router(settings(backends)) as (base, runtime), \
            aiohttp.ClientSession() as http:
        texts = ("turn one", "turn one and two", "turn one, two and three")

        async def ask(session: str, turn: int, stream: bool) -> tuple[str, dict | None]:
            return await chat(http, base, session, texts[turn], stream)

        expected = await forced_breaks(runtime, ask)
        metrics = await scrape(http, runtime)
        check_counted(metrics, await status(http, runtime), expected)
        assert expected.moved > expected.kept > 0  # a moved turn prefills what its old replica had cached
        assert metrics[("rolloutrouter_kept_prefill_turns_total", ())] == 3
        assert metrics[("rolloutrouter_break_gap_sum", ())] == 15  # 5 in flight elsewhere against 0
        assert (await status(http, runtime))["margin"]["break_gap_mean"] == 5


async def test_a_repinned_turn_is_counted_by_why_its_replica_was_out():
    async with fake_replicas(2) as backends, running_router(settings(backends)) as (base, runtime), \
            aiohttp.ClientSession() as http:
        pinned, _ = await chat(http, base, "r", "first")
        runtime.replicas.mark_down(pinned, 60)
        moved_to, usage = await chat(http, base, "r", "first and second")
        assert moved_to != pinned
        metrics = await scrape(http, runtime)
        assert metrics[("rolloutrouter_repin_prefill_tokens_total", (("reason", "down"),))] == prefilled(usage)
        assert metrics[("rolloutrouter_time_to_first_byte_seconds_count", (("outcome", "repinned"),))] == 1


async def test_an_answer_without_usage_is_counted_as_unmeasured_not_as_zero():
    async with fake_replicas(2) as backends, running_router(settings(backends)) as (base, runtime), \
            aiohttp.ClientSession() as http:
        pinned, _ = await chat(http, base, "u", "first", stream=True, usage=False)
        runtime.replicas.set_external(pinned, 5)
        await chat(http, base, "u", "first and second", stream=True, usage=False)
        metrics = await scrape(http, runtime)
        assert metrics[("rolloutrouter_prefill_unmeasured_total", (("outcome", "broken"),))] == 1
        assert ("rolloutrouter_repin_prefill_tokens_total", (("reason", "margin"),)) not in metrics


async def test_kept_turns_are_read_at_the_sampled_rate():
    async with fake_replicas(1) as backends, running_router(settings(backends, sample=0.25)) as (base, runtime), \
            aiohttp.ClientSession() as http:
        for turn in range(9):  # one new turn, then eight kept
            await chat(http, base, "k", f"turn {turn}")
        metrics = await scrape(http, runtime)
        assert metrics[("rolloutrouter_kept_prefill_turns_total", ())] == 2
        assert metrics[("rolloutrouter_time_to_first_byte_seconds_count", (("outcome", "kept"),))] == 8


def generate_asker(channel, prompts: Sequence[list[int]]) -> Ask:
    """``ask`` for vLLM's gRPC ``Generate``: turn ``t`` sends ``prompts[t]``; usage as the HTTP answers carry it."""
    stub = pb_grpc.VllmEngineStub(channel)

    async def ask(session: str, turn: int, stream: bool) -> tuple[str, dict | None]:
        request = pb.GenerateRequest(request_id=f"{session}-{turn}", tokenized=pb.TokenizedInput(
            input_ids=prompts[turn]), stream=stream, sampling_params=pb.SamplingParams(max_tokens=4))
        call = stub.Generate(request, metadata=(("x-session-id", session),))
        last = [answer async for answer in call][-1].complete
        usage = {"prompt_tokens": last.prompt_tokens, "prompt_tokens_details": {"cached_tokens": last.cached_tokens}}
        return dict(await call.initial_metadata())["x-rolloutrouter-replica"], usage
    return ask


async def test_moved_grpc_generate_calls_count_the_prefill_vllm_reported():
    async with fake_replicas(2, grpc=True) as backends, \
            running_router(settings(backends), grpc=True) as (_, runtime), \
            aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel, aiohttp.ClientSession() as http:
        prompts = [tokenize(SYSTEM + " turn" * (8 * turn + 1)) for turn in range(3)]
        expected = await forced_breaks(runtime, generate_asker(channel, prompts), streams=(False, True))
        check_counted(await scrape(http, runtime), await status(http, runtime), expected)
        assert expected.moved > expected.kept > 0


async def test_a_streams_time_to_first_byte_waits_for_its_first_event_not_its_head():
    """vLLM sends a stream's head before the prefill: the head alone says nothing about when tokens came."""
    async def slow_first_event(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)  # the head, at once
        await asyncio.sleep(PREFILL_SECONDS)  # the replica prefills
        await response.write(b'data: {"choices": []}\n\ndata: [DONE]\n\n')
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow_first_event)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.65", 0).start()
    try:
        backends = [{"url": f"http://127.0.0.65:{runner.addresses[0][1]}"}]
        async with running_router(settings(backends)) as (base, runtime), aiohttp.ClientSession() as http:
            async with http.post(f"{base}/v1/chat/completions", json={"stream": True},
                                 headers={"X-Session-ID": "slow"}) as response:
                assert response.status == 200
                await response.read()
            metrics = await scrape(http, runtime)
            assert metrics[("rolloutrouter_time_to_first_byte_seconds_sum", (("outcome", "new"),))] >= PREFILL_SECONDS
    finally:
        await runner.cleanup()


def test_a_reload_changes_which_kept_turns_are_measured():
    """The sample rate is read at each apply, not per request: a reload must still take effect."""
    from rollout_router.app import Runtime
    runtime = Runtime(RouterSettings(metrics={"keptPrefillSampleRate": 0.0}))
    runtime.apply(runtime.settings)
    assert not any(runtime.metrics.margin.sample() for _ in range(10))
    runtime.apply(RouterSettings(metrics={"keptPrefillSampleRate": 1.0}))
    assert all(runtime.metrics.margin.sample() for _ in range(10))

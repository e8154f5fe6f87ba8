"""Is the margin paying, against real vLLM: the prefill the router counts for forced breaks is what vLLM's
own usage reported, over HTTP (JSON and SSE, vLLM with --enable-prompt-tokens-details) and gRPC ``Generate``.

The same workload as tests/test_margin_paying.py runs against fake-vllm in the quick tier: per session a new
turn, a kept turn, then a turn forced off its replica by load from outside the router (the in-process
router's ``ReplicaSet.set_external``, as the fleet load view sets it) beyond the margin. Two vLLM HTTP servers,
so a moved turn lands on a replica that never saw the session; one gRPC server named by two replica ids (a
third and fourth engine would not fit two shared cores), so there a move changes replica id, not engine, and
what is checked is only that the counts are vLLM's own.
"""
from __future__ import annotations

import json
import random
from collections.abc import Iterator

import aiohttp
import pytest
from grpc import aio

from rollout_router.localfleet import free_port
from rollout_router.settings import RouterSettings
from tests.support import NO_PROBES, running_router
from tests.test_margin_paying import check_counted, forced_breaks, generate_asker, scrape, status

from .conftest import ENV, LOG_DIR, TINY_MODEL_DIR, VLLM_PYTHON, enabled
from .test_real_vllm import STARTUP_TIMEOUT
from .vllm_process import SERVED_MODEL, VllmServer

if not enabled():
    pytest.skip(f"the real-vLLM tier is opt-in: set {ENV}=1 (make test-vllm)", allow_module_level=True)

pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(900)]

HOSTS = ("127.0.0.27", "127.0.0.28")
GRPC_HOST = "127.0.0.29"
rng = random.Random(25)
PROMPTS = [[rng.randrange(3, 500) for _ in range(64 + 48 * turn)] for turn in range(3)]
for turn in (1, 2):  # each turn extends the last, as a conversation does
    PROMPTS[turn][:len(PROMPTS[turn - 1])] = PROMPTS[turn - 1]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, VllmServer]]:
    started: dict[str, VllmServer] = {}
    try:
        for name, host, grpc, cpu in (("a", HOSTS[0], False, "0"), ("b", HOSTS[1], False, "1"),
                                      ("grpc", GRPC_HOST, True, "1")):
            started[name] = VllmServer(VLLM_PYTHON, TINY_MODEL_DIR, host, free_port(host),
                                       LOG_DIR / f"vllm-margin-{name}.log", grpc=grpc, cpu=cpu,
                                       max_model_len=1024).start()
        for server in started.values():
            server.wait_ready(STARTUP_TIMEOUT)
        yield started
    finally:
        for server in started.values():
            server.stop()


def settings(backends: list) -> RouterSettings:
    return RouterSettings(backends=backends, affinity_break_margin=2, health=NO_PROBES,
                          metrics={"keptPrefillSampleRate": 1.0})


async def test_forced_breaks_count_the_prefill_vllm_reported_over_http(servers):
    backends = [servers["a"].url, servers["b"].url]
    async with running_router(settings(backends)) as (base, runtime), aiohttp.ClientSession() as http:
        async def ask(session: str, turn: int, stream: bool) -> tuple[str, dict | None]:
            body: dict = {"model": SERVED_MODEL, "prompt": PROMPTS[turn], "max_tokens": 4, "ignore_eos": True,
                          "temperature": 0}
            if stream:
                body |= {"stream": True, "stream_options": {"include_usage": True}}
            async with http.post(f"{base}/v1/completions", json=body, headers={"X-Session-ID": session}) as response:
                assert response.status == 200, await response.text()
                replica = response.headers["x-rolloutrouter-replica"]
                if not stream:
                    return replica, (await response.json())["usage"]
                events = [json.loads(line[6:]) for line in (await response.text()).splitlines()
                          if line.startswith("data: {")]
                return replica, next((e["usage"] for e in reversed(events) if e.get("usage")), None)

        expected = await forced_breaks(runtime, ask)
        check_counted(await scrape(http, runtime), await status(http, runtime), expected)
        assert expected.moved > expected.kept  # the moved turns prefilled on a cold replica


async def test_forced_breaks_count_the_prefill_vllm_reported_over_grpc(servers):
    target = servers["grpc"].target
    backends = [{"url": "http://127.0.0.30:1", "grpc": target}, {"url": "http://127.0.0.31:1", "grpc": target}]
    async with running_router(settings(backends), grpc=True) as (_, runtime), \
            aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel, aiohttp.ClientSession() as http:
        expected = await forced_breaks(runtime, generate_asker(channel, PROMPTS), streams=(False, True))
        check_counted(await scrape(http, runtime), await status(http, runtime), expected)

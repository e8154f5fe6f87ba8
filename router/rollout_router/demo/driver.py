"""Drives one arm of the demo: conversations through a router, load sampled meanwhile."""
from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from .workload import Conversation, tool_text

SAMPLE_INTERVAL = 0.05


@dataclass
class ArmResult:
    name: str
    wall_seconds: float
    turn_latencies: list[float]
    skews: list[int]
    status: dict
    prefix_hit_rate: float
    errors: int

    @property
    def mean_latency(self) -> float:
        return statistics.fmean(self.turn_latencies)

    @property
    def p99_latency(self) -> float:
        ordered = sorted(self.turn_latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def run_arm(name: str, router_url: str, admin_url: str, replica_urls: Sequence[str],
                  conversations: Sequence[Conversation], on_turn: Callable[[], None] = lambda: None) -> ArmResult:
    """One policy's run: conversations through ``router_url``, its /status read from ``admin_url``."""
    latencies: list[float] = []
    errors = 0
    skews: list[int] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        before = await _prefix_counters(http, replica_urls)
        done = asyncio.Event()
        sampler = asyncio.create_task(_sample_skew(http, admin_url, skews, done))
        started = time.monotonic()

        async def converse(conversation: Conversation) -> None:
            nonlocal errors
            messages = [{"role": "user", "content": conversation.prompt}]
            for index, turn in enumerate(conversation.turns):
                body = {"model": "tiny", "messages": messages, "max_tokens": turn.max_tokens}
                t0 = time.monotonic()
                async with http.post(f"{router_url}/v1/chat/completions", json=body,
                                     headers={"X-Session-ID": conversation.key}) as response:
                    answer = await response.json()
                latencies.append(time.monotonic() - t0)
                on_turn()
                if response.status != 200:
                    errors += 1
                    return
                reply = answer["choices"][0]["message"]["content"]
                messages = [*messages, {"role": "assistant", "content": reply},
                            {"role": "user", "content": tool_text(conversation, index)}]
                await asyncio.sleep(turn.think_seconds)

        await asyncio.gather(*(converse(c) for c in conversations))
        wall = time.monotonic() - started
        done.set()
        await sampler
        async with http.get(f"{admin_url}/status") as response:
            status = await response.json()
        after = await _prefix_counters(http, replica_urls)
    queries, hits = after[0] - before[0], after[1] - before[1]
    return ArmResult(name, wall, latencies, skews, status, hits / queries if queries else 0.0, errors)


async def _sample_skew(http: aiohttp.ClientSession, admin_url: str, skews: list[int], done: asyncio.Event) -> None:
    """In-flight skew (max - min over replicas), read from the router's own /status."""
    while not done.is_set():
        async with http.get(f"{admin_url}/status") as response:
            loads = [b["inflight"] for b in (await response.json())["backends"]]
        skews.append(max(loads) - min(loads))
        await asyncio.sleep(SAMPLE_INTERVAL)


async def _prefix_counters(http: aiohttp.ClientSession, replica_urls: Sequence[str]) -> tuple[float, float]:
    """Summed (queries, hits) of vLLM's prefix-cache counters, from each replica's /metrics."""
    queries = hits = 0.0
    for url in replica_urls:
        async with http.get(f"{url}/metrics") as response:
            for line in (await response.text()).splitlines():
                if line.startswith("vllm:prefix_cache_queries_total"):
                    queries += float(line.rsplit(" ", 1)[1])
                elif line.startswith("vllm:prefix_cache_hits_total"):
                    hits += float(line.rsplit(" ", 1)[1])
    return queries, hits

"""The peers' own routers on the same simulated fleet, with the same multi-turn rollout, beside ours.

Every arm gets fresh simulated vLLM replicas (`rollout-router fake-vllm`, cold prefix caches) and replays the
same GRPO-style rollout (`rollout_router.demo.workload`: groups of samples sharing a prompt, each a multi-turn
conversation whose context grows by the answer and a tool result each turn). Each turn carries its
trajectory's key as `X-Session-ID` and `x-smg-routing-key` (SGLang's router keys on the latter), so every
keyed policy sees the same keys. Measured from outside the router:

  step s       wall time of the whole rollout (what verl's `timing_s/generate_async` measures)
  hit          prefix-cache hit rate, from the replicas' own `vllm:prefix_cache_{hits,queries}_total`
  per replica  each replica's own hit rate
  skew         max - min of the replicas' `vllm:num_requests_running`, sampled every 50 ms (mean / max)

Arms: ours (sticky, margin 2, cost_affinity), vllm-router (consistent_hash, sticky_least_loaded, cache_aware),
SGLang's router (manual, cache_aware); a peer that is not installed is left out with a note
(`make install-test` installs both). Rounds alternate the arms; medians over rounds.

    .venv/bin/python benchmarks/peer_rollout.py [--rounds 3] [--replicas 4] [--prompts 12] [--samples 5]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from peer_arms import SESSION_HEADERS, ours, sglang_router, vllm_router

from rollout_router.demo.workload import Conversation, rollout, tool_text
from rollout_router.localfleet import Service, spawn_replica, wait_healthy

SAMPLE_SECONDS = 0.05


ARMS: dict[str, Callable[[list[str]], Service | None]] = {
    "ours sticky": ours(),
    "ours margin 2": ours("--affinity-break-margin", "2"),
    "ours cost_affinity": ours("--policy", "cost_affinity", "--affinity-break-margin", "2"),
    "vllm-router consistent_hash": lambda urls: vllm_router(urls, "consistent_hash"),
    "vllm-router sticky_least_loaded": lambda urls: vllm_router(urls, "sticky_least_loaded"),
    "vllm-router cache_aware": lambda urls: vllm_router(urls, "cache_aware"),
    "SGLang router manual": lambda urls: sglang_router(urls, "manual"),
    "SGLang router cache_aware": lambda urls: sglang_router(urls, "cache_aware"),
}


@dataclass
class Run:
    seconds: float
    hits: list[float]  # per replica
    queries: list[float]
    skews: list[int]
    errors: int

    @property
    def hit_rate(self) -> float:
        return sum(self.hits) / max(sum(self.queries), 1.0)


async def metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """A replica's vLLM counters and gauges by name (labels dropped: one engine per replica)."""
    async with http.get(f"{url}/metrics") as answer:
        text = await answer.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:"):
            name, value = line.split("{", 1)[0].split(" ", 1)[0], line.rsplit(" ", 1)[1]
            found[name] = found.get(name, 0.0) + float(value)
    return found


async def converse(http: aiohttp.ClientSession, url: str, conversation: Conversation) -> int:
    """One trajectory's turns in order; 1 if a turn failed (the trajectory stops there), else 0."""
    messages = [{"role": "user", "content": conversation.prompt}]
    for index, turn in enumerate(conversation.turns):
        body = {"model": "tiny", "messages": messages, "max_tokens": turn.max_tokens}
        async with http.post(f"{url}/v1/chat/completions", json=body,
                             headers={name: conversation.key for name in SESSION_HEADERS}) as answer:
            if answer.status != 200:
                return 1
            reply = (await answer.json())["choices"][0]["message"]["content"]
        messages = [*messages, {"role": "assistant", "content": reply},
                    {"role": "user", "content": tool_text(conversation, index)}]
        await asyncio.sleep(turn.think_seconds)
    return 0


async def sample_skew(http: aiohttp.ClientSession, replicas: list[str], skews: list[int], done: asyncio.Event) -> None:
    while not done.is_set():
        running = [(await metrics(http, url)).get("vllm:num_requests_running", 0.0) for url in replicas]
        skews.append(int(max(running) - min(running)))
        await asyncio.sleep(SAMPLE_SECONDS)


async def rollout_through(url: str, replicas: list[str], conversations: list[Conversation]) -> Run:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        skews: list[int] = []
        done = asyncio.Event()
        sampler = asyncio.create_task(sample_skew(http, replicas, skews, done))
        started = time.monotonic()
        errors = sum(await asyncio.gather(*(converse(http, url, c) for c in conversations)))
        seconds = time.monotonic() - started
        done.set()
        await sampler
        counters = [await metrics(http, r) for r in replicas]
    return Run(seconds, [c.get("vllm:prefix_cache_hits_total", 0.0) for c in counters],
               [c.get("vllm:prefix_cache_queries_total", 0.0) for c in counters], skews, errors)


def one_arm(name: str, args: argparse.Namespace, conversations: list[Conversation]) -> Run | None:
    """Fresh replicas and a fresh router for one arm; None when the arm's program is not installed."""
    fake = ["--num-blocks", str(args.num_blocks)]
    replicas = [spawn_replica(index, fake).bound() for index in range(args.replicas)]
    router: Service | None = None
    try:
        for replica in replicas:
            wait_healthy(replica, "/health")
        urls = [r.url for r in replicas]
        router = ARMS[name](urls)
        if router is None:
            return None
        return asyncio.run(rollout_through(router.url, urls, conversations))
    finally:
        if router is not None:
            router.stop()
        for replica in replicas:
            replica.stop()


def table(runs: dict[str, list[Run]]) -> str:
    lines = ["| arm | step s | vs ours sticky | hit | per replica | skew mean / max | errors |", "|" + "---|" * 7]
    base = statistics.median(r.seconds for r in runs["ours sticky"]) if "ours sticky" in runs else None
    for name, arm in runs.items():
        step = statistics.median(r.seconds for r in arm)
        middle = sorted(arm, key=lambda r: r.seconds)[len(arm) // 2]
        per = "/".join(f"{h / q:.0%}" if q else "-" for h, q in zip(middle.hits, middle.queries))
        skews = [s for r in arm for s in r.skews] or [0]
        lines.append(f"| {name} | {step:.2f} [{min(r.seconds for r in arm):.2f}-{max(r.seconds for r in arm):.2f}] "
                     f"| {f'{step / base - 1:+.1%}' if base else '-'} "
                     f"| {statistics.median(r.hit_rate for r in arm):.1%} | {per} "
                     f"| {statistics.fmean(skews):.2f} / {max(skews)} | {sum(r.errors for r in arm)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds, arms alternating (default 3)")
    parser.add_argument("--replicas", type=int, default=4, help="simulated vLLM replicas (default 4)")
    parser.add_argument("--prompts", type=int, default=12, help="GRPO groups (default 12)")
    parser.add_argument("--samples", type=int, default=5, help="trajectories per prompt (default 5)")
    parser.add_argument("--num-blocks", type=int, default=1200, help="KV blocks per replica (default 1200)")
    parser.add_argument("--seed", type=int, default=7, help="the rollout's seed (default 7)")
    parser.add_argument("--arms", help="comma-separated arm names (default: all)")
    args = parser.parse_args()
    for flag in ("rounds", "replicas", "prompts", "samples", "num_blocks"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    names = args.arms.split(",") if args.arms else list(ARMS)
    unknown = [n for n in names if n not in ARMS]
    if unknown:
        parser.error(f"--arms: unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}")
    conversations = rollout(args.prompts, args.samples, seed=args.seed)
    turns = sum(len(c.turns) for c in conversations)
    runs: dict[str, list[Run]] = {}
    missing: set[str] = set()
    for index in range(args.rounds):
        for name in names[index % len(names):] + names[:index % len(names)]:
            if name in missing:
                continue
            run = one_arm(name, args, conversations)
            if run is None:
                missing.add(name)
            else:
                runs.setdefault(name, []).append(run)
        print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"{args.replicas} simulated vLLM replicas ({args.num_blocks} KV blocks each), {len(conversations)} "
          f"trajectories ({args.prompts} prompts x {args.samples} samples), {turns} turns per arm, "
          f"{args.rounds} rounds; median [min-max]")
    print(table({name: runs[name] for name in names if name in runs}))
    for name in sorted(missing):
        print(f"{name}: not installed (make install-test installs the peers)")
    return 1 if any(r.errors for arm in runs.values() for r in arm) else 0


if __name__ == "__main__":
    sys.exit(main())

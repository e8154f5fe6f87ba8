"""Which load view tracks the true fleet-wide in-flight load best: peers, vllm or local.

Three routers share the sessions in front of four simulated vLLM replicas
(`rollout-router fake-vllm` processes). The routers run in this process, on one
event loop, so the truth can be read atomically: a replica's true load is the
sum of every router's own in-flight count for it. Every ``--sample-ms`` the
benchmark compares what each router's policy would compare (its load index:
own count + the view's ``external``) with that truth, for every replica, and
reports the mean absolute error, the mean signed error (bias) and the share of
samples where the view was exact. Each view gets the same bounded load: ``--clients``
sessions, each turn entering by a random router, long-tailed answer lengths.

    .venv/bin/python benchmarks/fleet_loadview.py [--seconds 10] [--clients 24] [--poll-ms 100]
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics

import aiohttp

from rollout_router.app import Peering, Runtime
from rollout_router.localfleet import spawn_replica, stop, wait_healthy
from rollout_router.settings import FleetSettings, RouterSettings

VIEWS = ("peers", "vllm", "local")


async def start_routers(count: int, backends: list[str], view: str, poll: float) -> list[Runtime]:
    fleet = FleetSettings.model_validate({"loadView": view, "pollIntervalSeconds": poll})
    settings = RouterSettings.model_validate({"backends": backends}).model_copy(update={"fleet": fleet})
    routers = [Runtime(settings, admin_address=("127.0.0.1", 0), peering=Peering()) for _ in range(count)]
    for router in routers:
        await router.start("127.0.0.1", 0)
    for router in routers:
        peers = [r.admin_url for r in routers if r is not router]
        router.apply(settings.model_copy(update={"fleet": fleet.model_copy(update={"peers": peers})}))
    while any(r.fleet is None or len(r.fleet.members()) < count for r in routers):
        await asyncio.sleep(0.05)
    return routers


async def client(session: aiohttp.ClientSession, routers: list[Runtime], name: str, until: float,
                 rng: random.Random) -> int:
    """One conversation's turns until ``until``, each entering by a random router; returns the turns done."""
    loop, turns = asyncio.get_running_loop(), 0
    while loop.time() < until:
        router = rng.choice(routers)
        tokens = min(int(rng.paretovariate(1.2) * 20), 400)
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"{name} turn {turns}"}],
                "max_tokens": tokens}
        async with session.post(f"http://127.0.0.1:{router.port}/v1/chat/completions", json=body,
                                headers={"X-Session-ID": name}) as answer:
            await answer.read()
        turns += 1
        await asyncio.sleep(rng.uniform(0, 0.05))  # the agent's tool call
    return turns


def sample(routers: list[Runtime], backends: list[str]) -> list[tuple[int, int]]:
    """(view, truth) for every router and replica, read in one go (no await between reads)."""
    truth = {b: sum(replica.inflight for r in routers if (replica := r.replicas.get(b)) is not None)
             for b in backends}
    pairs = []
    for router in routers:
        loads = router.replicas.loads()
        pairs += [(loads[b], truth[b]) for b in backends if b in loads]
    return pairs


async def measure(view: str, backends: list[str], args: argparse.Namespace) -> dict[str, float]:
    routers = await start_routers(3, backends, view, args.poll_ms / 1000)
    try:
        rng = random.Random(7)
        loop = asyncio.get_running_loop()
        until = loop.time() + args.seconds
        pairs: list[tuple[int, int]] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            tasks = [asyncio.create_task(client(session, routers, f"s{i}", until, random.Random(rng.random())))
                     for i in range(args.clients)]
            while loop.time() < until:
                await asyncio.sleep(args.sample_ms / 1000)
                pairs += sample(routers, backends)
            turns = sum(await asyncio.gather(*tasks))
        errors = [view_load - truth for view_load, truth in pairs]
        return {"mae": statistics.fmean(abs(e) for e in errors), "bias": statistics.fmean(errors),
                "exact": 100 * sum(1 for e in errors if e == 0) / len(errors),
                "truth": statistics.fmean(t for _, t in pairs), "turns": turns, "samples": len(pairs)}
    finally:
        for router in routers:
            await router.stop()


async def main_async(args: argparse.Namespace) -> None:
    starting = [spawn_replica(index) for index in range(4)]
    try:
        replicas = [wait_healthy(s.bound(), "/health") for s in starting]
        backends = [r.url for r in replicas]
        results: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for view in VIEWS:
                results.setdefault(view, []).append(await measure(view, backends, args))
    finally:
        for s in starting:
            stop(s.process)
    print(f"3 routers, 4 replicas, {args.clients} sessions, {args.seconds} s per view, poll every {args.poll_ms} ms, "
          f"medians of {args.rounds} rounds")
    head = f"{'load view':<10}{'mean |err|':>12}{'bias':>8}{'exact %':>9}{'true load':>11}{'turns':>8}"
    print(head + "\n" + "-" * len(head))
    for view, runs in results.items():
        m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{view:<10}{m['mae']:>12.3f}{m['bias']:>8.2f}{m['exact']:>9.1f}{m['truth']:>11.2f}{m['turns']:>8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--poll-ms", type=float, default=100)
    parser.add_argument("--sample-ms", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()

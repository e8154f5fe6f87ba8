"""What a lane request's route and finish cost in the router's Python with the CPU caches warm and cold.

    .venv/bin/python benchmarks/routing_cold.py [--requests 1000] [--rounds 8] [--flush-mib 0,1,4]

The native lane calls ``LaneGlue.route`` and ``LaneGlue.finish`` once each per request. Called in a tight loop
they cost a few µs; in the running router they cost four to five times that (proxy_cost.py's ours against the
lane floor, where_cpu_goes.py's libpython), because at 2,000 requests a second each request meets caches the
kernel, the load and the replicas have filled since the last one. This measures both: the two calls for a
sticky hit answered 200 (256 sessions, pinned before), timed with ``perf_counter`` after writing ``MIB`` MiB of
other memory (0: warm; the L2 cache here is 4 MiB, the L3 300 MiB shared), three arms interleaved over rounds,
medians and minimums in µs:

  ours        the router's ``LaneGlue`` as the lane calls it: policy, in-flight count, turn, metrics, passive health
  fused       an experiment, not the router: the same state changes for a sticky hit (the pin's last use and
              the kept counter, the replica's in-flight count and load, the request and latency series, the
              time to first byte, the passive-health streaks) written out in two functions, reading the same
              objects. It shows what the cold cost is made of: the functions and objects a request passes
              through, not the work, which is the same
  stub        the lane floor's ``route`` and ``finish`` (lane_floor.py): one replica, nothing recorded

The fused arm needs the default rule (``affinityBreakMargin: null``), one router, dispatch running; each arm is
checked to leave every in-flight count at 0 and to count every request as kept.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from lane_floor import Stubbed

from rollout_router.app import Runtime
from rollout_router.core.pins import replica_slot, used_now
from rollout_router.policy.affinity import AffinityPolicy
from rollout_router.proxy.http.lane import LaneGlue, unavailable
from rollout_router.proxy.turns import KEPT, Turn
from rollout_router.settings import RouterSettings

BACKENDS = ["http://127.0.0.9:1", "http://127.0.0.10:1"]  # never connected to: the calls alone are timed
PATH = b"/v1/chat/completions"
KEYS = [b"s%d" % index for index in range(256)]
Calls = tuple[Callable[..., Any], Callable[..., Any]]


def fused(glue: LaneGlue) -> Calls:
    """A sticky hit's route and finish, each one function (the ``fused`` arm)."""
    context = glue.context
    policy = context.balancer.policy
    assert isinstance(policy, AffinityPolicy) and policy.margin is None and context.fleet is None
    table, counters, replicas, metrics, proxy = policy.table, policy.counters, context.replicas, context.metrics, glue.proxy
    pins, slots, live, loads, pools = table.pins, table.replicas, replicas.members, replicas.indexes[0], glue.pools
    ttfb, clock = metrics.margin.kept_first_byte, context.balancer.clock

    def route(_client: Any, _path: bytes, _size: int, _key_at: int, key: bytes, _group_at: int, _group: Any,
              now: float) -> tuple[Any, bool, tuple[Any, ...]]:
        session = key.decode()
        packed = pins[session]
        replica_id = slots[replica_slot(packed)]
        pins[session] = used_now(packed, clock())  # the policy's clock
        pins.move_to_end(session)
        counters.affinity_kept += 1
        replica = live[replica_id]
        replica.inflight += 1
        loads.move(replica_id, replica.inflight + replica.external)
        turn = Turn(KEPT, None, False)
        turn.started = now
        proxy.answering_here += 1
        return pools[replica_id], False, (replica, turn, now)

    def finish(token: tuple[Any, ...], code: int, _status: int, _failure: Any, first_at: float, _tail: Any,
               now: float) -> None:
        replica, turn, started = token
        turn.first_byte = first_at - started
        replica.failures = replica.server_errors = 0
        count, spread = metrics.series[(replica.id, code)]
        count.value += 1
        spread.observe(now - started)
        replica.inflight -= 1
        loads.move(replica.id, replica.inflight + replica.external)
        ttfb.observe(turn.first_byte)
        proxy.answering_here -= 1
    return route, finish


def timed(calls: Calls, requests: int, other: bytearray, junk: bytes) -> float:
    """µs per route and finish, each pair after ``other`` is overwritten (nothing when it is empty)."""
    route, finish = calls
    clock, spent = time.perf_counter, 0.0
    for index in range(requests):
        other[:] = junk  # a memmove in C: the caches now hold it, not the router's objects
        started = clock()
        token = route(None, PATH, 80, 0, KEYS[index & 255], -1, None, 1.0)[2]
        finish(token, 200, 200, None, 1.001, None, 1.002)
        spent += clock() - started
    return spent / requests * 1e6


async def measure(requests: int, rounds: int, sizes: list[int]) -> dict[tuple[str, int], list[float]]:
    runtime = Runtime(RouterSettings(backends=BACKENDS), data_path="native")
    await runtime.start("127.0.0.1", 0)
    try:
        glue = runtime.http_proxy.lane
        assert glue is not None
        ours: Calls = (glue.route, glue.finish)
        for key in KEYS:  # every session pinned, every series made
            ours[1](ours[0](None, PATH, 80, 0, key, -1, None, 1.0)[2], 200, 200, None, 1.001, None, 1.002)
        stubbed = Stubbed(runtime.http_proxy)  # a second glue on the same router: the lane floor's
        arms = {"ours": ours, "fused": fused(glue), "stub": (stubbed.route, stubbed.finish)}
        results: dict[tuple[str, int], list[float]] = {}
        policy, replicas = runtime.balancer.policy, runtime.replicas
        for size in sizes:
            other, junk = bytearray(size << 20), bytes(size << 20)
            for _ in range(rounds):
                for name, calls in arms.items():
                    kept = policy.counters.affinity_kept
                    results.setdefault((name, size), []).append(timed(calls, requests, other, junk))
                    assert replicas.total_inflight() == 0, f"{name} left requests in flight"
                    assert name == "stub" or policy.counters.affinity_kept == kept + requests, name
        return results
    finally:
        await runtime.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="route and finish pairs per arm and round")
    parser.add_argument("--rounds", type=int, default=8, help="rounds, the arms interleaved (default 8)")
    parser.add_argument("--flush-mib", default="0,1,4", help="MiB written between requests, comma-separated "
                        "(default 0,1,4; 0: warm caches)")
    args = parser.parse_args()
    try:
        sizes = [int(size) for size in args.flush_mib.split(",")]
    except ValueError:
        parser.error(f"--flush-mib takes whole MiB, comma-separated, got {args.flush_mib!r}")
    if args.requests <= 0 or args.rounds <= 0 or any(size < 0 for size in sizes):
        parser.error("--requests and --rounds must be positive, --flush-mib sizes 0 or more")
    if unavailable() is not None:
        print(f"routing_cold.py: {unavailable()}", file=sys.stderr)
        return 1
    results = asyncio.run(measure(args.requests, args.rounds, sizes))
    print(f"route + finish of a sticky hit, µs: median [min] over {args.rounds} rounds of {args.requests}")
    print("| MiB written between requests | " + " | ".join(("ours", "fused (experiment)", "stub")) + " |")
    print("|---|---|---|---|")
    for size in sizes:
        cells = [f"{statistics.median(results[name, size]):.2f} [{min(results[name, size]):.2f}]"
                 for name in ("ours", "fused", "stub")]
        print(f"| {size} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

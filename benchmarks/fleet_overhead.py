"""What sharing sessions between routers costs: requests/s of 1, 2 and 3 router processes, and the latency
a forwarded request adds, in one run.

Arms (the same two raw-protocol replicas, benchmarks/raw_replica.py):
  1 router             one `rollout-router serve`, no peers (as before issue 11)
  2 routers, 3 routers  a fleet sharing sessions; the load is split evenly over the routers, so a keyed
                       request enters its owner 1/N of the time and is forwarded once otherwise

Throughput: wrk, 32 connections in all (split over the routers, one wrk per router, run at once), small
chat completions, one of 256 session ids each; the ratio is against one router. On 2 shared cores the
routers, wrk and the replicas compete for CPU: more routers add forwarding work, not cores.

Latency: hey at a fixed --rate through the first router of the 2-router fleet, all requests of one
session, once for a session that router owns (decided there) and once for one its peer owns
(forwarded): p50 and p99, and the difference.

    .venv/bin/python benchmarks/fleet_overhead.py [--seconds 8] [--rounds 3] [--rate 500]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from proxy_overhead import CHAT, WRK_SCRIPT, hey, start_ours, start_raw_replica, wrk

from rollout_router.fleet.ownership import owner
from rollout_router.localfleet import Service, fleet_members, start_router_fleet
from rollout_router.localfleet import stop as stop_process

CONNECTIONS = 32


def split_wrk(routers: list[Service], script: Path, seconds: int) -> dict[str, float]:
    """One wrk per router at once, the connections split evenly; the summed rate."""
    with concurrent.futures.ThreadPoolExecutor(len(routers)) as pool:
        runs = list(pool.map(lambda r: wrk(r.url, script, seconds, CONNECTIONS // len(routers)), routers))
    return {"rps": sum(r["rps"] for r in runs), "non2xx": sum(r["non2xx"] for r in runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=500, help="requests/s of the latency measurement")
    args = parser.parse_args()
    for name in ("wrk", "hey"):
        if not shutil.which(name):
            sys.exit(f"{name} is missing: apt-get install -y wrk hey")
    work = Path(tempfile.mkdtemp())
    script = work / "chat.lua"
    script.write_text(WRK_SCRIPT % CHAT)
    services: list[Service] = []
    try:
        arms = start_arms(work, {f"{count} routers": (count, None) for count in (2, 3)}, services)
        for routers in arms.values():
            converge(routers)
            split_wrk(routers, script, 2)  # warm-up: pools, owners, peers' loads
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, routers in arms.items():
                runs[name].append(split_wrk(routers, script, args.seconds))
        base = statistics.median(r["rps"] for r in runs["1 router"])
        head = f"{'routers':<12}{'req/s':>10}{'non-2xx':>9}{'vs 1 router':>13}{'forwarded':>11}"
        print(f"throughput, {CONNECTIONS} connections over the routers, medians of {args.rounds}\n{head}\n"
              + "-" * len(head))
        for name, results in runs.items():
            rps = statistics.median(r["rps"] for r in results)
            share = 1 - 1 / len(arms[name]) if len(arms[name]) > 1 else 0.0
            print(f"{name:<12}{rps:>10.0f}{statistics.median(r['non2xx'] for r in results):>9.0f}"
                  f"{rps / base:>12.2f}x{share:>10.0%}", flush=True)
        pair = arms["2 routers"]
        ids = [r.admin_url or "" for r in pair]
        local = next(k for k in (f"s{i}" for i in range(1000)) if owner(k, ids) == ids[0])
        remote = next(k for k in (f"s{i}" for i in range(1000)) if owner(k, ids) == ids[1])
        latency = {"decided here": [], "forwarded": []}  # type: dict[str, list[dict[str, float]]]
        for _ in range(args.rounds):
            latency["decided here"].append(hey(pair[0].url, args.seconds, args.rate, key=local))
            latency["forwarded"].append(hey(pair[0].url, args.seconds, args.rate, key=remote))
        print(f"\nlatency at {args.rate} req/s through one router of two, medians of {args.rounds}")
        head = f"{'session':<14}{'p50 ms':>9}{'p99 ms':>9}{'non-2xx':>9}"
        print(head + "\n" + "-" * len(head))
        medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in latency.items()}
        for name, m in medians.items():
            print(f"{name:<14}{m['p50']:>9.2f}{m['p99']:>9.2f}{m['non2xx']:>9.0f}")
        print(f"{'added':<14}{medians['forwarded']['p50'] - medians['decided here']['p50']:>+9.2f}"
              f"{medians['forwarded']['p99'] - medians['decided here']['p99']:>+9.2f}")
    finally:
        for service in services:
            stop_process(service.process)
    return 0


def start_arms(work: Path, fleets: dict[str, tuple[int, dict | None]],
               services: list[Service]) -> dict[str, list[Service]]:
    """Two raw replicas, a router alone in front of them (arm "1 router"), and one fleet per entry of ``fleets``
    (arm name -> routers, their settings); each process is added to ``services`` as it starts, so a failure
    part-way still stops them all."""
    backends = [start_raw_replica(f"127.0.0.{20 + i}") for i in range(2)]
    services.extend(backends)
    arms = {"1 router": [start_ours([b.url for b in backends])]}
    services.extend(arms["1 router"])
    for name, (count, settings) in fleets.items():
        workdir = work / name.replace(" ", "-")
        workdir.mkdir()
        arms[name] = start_router_fleet(count, backends, workdir, settings)
        services.extend(arms[name])
    return arms


def converge(routers: list[Service]) -> None:
    """Wait until every router of a fleet sees all of them (a lone router has no fleet)."""
    if len(routers) == 1:
        return
    deadline = time.monotonic() + 30
    while any(len(fleet_members(r)) != len(routers) for r in routers):
        if time.monotonic() > deadline:
            raise TimeoutError("the routers did not form a fleet within 30 s")
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())

"""Entry ownership behind a front end hashing X-Session-ID: what it saves and what a new session pays, in one run.

Arms (the same two raw-protocol replicas, benchmarks/raw_replica.py):
  1 router          one `rollout-router serve`, no peers
  3 rendezvous      three routers, fleet.ownership rendezvous (the default)
  3 entry           three routers, fleet.ownership entry
Every turn of a session enters by the router the front end hashes its key to (``entry_router``: a hash of
the key and the router's index, the same for both fleets), as HAProxy/nginx/Envoy consistent hashing does.

Throughput: wrk, 32 connections in all, one wrk per router at once, each sending the sessions (of 256) that
hash to its router; the sessions exist (a warm-up placed them), so this is the steady state: with rendezvous
ownership 2/3 of the requests are forwarded, with entry ownership none.

Latency of one request at a time (a keep-alive connection per router): the first turn of a new session
(entry ownership: one lookup at both peers, which answer "no pin") and a later turn of an existing one;
p50 and p99, and what each adds to one router's.

    .venv/bin/python benchmarks/fleet_entry.py [--seconds 8] [--rounds 3] [--turns 400]
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from fleet_overhead import converge, start_arms
from proxy_overhead import CHAT, wrk

from rollout_router.localfleet import Service
from rollout_router.localfleet import stop as stop_process

CONNECTIONS, SESSIONS = 32, 256
SCRIPT = '''
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
local keys = {%s}
request = function()
  wrk.headers["X-Session-ID"] = keys[math.random(#keys)]
  return wrk.format(nil, "/v1/chat/completions")
end
'''


def entry_router(key: str, count: int) -> int:
    """The router (by index) a consistent-hashing front end sends ``key`` to."""
    return max(range(count), key=lambda i: hashlib.sha256(f"{i} {key}".encode()).digest())


def scripts(work: Path, count: int) -> list[Path]:
    """One wrk script per router, with the sessions that hash to it."""
    keys: list[list[str]] = [[] for _ in range(count)]
    for n in range(SESSIONS):
        keys[entry_router(f"session-{n}", count)].append(f'"session-{n}"')
    paths = []
    for index, mine in enumerate(keys):
        paths.append(work / f"r{count}-{index}.lua")
        paths[-1].write_text(SCRIPT % (CHAT, ", ".join(mine)))
    return paths


def throughput(routers: list[Service], paths: list[Path], seconds: int) -> float:
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(len(routers)) as pool:
        runs = list(pool.map(lambda rp: wrk(rp[0].url, rp[1], seconds, CONNECTIONS // len(routers)),
                             zip(routers, paths)))
    assert all(r["non2xx"] == 0 for r in runs), runs
    return sum(r["rps"] for r in runs)


class Client:
    """One keep-alive connection per router; ``turn`` times one request of ``key`` through its entry router."""

    def __init__(self, routers: list[Service]):
        self.conns = [http.client.HTTPConnection(urlsplit(r.url).netloc, timeout=30) for r in routers]

    def turn(self, key: str) -> float:
        conn = self.conns[entry_router(key, len(self.conns))]
        started = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", CHAT, {"Content-Type": "application/json", "X-Session-ID": key})
        answer = conn.getresponse()
        answer.read()
        elapsed = time.perf_counter() - started
        assert answer.status == 200, answer.status
        return elapsed * 1000

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=400, help="requests of each kind per arm and round")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is missing: apt-get install -y wrk")
    work = Path(tempfile.mkdtemp())
    services: list[Service] = []
    try:
        arms = start_arms(work, {f"3 {mode}": (3, {"fleet": {"ownership": mode}}) for mode in ("rendezvous", "entry")},
                          services)
        lua = {name: scripts(work, len(routers)) for name, routers in arms.items()}
        for name, routers in arms.items():
            converge(routers)
            throughput(routers, lua[name], 2)  # warm-up: places the sessions, fills the pools
        rps: dict[str, list[float]] = {name: [] for name in arms}
        first: dict[str, list[float]] = {name: [] for name in arms}
        later: dict[str, list[float]] = {name: [] for name in arms}
        clients = {name: Client(routers) for name, routers in arms.items()}
        for round_ in range(args.rounds):
            for name, routers in arms.items():
                rps[name].append(throughput(routers, lua[name], args.seconds))
                client = clients[name]
                for n in range(args.turns):
                    first[name].append(client.turn(f"new-{round_}-{n}"))
                    later[name].append(client.turn(f"session-{n % SESSIONS}"))
        base = statistics.median(rps["1 router"])
        head = f"{'arm':<15}{'req/s':>8}{'vs 1':>7}{'first p50':>11}{'p99':>7}{'added':>8}{'later p50':>11}{'p99':>7}" \
               f"{'added':>8}"
        print(f"steady-state throughput ({CONNECTIONS} connections, medians of {args.rounds}); one request at a time: "
              f"a new session's first turn and a later turn, ms ({args.turns * args.rounds} each)\n{head}\n"
              + "-" * len(head))
        one_first, one_later = statistics.median(first["1 router"]), statistics.median(later["1 router"])
        for name in arms:
            f50, l50 = statistics.median(first[name]), statistics.median(later[name])
            print(f"{name:<15}{statistics.median(rps[name]):>8.0f}{statistics.median(rps[name]) / base:>6.2f}x"
                  f"{f50:>11.2f}{percentile(first[name], 0.99):>7.2f}{f50 - one_first:>+8.2f}"
                  f"{l50:>11.2f}{percentile(later[name], 0.99):>7.2f}{l50 - one_later:>+8.2f}")
        for client in clients.values():
            client.close()
    finally:
        for service in services:
            stop_process(service.process)
    return 0


if __name__ == "__main__":
    sys.exit(main())

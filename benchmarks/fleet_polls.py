"""What the fleet's loads poll costs a router that serves nothing: idle CPU per worker against the members it polls.

Every member of a fleet asks every other one for its in-flight counts every ``fleet.pollIntervalSeconds`` (0.1 s),
so with M members each makes and answers (M - 1) / 0.1 polls a second: in a fleet of pods of several workers
(docs/fleet.md, "Several cores") M is pods x workers, and the polls grow with M squared. This measures the price of
one poll on this machine: ``serve --workers N`` for each N of ``--workers`` (its workers are a fleet of N on
loopback, exactly as pods are; N = 1 is one process, no fleet), no traffic, one raw replica (its health probes
are the same for every N), the CPU of the whole process tree over ``--seconds`` from /proc. The poll's cost is
the extra CPU per worker over N = 1, divided by the polls each worker made and answered in that time.

    .venv/bin/python benchmarks/fleet_polls.py [--workers 1,2,4,6] [--seconds 10] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request

from proxy_cost import cpu_seconds
from proxy_overhead import start_raw_replica

from rollout_router.localfleet import Service, spawn, stop, wait_healthy

POLL_SECONDS = 0.1  # fleet.pollIntervalSeconds' default: the workers cannot be given another (docs/fleet.md)


def start(workers: int, backend: str) -> Service:
    """``serve --workers N`` ready with every worker seeing the others (the public admin port's /readyz)."""
    args = ["serve", "--log-level", "warning", "--backend", backend, *(["--workers", str(workers)] if workers > 1
                                                                       else [])]
    router = wait_healthy(spawn(args, "127.0.0.1").bound(60), "/readyz", timeout=60)
    assert router.admin_url is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(router.admin_url + "/readyz", timeout=2):
                return router
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"serve --workers {workers}: not every worker ready within 60 s")


def idle_cpu(workers: int, backend: str, seconds: float) -> float:
    """CPU seconds per second per worker of an idle ``serve --workers N`` (its parent's share included)."""
    router = start(workers, backend)
    try:
        time.sleep(2.0)  # past the start: the first polls, the first probe round
        before, started = cpu_seconds(router.process.pid), time.monotonic()
        time.sleep(seconds)
        return (cpu_seconds(router.process.pid) - before) / (time.monotonic() - started) / workers
    finally:
        stop(router.process)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,6", help="comma-separated worker counts (1 first: the base)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    counts = sorted({int(n) for n in args.workers.split(",")} | {1})
    replica = start_raw_replica("127.0.0.1")
    samples: dict[int, list[float]] = {n: [] for n in counts}
    try:
        for round_ in range(args.rounds):
            for n in counts if round_ % 2 == 0 else reversed(counts):
                samples[n].append(idle_cpu(n, replica.url, args.seconds))
                print(f"round {round_ + 1}/{args.rounds}: {n} workers measured", file=sys.stderr, flush=True)
    finally:
        stop(replica.process)
    base = statistics.median(samples[1])
    print(f"idle routers, {args.seconds:g} s per measurement, {args.rounds} rounds (median [min-max]); "
          f"each member polls every other one every {POLL_SECONDS:g} s")
    print("| workers (members) | polls made + answered per worker per s | idle CPU per worker, % of a core | "
          "CPU µs per poll (over 1 worker) |")
    print("|---|---|---|---|")
    for n in counts:
        polls = 2 * (n - 1) / POLL_SECONDS
        cpu = statistics.median(samples[n])
        per_poll = f"{(cpu - base) * 1e6 / polls:.0f}" if polls else "-"
        print(f"| {n} | {polls:.0f} | {cpu * 100:.2f} [{min(samples[n]) * 100:.2f}-{max(samples[n]) * 100:.2f}] "
              f"| {per_poll} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What following each other's loads costs routers that serve nothing: idle CPU per worker against the members.

Every member of a fleet follows every other one's in-flight counts (docs/fleet.md, "The load view"): in a fleet
of pods of several workers ("Several cores") the members are pods x workers, and what they send each other grows
with their number squared. Since 2026-12-02 a member watches each peer (one long-lived answer, a line when the
loads change and a heartbeat every third of ``peerTimeoutSeconds``) instead of polling it every
``pollIntervalSeconds``. This measures what that costs on this machine: ``serve --workers N`` for each N of
``--workers`` (its workers are a fleet of N on loopback, exactly as pods are; N = 1 is one process, no fleet), no
traffic, one raw replica (its health probes are the same for every N), the CPU of the whole process tree over
``--seconds`` from /proc. With ``--baseline-src DIR`` (a checkout's ``router`` directory, e.g. from
``git archive bb96bac router | tar -x -C /tmp/base``) the same is measured of that version, in the same run,
rounds alternating: the polling fleet, for the ratio.

    .venv/bin/python benchmarks/fleet_polls.py [--workers 1,2,4,6] [--seconds 10] [--rounds 3] [--baseline-src DIR]
        [--rate R]  # R chat completions a second during each measurement, so the loads change all the time
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from proxy_cost import CHAT, LOADGEN, SESSION_HEADERS, build_loadgen, cpu_seconds
from proxy_overhead import start_raw_replica

from rollout_router.localfleet import Service, spawn, stop, wait_healthy


@contextlib.contextmanager
def package(source: Path | None) -> Iterator[None]:
    """Routers spawned inside run the package in ``source`` (an older checkout), else this one."""
    before = os.environ.get("PYTHONPATH")
    if source is not None:
        os.environ["PYTHONPATH"] = str(source)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def start(workers: int, backend: str, source: Path | None) -> Service:
    """``serve --workers N`` ready with every worker seeing the others (the public admin port's /readyz)."""
    args = ["serve", "--log-level", "warning", "--backend", backend, *(["--workers", str(workers)] if workers > 1
                                                                       else [])]
    with package(source):
        starting = spawn(args, "127.0.0.1")
    router = wait_healthy(starting.bound(60), "/readyz", timeout=60)
    assert router.admin_url is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(router.admin_url + "/readyz", timeout=2):
                return router
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"serve --workers {workers}: not every worker ready within 60 s")


def cpu_per_worker(workers: int, backend: str, seconds: float, source: Path | None, rate: int) -> float:
    """CPU seconds per second per worker of ``serve --workers N`` (its parent's share included): idle, or taking
    ``rate`` small chat completions a second (benchmarks/loadgen), so that its loads change all the time."""
    router = start(workers, backend, source)
    try:
        time.sleep(2.0)  # past the start: the first polls, the first probe round
        before, started = cpu_seconds(router.process.pid), time.monotonic()
        if rate:
            subprocess.run([str(LOADGEN), "-url", router.url + "/v1/chat/completions", "-rate", str(rate),
                            "-seconds", str(seconds), "-conns", "32", "-sessions", "256", "-body", CHAT,
                            "-headers", ",".join(SESSION_HEADERS), "-prefix", "polls-"],
                           capture_output=True, check=True)
        else:
            time.sleep(seconds)
        return (cpu_seconds(router.process.pid) - before) / (time.monotonic() - started) / workers
    finally:
        stop(router.process)


def cell(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 100:.2f} [{min(samples) * 100:.2f}-{max(samples) * 100:.2f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,6", help="comma-separated worker counts (1 first: the base)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-src", type=Path, help="an older checkout's router directory, measured beside")
    parser.add_argument("--rate", type=int, default=0, help="chat completions a second during each measurement "
                        "(0: idle); needs Go for benchmarks/loadgen")
    args = parser.parse_args()
    if args.rate:
        build_loadgen()
    if args.baseline_src is not None and not (args.baseline_src / "rollout_router").is_dir():
        parser.error(f"--baseline-src {args.baseline_src}: no rollout_router package there")
    counts = sorted({int(n) for n in args.workers.split(",")} | {1})
    arms: dict[str, Path | None] = {"this checkout": None}
    if args.baseline_src is not None:
        arms["baseline"] = args.baseline_src
    replica = start_raw_replica("127.0.0.1")
    samples: dict[tuple[str, int], list[float]] = {(arm, n): [] for arm in arms for n in counts}
    try:
        for round_ in range(args.rounds):
            order = [(arm, n) for n in counts for arm in arms]
            for arm, n in order if round_ % 2 == 0 else reversed(order):
                samples[arm, n].append(cpu_per_worker(n, replica.url, args.seconds, arms[arm], args.rate))
                print(f"round {round_ + 1}/{args.rounds}: {arm}, {n} workers measured", file=sys.stderr, flush=True)
    finally:
        stop(replica.process)
    load = f"{args.rate} chat completions/s" if args.rate else "idle"
    print(f"routers {load}, {args.seconds:g} s per measurement, {args.rounds} rounds (median [min-max]), "
          f"CPU per worker in % of a core" + (f"; baseline: {args.baseline_src}" if args.baseline_src else ""))
    names = list(arms)
    compared = len(names) > 1
    print("| workers (members) | " + " | ".join(names) + (" | baseline − this, per worker |" if compared else " |"))
    print("|---|" + "---|" * len(names) + ("---|" if compared else ""))
    for n in counts:
        row = [cell(samples[arm, n]) for arm in names]
        if compared:
            saved = statistics.median(samples[names[1], n]) - statistics.median(samples[names[0], n])
            row.append(f"{saved * 100:+.2f}")
        print(f"| {n} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

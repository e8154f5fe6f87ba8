"""What the lane's two calls into the router's Python cost in the running router, timed inside it (issue 22).

    .venv/bin/python benchmarks/lane_timed.py [--rounds 3] [--seconds 4] [--rate 2000] [--stream-rate 500]

``proxy_cost.py`` puts ours 15-25 µs a request above the lane floor (the same lane, its routing stubbed), but its
rounds move by ±15%, more than a change to the routing moves them. This times the difference where it is spent:
the router (``rollout-router``'s own ``Runtime``, native lane, two raw replicas) runs with ``LaneGlue.route`` and
``finish`` wrapped in ``perf_counter`` reads, under proxy_cost.py's fixed-rate loads (chat, then SSE), and
beside them an empty Python function called and timed the same way once a request: what one Python call costs
there, with the caches as the load leaves them (in a tight loop it is 0.05 µs). Means per request in µs,
median over rounds; the wrapping adds its own few tenths of a µs to each figure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop
from proxy_cost import CHAT, STREAM, Arm, build_loadgen, load, load_options, loads_checked
from proxy_overhead import start_raw_replica

from rollout_router.app import Runtime
from rollout_router.localfleet import Service, free_port, wait_healthy
from rollout_router.proxy.http import lane, traffic
from rollout_router.settings import RouterSettings

PARTS = ("route", "finish", "empty call")


def nothing() -> None:
    """The yardstick: a Python call that does nothing."""


class Timed(lane.LaneGlue):
    """The router's glue, its two calls timed; ``totals`` are seconds and calls by part."""

    totals: dict[str, list[float]] = {part: [0.0, 0] for part in PARTS}

    def route(self, *args: Any) -> Any:
        clock, totals = time.perf_counter, self.totals
        started = clock()
        nothing()
        called = clock()
        routed = super().route(*args)
        ended = clock()
        totals["empty call"][0] += called - started
        totals["empty call"][1] += 1
        totals["route"][0] += ended - called
        totals["route"][1] += 1
        return routed

    def finish(self, *args: Any) -> None:
        clock = time.perf_counter
        started = clock()
        super().finish(*args)
        total = self.totals["finish"]
        total[0] += clock() - started
        total[1] += 1


async def serve(port: int, backends: list[str], report: Path) -> None:
    if lane.unavailable() is not None:
        raise SystemExit(f"lane_timed.py: {lane.unavailable()}")
    traffic.LaneGlue = Timed  # type: ignore[misc]  # what HttpProxy builds its lane's glue from
    runtime = Runtime(RouterSettings(backends=backends), data_path="native")
    await runtime.start("127.0.0.1", port)
    signal.signal(signal.SIGUSR1, lambda *_: report.write_text(json.dumps(Timed.totals)))
    await asyncio.Event().wait()


def totals(service: Service, report: Path) -> dict[str, list[float]]:
    """The router's running totals, written on SIGUSR1."""
    report.unlink(missing_ok=True)
    service.process.send_signal(signal.SIGUSR1)
    for _ in range(500):
        if report.exists() and report.stat().st_size:
            return json.loads(report.read_text())
        time.sleep(0.01)
    raise RuntimeError("the timed router wrote no totals")


def per_call(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, float]:
    return {part: (after[part][0] - before[part][0]) / max(after[part][1] - before[part][1], 1) * 1e6
            for part in PARTS}


def run(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    build_loadgen()
    backends = [start_raw_replica(f"127.0.0.{20 + i}") for i in range(2)]
    folder = tempfile.TemporaryDirectory()
    report, port = Path(folder.name) / "totals.json", free_port()
    process = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(report),
                                *[b.url for b in backends]], stderr=subprocess.PIPE, text=True)
    router = wait_healthy(Service(f"http://127.0.0.1:{port}", process), "/readyz")
    arm = Arm("ours (timed)", router)
    results: dict[str, list[dict[str, float]]] = {"chat": [], "sse": []}
    try:
        load(arm, CHAT, args.rate // 4, 1, stream=False)  # warm up
        for index in range(args.rounds):
            for name, body, rate, stream in (("chat", CHAT, args.rate, False), ("sse", STREAM, args.stream_rate, True)):
                before = totals(router, report)
                cpu = load(arm, body, rate, args.seconds, stream)["cpu_us"]
                results[name].append({**per_call(before, totals(router, report)), "cpu": cpu})
            print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for service in (router, *backends):
            service.stop()
        folder.cleanup()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    load_options(parser, rounds=3, seconds=4)
    parser.add_argument("--serve", nargs="+", metavar="ARG", help=argparse.SUPPRESS)  # PORT REPORT BACKEND...
    args = loads_checked(parser)
    if args.serve:
        port, report, *backends = args.serve
        uvloop.run(serve(int(port), backends, Path(report)))
        return 0
    if lane.unavailable() is not None:
        print(f"lane_timed.py: {lane.unavailable()}", file=sys.stderr)
        return 1
    results = run(args)
    print(f"µs per request, median over {args.rounds} rounds ({args.rate} req/s chat, {args.stream_rate} streams/s SSE, "
          f"{args.seconds:g} s each; load average {os.getloadavg()[0]:.1f} after)")
    print("| load | route | finish | an empty call | the router's CPU per request |")
    print("|---|---|---|---|---|")
    for name, rows in results.items():
        cells = [f"{statistics.median(row[part] for row in rows):.2f}" for part in (*PARTS, "cpu")]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

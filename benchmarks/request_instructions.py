"""Machine instructions per proxied request, counted by valgrind's cachegrind: ours beside an older tree in one run.

The CPU time benchmarks/proxy_cost.py measures moves by several per cent from run to run on a shared machine, more
than a change to the request path is worth. A count of executed instructions does not: it is the same, to a few
parts in a thousand, however busy the machine is. This runs request_work.py's exchange (an in-process router,
sticky, the default settings, in front of benchmarks/raw_replica.py; one keep-alive client connection in the same
process sending small chat completions with session ids cycling over 256, warmed so they are sticky hits) under
cachegrind twice per tree, with ``--requests`` more requests the second time, so what the process does to start
and stop cancels out. Per request, router and client together (the client's share is the same for every tree):

  instructions   executed instructions (cachegrind's I refs)
  I1, D1 misses  first-level instruction and data cache misses in cachegrind's model of this machine's caches:
                 what a larger code path costs beyond its instructions (a C extension's wrappers, cold code)
  mispredicts    branches its model mispredicts (conditional and indirect)

The counts are a model, not the hardware's (this machine's VMs have no performance counters): they say which
tree does more work and where, and proxy_cost.py says what it costs in CPU time. Needs valgrind (``make
bench-deps``); one tree takes about a minute.

    .venv/bin/python benchmarks/request_instructions.py [--requests 2000] [--data-path python] \\
        [--baseline-src OLD/router]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WARM = 512  # requests before the count: every session pinned, the connections pooled, the caches filled
EVENTS = {"instructions": r"I\s+refs:\s+([\d,]+)", "I1 misses": r"I1\s+misses:\s+([\d,]+)",
          "D1 misses": r"D1\s+misses:\s+([\d,]+)", "mispredicts": r"Mispredicts:\s+([\d,]+)"}


def child(requests: int, data_path: str) -> None:
    """Run inside cachegrind: the router and the client in this process, the replica in its own."""
    import uvloop
    from proxy_overhead import start_raw_replica
    from request_work import send

    from rollout_router.app import Runtime
    from rollout_router.settings import RouterSettings

    async def run(url: str) -> None:
        runtime = Runtime(RouterSettings(backends=[url]), data_path=data_path)
        port = await runtime.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for index in range(WARM + requests):
                await send(reader, writer, index)
        finally:
            writer.close()
            await runtime.stop()

    replica = start_raw_replica("127.0.0.21")
    try:
        uvloop.run(run(replica.url))
    finally:
        replica.stop()


def counted(source: Path | None, requests: int, data_path: str) -> dict[str, int]:
    """The whole process's counts for one run of ``requests`` requests after the warm ones."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(source) if source else None, str(HERE)]))}
    done = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--branch-sim=yes",
                           "--cachegrind-out-file=/dev/null", sys.executable, __file__, "--child", str(requests),
                           "--data-path", data_path], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"request_instructions.py: the run under cachegrind failed:\n{done.stderr[-2000:]}")
    counts = {}
    for event, pattern in EVENTS.items():
        found = re.search(pattern, done.stderr)
        if found is None:
            raise SystemExit(f"request_instructions.py: cachegrind's summary has no {event!r} line")
        counts[event] = int(found.group(1).replace(",", ""))
    return counts


def per_request(source: Path | None, requests: int, data_path: str) -> dict[str, float]:
    """Counts per request: a run with ``requests`` more requests, less a run with ``requests`` (start, warm, stop)."""
    short, long = counted(source, requests, data_path), counted(source, 2 * requests, data_path)
    return {event: (long[event] - short[event]) / requests for event in EVENTS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests counted (default 2000)")
    parser.add_argument("--data-path", choices=["auto", "python"], default="python",
                        help="the router's data path, as serve --data-path (default python)")
    parser.add_argument("--baseline-src", type=Path, metavar="DIR",
                        help="also count the rollout_router package in DIR (an older checkout's router/)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.data_path)
        return 0
    if args.requests <= 0:
        parser.error(f"--requests must be positive, got {args.requests}")
    if args.baseline_src is not None and not (args.baseline_src / "rollout_router" / "__init__.py").is_file():
        parser.error(f"--baseline-src {args.baseline_src}: no rollout_router package in that directory")
    if shutil.which("valgrind") is None:
        print("request_instructions.py: valgrind is not installed (make bench-deps)", file=sys.stderr)
        return 2
    trees = {"ours": None, **({f"baseline ({args.baseline_src})": args.baseline_src} if args.baseline_src else {})}
    rows = {}
    for index, (name, source) in enumerate(trees.items(), 1):
        print(f"[{index}/{len(trees)}] {name}: two runs under cachegrind", file=sys.stderr, flush=True)
        rows[name] = per_request(source, args.requests, args.data_path)
    print(f"\nper sticky request, {args.data_path} data path, router and client in one process "
          f"({args.requests} requests counted)\n")
    print("| tree | " + " | ".join(EVENTS) + " | instructions vs ours |")
    print("|---|" + "---|" * (len(EVENTS) + 1))
    ours = rows["ours"]["instructions"]
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[event]:,.0f}" for event in EVENTS)
              + f" | {row['instructions'] / ours:.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

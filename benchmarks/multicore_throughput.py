"""Requests/s at saturation: one router process against ``serve --workers 2``, in the same rounds.

The second view of docs/benchmarks.md, "Several cores" (the first is proxy_cost.py's CPU per request):
benchmarks/loadgen offers more than either arm can answer (--rate, 6,000 req/s by default, over 32
keep-alive connections and 256 rotating sessions: every connection stays busy; loadgen sends every planned
request, the late ones as soon as a connection frees, so a run lasts until rate x seconds are answered) and the
table shows the answers per second over the run's real duration, median [min-max] over rounds, arms alternating,
with the CPU µs per request of the arm's whole process tree. On a 2-core machine the load generator and the two raw replicas share the cores with the
workers: the ceiling is the machine's, not the router's alone.

    .venv/bin/python benchmarks/multicore_throughput.py [--rounds 5] [--seconds 5] [--rate 6000]
"""
from __future__ import annotations

import argparse
import sys

from proxy_cost import CHAT, OURS, Arm, build_loadgen, figure, load, seen, spread, stop
from proxy_overhead import start_raw_replica

ARMS = ("ours (sticky)", "ours (2 workers)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds, arms alternating (default 5)")
    parser.add_argument("--seconds", type=float, default=5, help="seconds per arm per round (default 5)")
    parser.add_argument("--rate", type=int, default=6000, help="requests per second offered (default 6000)")
    args = parser.parse_args()
    for flag, value in (("--rounds", args.rounds), ("--seconds", args.seconds), ("--rate", args.rate)):
        if value <= 0:
            parser.error(f"{flag} must be positive, got {value}")
    build_loadgen()
    backends = [start_raw_replica(f"127.0.0.{20 + i}") for i in range(2)]
    arms: list[Arm] = []
    try:
        for name in ARMS:
            arms.append(Arm(name, OURS[name]([b.url for b in backends])))
        for arm in arms:
            load(arm, CHAT, 500, 1, stream=False)  # warm-up
        for index in range(args.rounds):
            for arm in arms[index % len(arms):] + arms[:index % len(arms)]:
                sample = load(arm, CHAT, args.rate, args.seconds, stream=False)
                sample["per_second"] = sample["ok"] / sample["seconds"]
                arm.samples["chat"].append(sample)
            print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        sets = seen(backends)
        print(f"offered {args.rate} req/s of small chat completions, {args.seconds:g} s per arm per round, "
              f"{args.rounds} rounds, 32 connections, 256 sessions; median [min-max]")
        print("| arm | requests/s answered | CPU µs per request | non-2xx, errors | sessions answered, split |")
        print("|---|---|---|---|---|")
        for arm in arms:
            chat = arm.samples["chat"]
            bad = sum(s["non2xx"] + s["errors"] for s in chat)
            print(f"| {arm.name} | {figure(chat, 'per_second')} | {figure(chat, 'cpu_us')} | {bad} "
                  f"| {spread(arm, sets)} |")
    finally:
        stop(arms, backends)
    return 0


if __name__ == "__main__":
    sys.exit(main())

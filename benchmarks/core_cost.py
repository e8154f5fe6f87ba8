"""What the router's Python spends on a sticky hit's routing and recording over the core, per build, in one run.

    .venv/bin/python benchmarks/core_cost.py [--baseline-src OLD/router] [--rounds 3] [--requests 100000]

The Python data path (and the simulator) routes a keyed request with ``Balancer.take`` (the policy's
``decide``: the kept-pin rule, the in-flight ledger) and gives the replica back with ``ReplicaSet.put``; both
run over ``core/``. This times that pair for 256 sessions pinned over 16 replicas, every request a sticky hit,
with no margin (verl's default) and with the advised margin (8, which reads the least loaded replica per
request), in a process per arm: the compiled core, its Python source (``ROLLOUT_ROUTER_CORE=python``) and, with
``--baseline-src``, an older tree. Rounds alternate the arms; the table shows each arm's best round (µs per
request, the least disturbed by other work on the machine) and its ratio to the baseline or, without one, to
the Python source.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

# One arm's timing, run in its own process: the package on its PYTHONPATH, the build its environment chooses.
TIMED = r"""
import sys, time
from rollout_router.balancer import Balancer
from rollout_router.policy import LiveConfig
from rollout_router.replicas import ReplicaSet
now = [0.0]
clock = lambda: now[0]
replicas = ReplicaSet(clock=clock)
for index in range(16):
    replicas.add(f"http://r{index}")
margin, requests = (None if sys.argv[1] == "none" else float(sys.argv[1])), int(sys.argv[2])
balancer = Balancer(replicas, "affinity", LiveConfig(margin=margin), clock=clock)
keys = [f"s{index}" for index in range(256)]
def run(count):
    started = time.perf_counter()
    for index in range(count):
        now[0] += 0.0001
        _, replica = balancer.take(keys[index & 255])
        replicas.put(replica)
    return (time.perf_counter() - started) / count * 1e6
run(requests // 5)
print(min(run(requests) for _ in range(3)))
"""
MARGINS = ("none", "8")


def timed(source: Path | None, env: dict[str, str], margin: str, requests: int) -> float:
    environment = {**os.environ, **env}
    if source is not None:
        environment["PYTHONPATH"] = str(source)
    done = subprocess.run([sys.executable, "-c", TIMED, margin, str(requests)], capture_output=True, text=True,
                          env=environment, timeout=600, check=True)
    return float(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, metavar="DIR", help="also time the package in DIR (an older "
                        "tree's router/, its native modules built)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the arms alternating (default 3)")
    parser.add_argument("--requests", type=int, default=100_000, help="sticky hits timed per run (default 100000)")
    args = parser.parse_args()
    if args.baseline_src is not None and not (args.baseline_src / "rollout_router" / "__init__.py").is_file():
        parser.error(f"--baseline-src {args.baseline_src}: no rollout_router package in that directory")
    arms: dict[str, tuple[Path | None, dict[str, str]]] = {
        "core compiled": (None, {}), "core Python source": (None, {"ROLLOUT_ROUTER_CORE": "python"})}
    if args.baseline_src is not None:
        arms["baseline src"] = (args.baseline_src, {})
    best: dict[tuple[str, str], float] = {}
    for round_ in range(args.rounds):
        for name, (source, env) in arms.items():
            for margin in MARGINS:
                spent = timed(source, env, margin, args.requests)
                best[name, margin] = min(best.get((name, margin), spent), spent)
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    reference = "baseline src" if args.baseline_src is not None else "core Python source"
    print(f"Balancer.take + ReplicaSet.put per sticky hit, 256 sessions on 16 replicas, best of {args.rounds} rounds "
          f"(µs; ratio to {reference})")
    print("| arm | no margin | ratio | margin 8 | ratio |\n|---|---|---|---|---|")
    for name in arms:
        cells = [f"{best[name, m]:.2f} | {best[name, m] / best[reference, m]:.2f}x" for m in MARGINS]
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()

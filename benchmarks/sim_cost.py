"""What one simulated rollout step costs to simulate: CPU seconds per step per arm, by fleet size and load.

The seed study (docs/simulator.md, "The study at the seed's scale") is sized from this table, before any of its
results is read: each row times one step of one point (the seed's fleet, Qwen2.5-32B at TP 4, out 1,024, p 0.9)
for a few arms, and prints the CPU seconds of each (``time.process_time``: the simulator is one process, so the
machine's other load changes the wall time, not this).

    .venv/bin/python benchmarks/sim_cost.py            # the table in docs/simulator.md
    .venv/bin/python benchmarks/sim_cost.py --quick    # two rows (a check that it runs)
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

from rollout_router.sim.verlgrid import SEED_POINT, VPoint, run_task
from rollout_router.sim.verlsources import TOOL_SLOTS

ARMS = ("verl_sticky", "verl_margin2", "footprint_rel0.1")
ROWS = [  # (replicas, trajectories per replica, tool seconds, fleet)
    (4, 512, 0.0, "32b-tp4-0.8"), (16, 512, 0.0, "32b-tp4-0.8"), (32, 512, 0.0, "32b-tp4-0.8"),
    (16, 256, 0.0, "32b-tp4-0.8"), (16, 1536, 0.0, "32b-tp4-0.8"), (16, 512, 5.0, "32b-tp4-0.8"),
    (16, 512, 0.0, "32b-tp4-0.5"), (16, 512, 0.0, "7b-tp4-0.8"),
]


def cost(point: VPoint, arm: str) -> float:
    started = time.process_time()
    run_task((point, arm, 0, 0))
    return time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first two rows only")
    args = parser.parse_args(argv)
    rows = ROWS[:2] if args.quick else ROWS
    print(f"{'replicas':>8} {'traj/replica':>12} {'tools':>6} {'fleet':>12} " + " ".join(f"{a:>17}" for a in ARMS)
          + f" {'per arm':>8}")
    for replicas, per_replica, latency, fleet in rows:
        point = dataclasses.replace(SEED_POINT, fleet=fleet, latency=latency, replicas=replicas, batch=per_replica,
                                    tool_slots=TOOL_SLOTS if latency else None)
        seconds = [cost(point, arm) for arm in ARMS]
        print(f"{replicas:>8} {per_replica:>12} {latency:>5g}s {fleet:>12} "
              + " ".join(f"{s:>16.1f}s" for s in seconds) + f" {statistics.mean(seconds):>7.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

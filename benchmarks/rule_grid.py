"""Candidate rules against sticky, margins 0-8, least-loaded and the peer policies on a grid subset.

Issue 13 part 3: find a rule a router can run that is never worse than the best of
{sticky, margin 0-8, least-loaded} by more than 1% at any point and beats every peer
policy on most points. Prints, per point, every arm's median paired change of the
step time against sticky (common random numbers: step s replays the same
trajectories under every arm), then the criterion for each candidate.

    nice -n 10 .venv/bin/python benchmarks/rule_grid.py --jobs 2 --seeds 3 --json-out out/rule-grid.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from rollout_router.sim.cost import CostModel
from rollout_router.sim.criterion import BASELINES as BASE
from rollout_router.sim.engine import Arm, run_step
from rollout_router.sim.grid import PEERS, RULE, RULE_SAMPLE, Point, grid_arms
from rollout_router.sim.parallel import run_tasks
from rollout_router.sim.workload import OUT_MEDIAN, generate

LEGEND = {"cost_gap40": "cost_affinity (defaults)", "cost_rel1": "cost_affinity, no turn rule"}


def arms(lru: int) -> dict[str, Arm]:
    """The grid's baselines and peers (``grid.grid_arms``), and the candidates tried in their place."""
    s = {"max_sessions": lru}
    # candidates (cost_affinity; the context-, KV- and token-load candidates of the first round are at
    # commit 10dbfa6, see docs/simulator.md)
    candidates = [
        Arm("cost_rel1", "cost_affinity", {"margin": 2, "relative": 0.01, "min_turn_seconds": None, **s}),
        Arm("cost_gap20", "cost_affinity", {"margin": 2, "relative": 0.01, "min_turn_seconds": 20.0, **s}),
        Arm("cost_gap40", "cost_affinity", {"margin": 2, "relative": 0.01, "min_turn_seconds": 40.0, **s}),
        Arm("cost_gap20_m1", "cost_affinity", {"margin": 1, "relative": 0.0, "min_turn_seconds": 20.0, **s}),
    ]
    grid = {label: arm for label, arm in grid_arms(lru).items() if label != RULE}
    return grid | {a.label: a for a in candidates}


def points() -> list[Point]:
    """The in-sample subset of the full grid (``grid.RULE_SAMPLE``): every context, a tight and the physical pool,
    two concurrencies, and the recipe's concurrency at ctx2k (where moving costs most) and ctx9k x4."""
    return list(RULE_SAMPLE)


def run(task: tuple[Point, str, int]) -> float:
    point, label, step = task
    preset = point.preset()
    return run_step(preset, generate(preset, 0, step), arms(preset.router_lru)[label], CostModel()).step_seconds


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=6, help="steps 0..N-1 per point and arm")
    ap.add_argument("--skip-seeds", type=int, default=0, help="simulate only steps K..N-1 (the rest merged from JSON)")
    ap.add_argument("--json-out")
    ap.add_argument("--points", help="only the points whose label contains this")
    ap.add_argument("--plot", metavar="PNG", help="bars: median change vs sticky per point for --plot-arms")
    ap.add_argument("--plot-arms", nargs="+", default=["margin2", "margin4", "least_loaded", "cache_aware",
                                                       "consistent_hash", "cost_gap40"])
    ap.add_argument("--only", nargs="*", help="arm labels (default: all)")
    ap.add_argument("--from-json", nargs="+", metavar="FILE",
                    help="no simulation: merge the step times of earlier runs (same seeds) and report")
    args = ap.parse_args()
    if args.from_json:
        times = {}
        for name in args.from_json:
            with open(name) as f:
                times.update({tuple(k.rsplit("|", 2)): v for k, v in json.load(f)["step_seconds"].items()})
        times = {(pt, a, int(s)): v for (pt, a, s), v in times.items()}
        everything = range(args.seeds)  # a point and an arm count only with every step
        pts_labels = [p.label for p in points() if all((p.label, "sticky", s) in times for s in everything)]
        labels = [a for a in arms(1) if all((pt, a, s) in times for pt in pts_labels for s in everything)]
    else:
        labels = args.only or list(arms(1))
        labels = list(dict.fromkeys(["sticky", *labels]))
        pts = [p for p in points() if args.points is None or args.points in p.label]
        pts_labels = [p.label for p in pts]
        tasks = [(p, a, s) for p in pts for a in labels for s in range(args.skip_seeds, args.seeds)]
        tasks.sort(key=lambda t: -t[0].conc * OUT_MEDIAN[t[0].ctx])
        secs = run_tasks(run, tasks, jobs=args.jobs, desc="rule grid")
        times = {(p.label, a, s): x for (p, a, s), x in zip(tasks, secs)}
    table = {}
    for pt in pts_labels:
        table[pt] = {a: [times[(pt, a, s)] / times[(pt, "sticky", s)] - 1 for s in range(args.seeds)]
                     for a in labels}
    report(table, labels)
    if args.plot:
        plot(table, [a for a in args.plot_arms if a in labels], args.plot)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"seeds": args.seeds, "median_change_vs_sticky": table,
                       "step_seconds": {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in times.items()}}, f, indent=1)
    return 0


def report(table: dict[str, dict[str, list[float]]], labels: list[str]) -> None:
    """Per point every arm's median paired change vs sticky; per candidate the criterion.

    The excess over the best baseline at a point is the median over steps of t_cand / t_best - 1, with best
    the baseline of lowest median change there; "significant" when even its smallest step is above 0
    (for 6 steps, [min, max] covers the median with 96.9%).
    """
    med = {pt: {a: statistics.median(v) for a, v in row.items()} for pt, row in table.items()}
    print("point | " + " | ".join(labels))
    for pt, medians in med.items():
        print(pt + " | " + " | ".join(f"{medians[a]:+.1%}" for a in labels))
    base = [a for a in labels if a in BASE]
    peers = [a for a in labels if a in PEERS]
    for cand in (a for a in labels if a not in PEERS):
        excess: list[float] = []
        fails: list[str] = []
        beats = 0
        for pt, changes in table.items():
            best = min(base, key=lambda b: med[pt][b])
            ratios = [(1 + c) / (1 + b) - 1 for c, b in zip(changes[cand], changes[best])]
            e = statistics.median(ratios)
            excess.append(e)
            if e > 0.01:
                fails.append(f"{pt.split(' lru')[0]} {e:+.1%} vs {best}{' (significant)' if min(ratios) > 0 else ''}")
            beats += all(med[pt][cand] < med[pt][p] for p in peers)
        print(f"{cand}: worst excess over the best baseline {max(excess):+.2%}; points over 1%: {len(fails)}"
              f" {fails}; beats every peer at {beats}/{len(table)} points")


def plot(table: dict[str, dict[str, list[float]]], labels: list[str], path: str) -> None:
    """Grouped bars, one group per point: each arm's median paired change of the step time vs sticky."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = list(table)
    fig, ax = plt.subplots(figsize=(13, 4.5))
    width = 0.8 / len(labels)
    for i, arm in enumerate(labels):
        ys = [100 * statistics.median(table[pt][arm]) for pt in pts]
        ax.bar([x + i * width for x in range(len(pts))], ys, width, label=LEGEND.get(arm, arm))
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(pts))])
    ax.set_xticklabels([pt.split(" lru")[0].replace(" kv=", "\n").replace(" c=", " c=") for pt in pts], fontsize=7)
    ax.set_ylabel("step time vs sticky (%), median of paired steps")
    ax.set_ylim(-12, 16)
    ax.legend(fontsize=7, ncol=len(labels))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

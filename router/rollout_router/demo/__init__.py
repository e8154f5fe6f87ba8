"""``rollout-router demo``: a small verl-shaped rollout through the router under each policy, with a verdict.

One set of simulated replicas, one router per arm. Each round draws a new rollout (``workload.rollout``,
seeded by the round) and replays it through every arm in turn, the order rotated each round so no arm
always runs first; each arm is measured from the outside: the round's wall time (the step time, as
verl's makespan), turn latency at the client, prefix hits from the replicas' own /metrics, in-flight
skew and kept/broken counts from the router's /status. Under the table, each arm's paired change of
wall time against sticky over the rounds, with an exact order-statistic interval of its median
(``sim.stats.median_ci``), or "no difference detectable" when that interval contains zero.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import subprocess
from collections.abc import Iterator, Sequence

from tqdm import tqdm

from .. import usage
from ..advice import MARGIN
from ..localfleet import Service, spawn_replica, spawn_router, stop, wait_healthy
from . import seedscale
from .driver import ArmResult, run_arm
from .workload import rollout

BASELINE = "sticky always (margin null)"
MARGINS = (0, 2, MARGIN)  # --margins' default: move unless least-loaded, a tight margin, the advised one
COLUMNS = {
    "wall s": "median over the rounds of the time from a round's first request to its last answer (verl's step time)",
    "mean s / p99 s": "a turn's latency at the client, over every turn of every round",
    "prefix hit": "mean over the rounds of prompt tokens found cached / all asked (the replicas' own /metrics)",
    "skew mean / max": "max - min in-flight requests over the replicas, sampled from the router's /status",
    "kept / broken": "turns sent to their trajectory's pinned replica / moved off it by the margin (router /status)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=usage.at_least(1), default=4,
                        help="simulated vLLM replicas (default: %(default)s)")
    parser.add_argument("--prompts", type=usage.at_least(1), default=6,
                        help="distinct prompts (GRPO groups) per round (default: %(default)s)")
    parser.add_argument("--samples", type=usage.at_least(1), default=4,
                        help="trajectories per prompt (default: %(default)s)")
    parser.add_argument("--rounds", type=usage.at_least(1), default=3,
                        help="paired rounds: every arm runs each round's rollout (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="random seed of the conversations (default: %(default)s)")
    parser.add_argument("--num-blocks", type=usage.at_least(1), default=1200,
                        help="KV blocks per simulated replica (smaller = more cache pressure; default: %(default)s)")
    parser.add_argument("--margins", type=usage.margins, default=MARGINS, metavar="N,N,...",
                        help="the margins to run, each a router beside no affinity and sticky "
                        f"(default: {','.join(map(str, MARGINS))})")
    parser.add_argument("--seed-steps", type=usage.at_least(0), default=6,
                        help="paired steps of the seed's scale in the fleet simulator (16 replicas of Qwen2.5-32B), "
                        "sticky against the advised margin, after the live part (0: none; default: %(default)s)")


@contextlib.contextmanager
def fleet(replicas: int, arms: Sequence[Sequence[str]], fake_args: Sequence[str]) -> Iterator[
        tuple[list[Service], list[Service]]]:
    """``replicas`` simulated vLLM servers and one router per arm in front of all of them; all stop on exit.

    The children run in their own process groups (a terminal's Ctrl-C reaches the demo alone, which stops them in
    order); so a SIGTERM or a closed terminal (SIGHUP) ends the demo as Ctrl-C does, through this exit."""
    processes: list[subprocess.Popen] = []  # each recorded as it starts: a Ctrl-C never orphans one
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        starting = [spawn_replica(i, fake_args, into=processes) for i in range(replicas)]
        backends = [s.bound() for s in starting]
        starting_routers = [spawn_router([b.backend for b in backends], args, into=processes) for args in arms]
        routers = [s.bound() for s in starting_routers]
        yield [wait_healthy(b, "/health") for b in backends], [wait_healthy(r, "/readyz") for r in routers]
    finally:
        for process in reversed(processes):
            stop(process)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM or SIGHUP: what Ctrl-C does (inside a round, asyncio's own handler cancels the round cleanly)."""
    signal.raise_signal(signal.SIGINT)


def arms(margins: Sequence[float]) -> dict[str, list[str]]:
    """Each arm's name and its router's flags: no affinity, sticky (the baseline), then each margin."""
    return {"no affinity (least_loaded)": ["--policy", "least_loaded"],
            BASELINE: ["--affinity-break-margin", "null"],
            **{f"margin {m}": ["--affinity-break-margin", str(m)] for m in margins}}


def run(args: argparse.Namespace) -> int:
    policies = arms(args.margins)
    rounds = [rollout(args.prompts, args.samples, seed=args.seed + r) for r in range(args.rounds)]
    turns = sum(len(c.turns) for convs in rounds for c in convs)
    print(f"starting {args.replicas} simulated vLLM replicas and {len(policies)} routers (one per policy)...", flush=True)
    names = list(policies)
    results: dict[str, list[ArmResult]] = {n: [] for n in names}
    with fleet(args.replicas, list(policies.values()), ["--num-blocks", str(args.num_blocks)]) as (replicas, routers):
        print(f"{args.rounds} paired rounds of {args.prompts * args.samples} verl-shaped trajectories; every policy "
              f"replays each round ({turns} turns per policy)\n", flush=True)
        with tqdm(total=turns * len(names), unit="turn", dynamic_ncols=True) as bar:
            for r, conversations in enumerate(rounds):
                for i in range(len(names)):
                    k = (i + r) % len(names)  # rotate the order every round
                    bar.set_description(f"round {r + 1}: {names[k]}")
                    router = routers[k]
                    results[names[k]].append(asyncio.run(run_arm(
                        names[k], router.url, str(router.admin_url), [s.url for s in replicas], conversations,
                        on_turn=lambda: bar.update(1))))
    print()
    print(table(results))
    print(legend())
    print()
    print("\n".join(verdicts(results)))
    if args.seed_steps:
        print(at_the_seeds_scale(args.seed_steps))
    print(HOW_TO_USE)
    return 1 if any(r.errors for rs in results.values() for r in rs) else 0


def at_the_seeds_scale(count: int) -> str:
    """The second part: paired steps of the study's seed point in the simulator, and the verdict."""
    print(f"\nat the seed's scale, in the fleet simulator: 16 replicas of Qwen2.5-32B (TP 4, H200), verl's tool_agent "
          f"traffic, {count} paired steps of verl's sticky balancer and of margin {MARGIN}...", flush=True)
    pairs = []
    with tqdm(total=count, unit="step", dynamic_ncols=True) as bar:
        for pair in seedscale.steps(count):
            pairs.append(pair)
            bar.update(1)
    return seedscale.verdict(pairs)


def table(results: dict[str, list[ArmResult]]) -> str:
    header = f"{'policy':<30}{'wall s':>8}{'mean s':>8}{'p99 s':>8}{'prefix hit':>11}{'skew mean':>10}{'skew max':>9}{'kept':>7}{'broken':>7}"
    rows = [header, "-" * len(header)]
    for name, runs in results.items():
        lat = sorted(x for r in runs for x in r.turn_latencies)
        skews = [s for r in runs for s in r.skews] or [0]
        hit = statistics.fmean(r.prefix_hit_rate for r in runs)
        last = runs[-1].status  # the router's counters are cumulative over the rounds
        rows.append(f"{name:<30}{statistics.median(r.wall_seconds for r in runs):>8.2f}{statistics.fmean(lat):>8.3f}"
                    f"{lat[min(len(lat) - 1, int(0.99 * len(lat)))]:>8.3f}{hit:>10.1%} {statistics.fmean(skews):>10.2f}"
                    f"{max(skews):>9}{last['affinity_kept']:>7}{last['affinity_broken']:>7}")
    return "\n".join(rows)


def legend() -> str:
    return "\n".join(f"  {name}: {text}" for name, text in COLUMNS.items())


def verdicts(results: dict[str, list[ArmResult]]) -> list[str]:
    """One line per arm: its paired change of wall time against sticky over the rounds."""
    from ..sim.stats import median_ci, paired_changes

    base = [r.wall_seconds for r in results[BASELINE]]
    lines = []
    for name, runs in results.items():
        if name == BASELINE:
            continue
        ch = paired_changes([r.wall_seconds for r in runs], base)
        lo, hi, coverage = median_ci(ch)
        span = f"median {statistics.median(ch):+.1%}, {coverage:.0%} interval [{lo:+.1%}, {hi:+.1%}]"
        if lo > 0 or hi < 0:
            word = "slower" if lo > 0 else "faster"
            lines.append(f"{name} vs sticky: {word} ({span}) over {len(ch)} paired rounds")
        else:
            lines.append(f"{name} vs sticky: no difference detectable in {len(ch)} paired rounds ({span})")
    return lines


HOW_TO_USE = f"""
Point the router at real vLLM servers, with the margin the study at the seed's scale advises (README):
  rollout-router serve --port 8080 --backend http://vllm-0:8000 --backend http://vllm-1:8000 \\
      --affinity-break-margin {MARGIN}
and send each conversation's turns with the header  X-Session-ID: <trajectory id>.
In Kubernetes, apply a RolloutRouter resource instead (see README)."""

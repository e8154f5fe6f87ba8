"""``rollout-router demo``: the same rollout through the router under each policy setting.

Every arm gets fresh replicas (cold caches) and a fresh router, replays the
same conversations, and is measured from the outside: turn latency at the
client, prefix-cache hit rate from the replicas' own /metrics, in-flight skew
and kept/broken counts from the router's /status.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics

from tqdm import tqdm

from .. import usage
from ..localfleet import local_fleet
from .driver import ArmResult, run_arm
from .workload import rollout

ARMS = {
    "no affinity (least_loaded)": ["--policy", "least_loaded"],
    "sticky always (margin null)": ["--affinity-break-margin", "null"],
    "margin 0": ["--affinity-break-margin", "0"],
    "margin 2": ["--affinity-break-margin", "2"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=usage.at_least(1), default=4,
                        help="simulated vLLM replicas (default: %(default)s)")
    parser.add_argument("--prompts", type=usage.at_least(1), default=12,
                        help="distinct prompts (GRPO groups; default: %(default)s)")
    parser.add_argument("--samples", type=usage.at_least(1), default=5,
                        help="trajectories per prompt (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="random seed of the conversations (default: %(default)s)")
    parser.add_argument("--num-blocks", type=usage.at_least(1), default=1200,
                        help="KV blocks per simulated replica (smaller = more cache pressure; default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    conversations = rollout(args.prompts, args.samples, seed=args.seed)
    turns = sum(len(c.turns) for c in conversations)
    print(f"{args.replicas} simulated vLLM replicas, {len(conversations)} conversations, {turns} turns per arm\n")
    fake_args = ["--num-blocks", str(args.num_blocks)]
    results = []
    with tqdm(total=turns * len(ARMS), unit="turn", dynamic_ncols=True) as bar:
        for name, router_args in ARMS.items():
            bar.set_description(name)
            with local_fleet(args.replicas, router_args, fake_args) as (router, replicas):
                results.append(asyncio.run(run_arm(name, router.url, str(router.admin_url), [r.url for r in replicas], conversations,
                                                   on_turn=lambda: bar.update(1))))
    print()
    print(table(results))
    print(HOW_TO_USE)
    return 1 if any(r.errors for r in results) else 0


def table(results: list[ArmResult]) -> str:
    header = f"{'policy':<30}{'wall s':>8}{'mean s':>8}{'p99 s':>8}{'prefix hit':>11}{'skew mean':>10}{'skew max':>9}{'kept':>7}{'broken':>7}"
    rows = [header, "-" * len(header)]
    for r in results:
        rows.append(f"{r.name:<30}{r.wall_seconds:>8.2f}{r.mean_latency:>8.3f}{r.p99_latency:>8.3f}"
                    f"{r.prefix_hit_rate:>10.1%} {statistics.fmean(r.skews or [0]):>10.2f}{max(r.skews or [0]):>9}"
                    f"{r.status['affinity_kept']:>7}{r.status['affinity_broken']:>7}")
    return "\n".join(rows)


HOW_TO_USE = """
Point the router at real vLLM servers:
  rollout-router serve --port 8080 --backend http://vllm-0:8000 --backend http://vllm-1:8000 \\
      --affinity-break-margin 2
and send each conversation's turns with the header  X-Session-ID: <trajectory id>.
In Kubernetes, apply a RolloutRouter resource instead (see README)."""

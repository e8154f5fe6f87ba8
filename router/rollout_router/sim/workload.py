"""RL rollout workload: GRPO groups of multi-turn agent trajectories, and the presets.

A step draws ``prompts`` prompts, each sampled ``n`` times (one GRPO group).
Every sample is a trajectory of turns: turn k's context is the prompt plus all
earlier responses and tool results; between turns the tool takes
``tool_latency`` seconds (the router sees no load from a trajectory in a tool
call). Lengths are log-normal (long-tailed) and the total response, tool
tokens included (verl's response mask), is capped at ``max_response``.
All draws come from ``numpy.random.default_rng([seed, step])`` in a fixed
order, so every arm of a step replays identical trajectories (common random
numbers).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .sources import (
    PHYSICAL_KV_TOKENS,
    PUBLISHED_TOOL_LATENCY,
    RECIPE_MAX_BATCHED_TOKENS,
    RECIPE_N,
    RECIPE_PER_REPLICA,
    RECIPE_PROMPTS,
    RECIPE_REPLICAS,
    VERL_MAX_NUM_SEQS,
    VERL_STICKY_ENTRIES,
)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One fleet and workload. The defaults are the shared, sourced values (``sources``); a preset names
    only what differs: its output length (from the published context) and its KV pool."""

    name: str
    out_median: float  # tokens per turn; fitted to the published final context (``fit_out_median``)
    kv_tokens: int  # KV pool per replica (tokens)
    steps: int = 0  # paired steps in the published run
    prompts: int = RECIPE_PROMPTS  # GRPO groups per step
    n: int = RECIPE_N  # samples per prompt
    prompt_median: float = 220  # shared: DAPO-Math-17k prompts are short (background notes: ~100-400 tokens)
    out_sigma: float = 0.9  # shared: log-normal spread of a turn's output
    turns_mean: float = 3.0  # shared: turns per trajectory (geometric), ReTool-style agent loop
    max_turns: int = 8  # shared
    tool_median: float = 200  # shared: tool-result tokens per turn
    tool_latency: float = PUBLISHED_TOOL_LATENCY  # the published runs had none
    prompt_sigma: float = 0.5
    tool_sigma: float = 0.8
    tool_latency_sigma: float = 0.5
    max_prompt: int = 2048  # the recipe's max_prompt_length
    max_response: int = 20480  # the recipe's max_response_length
    max_num_seqs: int = VERL_MAX_NUM_SEQS
    max_batched_tokens: int = RECIPE_MAX_BATCHED_TOKENS
    replicas: int = RECIPE_REPLICAS
    router_lru: int = VERL_STICKY_ENTRIES  # verl's sticky map
    tool_slots: int | None = None  # tool calls the sandbox runs at once, fleet-wide (None: no bound)
    # the published row this preset stands for
    published_ctx: str = ""
    published_hit: float = 0.0
    published_change: float = 0.0
    published_note: str = ""


# Output medians fitted once (``fit_out_median``, seed 7, two recipe-sized steps) to the published approximate
# final context (sources.PUBLISHED_CONTEXT) with everything else shared; tests/test_sim_grid.py re-checks the fit.
# ctx20k cannot reach 19.8K: with the shared shape the mean final context tops out near 19.1K at an output
# median equal to the whole response budget (20,480), which is what it uses.
OUT_MEDIAN = {"ctx2k": 330.0, "ctx9k": 2031.0, "ctx20k": 20480.0}
# The "large KV pool" arm reused 99.7% of prefixes: a pool that never evicts, i.e. one that holds every
# trajectory of the step at its longest (trajectories per replica x (max prompt + max response)).
HOLDS_ALL_KV_TOKENS = RECIPE_PER_REPLICA * RECIPE_MAX_BATCHED_TOKENS

PRESETS: dict[str, Preset] = {
    p.name: p for p in [
        Preset("ctx2k", OUT_MEDIAN["ctx2k"], PHYSICAL_KV_TOKENS, steps=39,
               published_ctx="2.2K", published_hit=0.087, published_change=-0.038),
        Preset("ctx9k", OUT_MEDIAN["ctx9k"], PHYSICAL_KV_TOKENS, steps=9,
               published_ctx="8.7K", published_hit=0.053, published_change=-0.086),
        Preset("ctx20k", OUT_MEDIAN["ctx20k"], PHYSICAL_KV_TOKENS, steps=17,
               published_ctx="19.8K", published_hit=0.016, published_change=-0.101),
        Preset("ctx9k-bigkv", OUT_MEDIAN["ctx9k"], HOLDS_ALL_KV_TOKENS, steps=39,
               published_ctx="8.7K, large KV pool", published_hit=0.997, published_change=-0.054,
               published_note="prefix reuse 99.7% -> 97.6%"),
        # a test fixture, not a study preset: seconds per step on one core
        Preset("quick", 400, 40_000, steps=4, prompts=12, n=8, prompt_median=200, max_turns=6, tool_median=100,
               tool_latency=0.3, replicas=4, max_batched_tokens=22528, router_lru=10_000),
    ]
}


def mean_final_context(preset: Preset, seed: int = 7, steps: int = 2) -> float:
    """Mean final context (prompt + every output and tool result) of ``steps`` generated steps."""
    ctx = [t.contexts()[-1] + t.outs[-1] for s in range(steps) for t in generate(preset, seed, s)]
    return float(np.mean(ctx))


def fit_out_median(preset: Preset, target: float, iters: int = 30) -> float:
    """The output median at which ``preset``'s mean final context is ``target`` (bisection in log space)."""
    lo, hi = np.log(16.0), np.log(float(preset.max_response))
    for _ in range(iters):
        mid = (lo + hi) / 2
        if mean_final_context(dataclasses.replace(preset, out_median=float(np.exp(mid)))) < target:
            lo = mid
        else:
            hi = mid
    return float(np.exp((lo + hi) / 2))


class Trajectory:
    """One sample's turns; mutated by the fleet as it runs."""

    __slots__ = ("key", "gid", "tid", "index", "prompt", "P", "S", "outs", "tools", "lats",
                 "turn", "ctx", "last", "t_done")

    def __init__(self, key: str, gid: int, tid: int, index: int, prompt: int, P: int,
                 outs: list[int], tools: list[int], lats: list[float], S: int = 0):
        """``P`` full prompt blocks, the first ``S`` of them shared by every trajectory (``replica.Req``)."""
        self.key, self.gid, self.tid, self.index = key, gid, tid, index
        self.prompt, self.P, self.S = prompt, P, S
        self.outs, self.tools, self.lats = outs, tools, lats
        self.turn, self.ctx = 0, prompt
        self.last: int | None = None
        self.t_done = 0.0

    def contexts(self) -> list[int]:
        """Prompt length of every turn."""
        ctx, out = self.prompt, [self.prompt]
        for o, t in zip(self.outs[:-1], self.tools):
            ctx += o + t
            out.append(ctx)
        return out


TRAJ_CHAIN = 1 << 40


def generate(preset: Preset, seed: int, step: int, block_size: int = 16) -> list[Trajectory]:
    rng = np.random.default_rng([seed, step])
    m, T = preset.prompts * preset.n, preset.max_turns
    prompts = np.clip(rng.lognormal(np.log(preset.prompt_median), preset.prompt_sigma, preset.prompts), 16, preset.max_prompt).astype(int)
    turns = np.minimum(rng.geometric(1.0 / preset.turns_mean, m), T)
    outs = np.maximum(rng.lognormal(np.log(preset.out_median), preset.out_sigma, (m, T)), 1).astype(int)
    tools = np.maximum(rng.lognormal(np.log(preset.tool_median), preset.tool_sigma, (m, T)), 1).astype(int)
    lats = rng.lognormal(np.log(max(preset.tool_latency, 1e-9)), preset.tool_latency_sigma, (m, T))
    if preset.tool_latency <= 0:
        lats[:] = 0.0
    trajs = []
    for i in range(m):
        g = i // preset.n
        prompt = int(prompts[g])
        o_list, t_list, l_list, budget = [], [], [], preset.max_response
        for k in range(int(turns[i])):
            o = min(int(outs[i, k]), budget)
            o_list.append(o)
            budget -= o
            if k == turns[i] - 1 or budget <= 0:
                break
            t = min(int(tools[i, k]), budget)
            budget -= t
            t_list.append(t)
            l_list.append(float(lats[i, k]))
            if budget <= 0:  # the tool result used up the budget: one last 1-token turn
                o_list.append(1)
                break
        trajs.append(Trajectory(f"s{step}-g{g}-{i % preset.n}", g, TRAJ_CHAIN + i, i, prompt,
                                prompt // block_size, o_list, t_list, l_list))
    return trajs


class BlockChainPrefix(Sequence):
    """A request's full-block hash chain, computed on demand (for cache-aware policies).

    Item i is an integer standing for vLLM's chained hash of block i: the first
    ``S`` blocks are shared by every request, the group prompt's by the group,
    later ones belong to the trajectory.
    """

    __slots__ = ("gid", "tid", "P", "n", "S")

    def __init__(self, gid: int, tid: int, P: int, n: int, S: int = 0):
        self.gid, self.tid, self.P, self.n, self.S = gid, tid, P, n, S

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        if i < self.S:
            return (1 << 61) | i
        if i < self.P:
            return (self.gid << 21) | i
        return (1 << 62) | ((self.tid - TRAJ_CHAIN) << 21) | i

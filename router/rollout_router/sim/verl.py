"""The traffic verl sends: trajectories that follow verl's ``single_turn_agent`` and ``tool_agent`` loops.

Everything taken from verl is in ``verlsources`` with its source. What no source
publishes is a field of ``VerlPreset`` with a stated default that the verl grid
(``sim.verlgrid``) varies instead of fitting it:

* ``turn_out_median``: tokens a ReTool-SFT (or DAPO) model writes per turn;
* ``tool_call_p``: the chance that a turn ends in a tool call (and so is not
  the last); ``tool_agent`` ends a trajectory on the first turn without one;
* ``tool_latency``: seconds in the sandbox per call (the PR's runs had none);
* ``kv``: the pool, from the PR's unpublished TP and memory utilisation.

One step: the batch is split into ``AGENT_WORKERS`` contiguous chunks (siblings
adjacent); every worker starts all its samples at once, so the first turns reach
the balancer at t=0 interleaved across the workers (worker 0's first sample,
worker 1's first, ...). Keys: ``single_turn_agent`` a fresh one per request,
``tool_agent`` one per sample for all its turns; siblings never share one.
Every context starts with the fleet-wide shared prefix (``Trajectory.S``);
replicas start every step with an empty prefix cache (``engine.run_step``).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .cost import CostModel
from .verlsources import (
    AGENT_WORKERS,
    ASYNC_RETOOL7B,
    DAPO32B,
    MAX_NUM_SEQS,
    ONE_STEP_OFF7B,
    PROBLEM_MEDIAN_TOKENS,
    QWEN7B,
    QWEN32B,
    RETOOL32B,
    SHARED_SINGLE_TURN_TOKENS,
    SHARED_TOOL_AGENT_TOKENS,
    STICKY_ENTRIES,
    TOOL_RESULT_TOKENS,
    pool,
)
from .workload import TRAJ_CHAIN, Preset, Trajectory

SINGLE_TURN, TOOL_AGENT = "single_turn_agent", "tool_agent"


@dataclasses.dataclass(frozen=True)
class VerlPreset:
    """One verl recipe's fleet and rollout."""

    name: str
    agent_loop: str
    prompts: int
    n: int
    prompt_length: int
    response_length: int
    replicas: int
    kv_tokens: int
    max_batched_tokens: int
    model: str = "qwen2.5-32b"
    max_assistant_turns: int | None = None  # rollout.yaml: null = no limit
    turn_out_median: float = 1024.0  # unknown: a grid axis
    turn_out_sigma: float = 1.0  # unknown: a log-normal's long tail
    tool_call_p: float = 0.75  # unknown: a grid axis
    tool_latency: float = 0.0  # unknown: a grid axis (the PR's runs had none)
    tool_tokens: int = TOOL_RESULT_TOKENS
    tool_slots: int | None = None  # the sandbox's concurrent tool calls, fleet-wide (None: no bound)
    max_num_seqs: int = MAX_NUM_SEQS
    sticky_entries: int = STICKY_ENTRIES
    source: str = ""

    @property
    def shared_tokens(self) -> int:
        return SHARED_TOOL_AGENT_TOKENS if self.agent_loop == TOOL_AGENT else SHARED_SINGLE_TURN_TOKENS

    @property
    def cost(self) -> CostModel:
        return QWEN7B if self.model == "qwen2.5-7b" else QWEN32B

    def engine_preset(self) -> Preset:
        """The fleet as ``engine.run_step`` takes it."""
        return Preset(self.name, self.turn_out_median, self.kv_tokens, prompts=self.prompts, n=self.n,
                      max_prompt=self.prompt_length, max_response=self.response_length, replicas=self.replicas,
                      max_num_seqs=self.max_num_seqs, max_batched_tokens=self.max_batched_tokens,
                      router_lru=self.sticky_entries, tool_slots=self.tool_slots)

    def scaled(self, replicas: int) -> VerlPreset:
        """The same per-replica load on ``replicas`` replicas; the fleet-wide sticky map shrinks with it."""
        prompts = max(1, round(self.prompts * replicas / self.replicas))
        entries = max(1, round(self.sticky_entries * replicas / self.replicas))
        return dataclasses.replace(self, name=f"{self.name} R={replicas}", prompts=prompts, replicas=replicas,
                                   sticky_entries=entries)


def _recipe(name: str, agent_loop: str, recipe: dict, model: str, source: str) -> VerlPreset:
    r = dict(recipe)
    tp, util = r.pop("tp"), r.pop("util")
    cost = QWEN7B if model == "qwen2.5-7b" else QWEN32B
    return VerlPreset(name, agent_loop, kv_tokens=pool(cost, tp, util), model=model, source=source, **r)


VERL_PRESETS: dict[str, VerlPreset] = {p.name: p for p in [
    _recipe("retool-32b", TOOL_AGENT, RETOOL32B, "qwen2.5-32b", "verl-recipe retool/run_qwen2-32b_dapo.sh"),
    _recipe("async-retool-7b", TOOL_AGENT, ASYNC_RETOOL7B, "qwen2.5-7b",
            "verl fully_async_policy/shell/dapo_7b_async_retool.sh"),
    _recipe("one-step-off-dapo-7b", SINGLE_TURN, ONE_STEP_OFF7B, "qwen2.5-7b",
            "verl one_step_off_policy/shell/dapo_7b_math_fsdp2_64_64.sh"),
    _recipe("one-step-off-dapo-7b-tool", TOOL_AGENT, ONE_STEP_OFF7B, "qwen2.5-7b",
            "the one-step-off script's fleet run with tool_agent (the PR's replica count and metric)"),
    _recipe("dapo-32b", SINGLE_TURN, DAPO32B, "qwen2.5-32b", "verl-recipe dapo/run_dapo_qwen2.5_32b.sh"),
]}


def max_tokens(p: VerlPreset, context: int) -> int:
    """verl's per-turn ``max_tokens`` (vllm_async_server.py ``generate``@0.9.1): at most ``response_length``, and no
    more than is left of prompt + response; at least 1 (vLLM refuses 0)."""
    return max(1, min(p.response_length, p.prompt_length + p.response_length - context))


def arrival_order(m: int, workers: int = AGENT_WORKERS) -> list[int]:
    """Batch indices in the order their first turns reach the balancer: contiguous chunks, one per worker
    (``DataProto.chunk`` asserts equal chunks; an uneven ``m`` is split as ``np.array_split`` does), taken
    one sample per worker in turn."""
    sizes = [m // workers + (w < m % workers) for w in range(workers)]
    starts = np.cumsum([0, *sizes[:-1]])
    return [int(starts[w]) + j for j in range(max(sizes, default=0)) for w in range(workers) if j < sizes[w]]


def turns(p: VerlPreset, prompt: int, outs: np.ndarray, calls: np.ndarray) -> list[int]:
    """One trajectory's output lengths under ``p``'s loop; a tool result follows every turn but the last.

    ``tool_agent`` (tool_agent_loop.py): a turn generates up to ``max_tokens``; the trajectory ends when the
    response (tool tokens included) reaches ``response_length``, at ``max_assistant_turns``, on a turn without a
    tool call, or when the tool's tokens would reach ``response_length`` (then the tool result is not appended).
    """
    limit = 1 if p.agent_loop == SINGLE_TURN else min(p.max_assistant_turns or len(outs), len(outs))
    ctx, response, out = prompt, 0, []
    for k in range(limit):
        o = max(1, min(int(outs[k]), max_tokens(p, ctx)))
        out.append(o)
        ctx, response = ctx + o, response + o
        if k + 1 >= limit or not calls[k] or response + p.tool_tokens >= p.response_length:
            break
        ctx, response = ctx + p.tool_tokens, response + p.tool_tokens
    return out


def generate_verl(p: VerlPreset, seed: int, step: int, block_size: int = 16) -> list[Trajectory]:
    """Step ``step``'s trajectories, in arrival order; all draws from ``default_rng([seed, step])`` (common
    random numbers: every arm replays them)."""
    rng = np.random.default_rng([seed, step])
    m = p.prompts * p.n
    cap = 1 if p.agent_loop == SINGLE_TURN else (p.max_assistant_turns or 64)
    shared = p.shared_tokens
    problems = np.clip(rng.lognormal(np.log(PROBLEM_MEDIAN_TOKENS), 0.5, p.prompts), 16, p.prompt_length - shared)
    outs = np.maximum(rng.lognormal(np.log(p.turn_out_median), p.turn_out_sigma, (m, cap)), 1).astype(int)
    calls = rng.random((m, cap)) < p.tool_call_p
    lats = rng.lognormal(np.log(max(p.tool_latency, 1e-9)), 0.5, (m, cap)) if p.tool_latency > 0 else np.zeros((m, cap))
    trajs = []
    for i in arrival_order(m):
        g = i // p.n
        prompt = shared + int(problems[g])
        out = turns(p, prompt, outs[i], calls[i])
        tools = len(out) - 1
        trajs.append(Trajectory(f"s{step}-t{i}", g, TRAJ_CHAIN + i, i, prompt, prompt // block_size, out,
                                [p.tool_tokens] * tools, [float(x) for x in lats[i, :tools]], S=shared // block_size))
    return trajs

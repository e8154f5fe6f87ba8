"""Physical lower bound on a rollout step (docs/simulator.md, "Lower bound").

* LB_work: every token's work spread perfectly over the replicas, with perfect
  prefix reuse (a GRPO prompt is prefilled once, each turn prefills only its
  new tokens) and every decode token at the per-token cost of the largest batch
  the KV pool allows at that context.
* LB_path: the longest trajectory run alone: its prefills, tool waits and
  decode steps at batch size 1.
Both use each turn's starting context for the whole turn, which only lowers
them, so the bound stays valid. LB = max(LB_work, LB_path).
"""
from __future__ import annotations

from .cost import CostModel
from .workload import Preset, Trajectory


def lower_bound(preset: Preset, trajs: list[Trajectory], cost: CostModel, kv_tokens: int | None = None) -> dict[str, float]:
    kv = kv_tokens if kv_tokens is not None else preset.kv_tokens
    work, path, seen_groups = 0.0, 0.0, set()
    for tr in trajs:
        own = 0.0
        ctxs = tr.contexts()
        for k, ctx in enumerate(ctxs):
            if k == 0:
                fresh = tr.prompt
                shared = tr.gid in seen_groups
                seen_groups.add(tr.gid)
            else:
                fresh, shared = tr.outs[k - 1] + tr.tools[k - 1], False
                own += tr.lats[k - 1]
            pre = fresh * cost.prefill_seconds_per_token(ctx - fresh / 2)
            d = tr.outs[k]
            b = max(1, min(preset.max_num_seqs, kv // max(ctx, 1)))
            per_tok = cost.step_time(b, b * ctx, b * ctx) / b
            work += (0.0 if shared else pre) + d * per_tok
            own += pre + d * cost.step_time(1, ctx, ctx)
        path = max(path, own)
    work /= preset.replicas
    return {"lb_work": work, "lb_path": path, "lb": max(work, path)}

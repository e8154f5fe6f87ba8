"""Markdown of a grid run: the sections docs/simulator.md and the README take from it.

Each section is generated whole; ``fill`` replaces the text between a
document's ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->`` markers,
so ``make study`` rewrites the numbers and leaves the prose alone.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from . import criterion
from .grid import PEERS, PRESET_POINTS, RULE, Point
from .sources import (
    PHYSICAL_KV_TOKENS,
    PUBLISHED_CONTEXT,
    RECIPE_PER_REPLICA,
    RECIPE_REPLICAS,
    RECIPE_TRAJECTORIES,
    VERL_STICKY_ENTRIES,
)
from .workload import OUT_MEDIAN, PRESETS

COMPARED = ("margin0", "margin2", "margin4", "margin8", "least_loaded", RULE)
SCALE_ARMS = ("margin2", "least_loaded", RULE)
Key = tuple[str, str, int, int | None, int, int, float | None]


def _key(p: dict[str, Any]) -> Key:
    return (p["ctx"], p["kv"], p["conc"], p["lru"], p["replicas"], p["routers"], p["exchange_s"])


def _pkey(p: Point) -> Key:
    ex = None if math.isinf(p.exchange_s) else p.exchange_s
    return (p.ctx, p.kv, p.conc, p.lru, p.replicas, p.routers, ex)


def _index(grid: dict[str, Any]) -> dict[Key, dict[str, Any]]:
    return {_key(p): p for p in grid["points"]}


def _block(grid: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The points of block ``name``, in the block's order."""
    by_label = {p["label"]: p for p in grid["points"]}
    return [by_label[label] for label in grid["blocks"].get(name, [])]


def _significant(c: dict[str, float]) -> bool:
    return c["ci_low"] > 0 or c["ci_high"] < 0


def _ch(pol: dict[str, Any] | None) -> str:
    """``-3.1% [-5.0%, -1.2%]``, bold when the interval excludes zero."""
    if pol is None:
        return "—"
    c = pol["change"]
    text = f"{c['median']:+.1%} [{c['ci_low']:+.1%}, {c['ci_high']:+.1%}]"
    return f"**{text}**" if _significant(c) else text


def _coverage_note(grid: dict[str, Any]) -> str:
    cov = {round(pol["change"]["coverage"], 4) for p in grid["points"] for pol in p["policies"].values()}
    covs = ", ".join(f"{c:.1%}" for c in sorted(cov))
    return (f"{grid['seeds']} paired steps per point (seeds 0-{grid['seeds'] - 1}); cells: median paired change "
            f"t_policy/t_sticky - 1 [order-statistic interval of the median, exact coverage {covs}]; **bold**: the "
            f"interval excludes 0.")


def sources_table() -> str:
    rows = ["| parameter | value | source |", "|---|---|---|",
            f"| trajectories per step | {RECIPE_TRAJECTORIES:,} (1,536 prompts x 16) | DAPO recipe: gen_prompt_bsz = 3 x 512, n = 16 |",
            f"| replicas | {RECIPE_REPLICAS} (grid: 8, same per-replica load) | recipe: 16 nodes x 8 GPUs / gen_tp 4 |",
            f"| concurrency | {RECIPE_PER_REPLICA} trajectories per replica | the two rows above |",
            f"| KV pool per replica | {PHYSICAL_KV_TOKENS:,} tokens | H200 140.4 GiB x 0.80 (recipe) - 15.26 GiB weights/TP - 4.5 GiB activations, / 64 KiB per token (`sources.kv_pool_tokens`) |",
            "| max_num_batched_tokens / max_num_seqs | 22,528 / 1,024 | recipe (2,048 + 20,480) / verl's rollout default |",
            f"| sticky map | {VERL_STICKY_ENTRIES:,} entries (LRU) | verl load_balance.py DEFAULT_ROUTING_CACHE_SIZE |",
            "| tool latency | 0 | the published runs had none |",
            "| prompt, turns, tool tokens, spreads | 220 median; 3 mean (max 8); 200 median; sigma 0.5 / 0.9 / 0.8 | shared by every preset and point (DAPO-Math prompts are short; no published turn counts) |"]
    for name, target in PUBLISHED_CONTEXT.items():
        rows.append(f"| output per turn, {name} | {OUT_MEDIAN[name]:,.0f} median | fitted to the published final context "
                    f"{target:,} (`workload.fit_out_median`){'; capped: mean 19.1K is the most the shared shape reaches' if name == 'ctx20k' else ''} |")
    rows.append(f"| large KV pool (ctx9k-bigkv) | {PRESETS['ctx9k-bigkv'].kv_tokens:,} tokens | holds every trajectory at its longest (768 x 22,528): the published arm reused 99.7% |")
    return "\n".join(rows)


def presets_table(grid: dict[str, Any], with_published: bool = True) -> str:
    idx = _index(grid)
    rows = ["| preset (grid point) | published (verl PR #7435) | sticky: step s, prefix hit | margin 2 vs sticky | margin 4 | least-loaded |",
            "|---|---|---|---|---|---|"]
    for name, point in PRESET_POINTS.items():
        p = idx.get(_pkey(point))
        if p is None:
            continue
        pr, pol = PRESETS[name], p["policies"]
        pub = f"{pr.published_change:+.1%} (hit {pr.published_hit:.1%})" if with_published else ""
        st = pol["sticky"]
        rows.append(f"| {name} ({point.ctx}, kv {point.kv}, {point.conc}/replica) | {pub} "
                    f"| {sum(st['step_seconds']) / len(st['step_seconds']):.0f}, {st['hit_rate']:.1%} "
                    f"| {_ch(pol.get('margin2'))} | {_ch(pol.get('margin4'))} | {_ch(pol.get('least_loaded'))} |")
    return "\n".join(rows) + "\n\n" + _coverage_note(grid)


def main_table(grid: dict[str, Any]) -> str:
    main = _block(grid, "main")
    out = []
    for ctx in sorted({p["ctx"] for p in main}, key=lambda c: OUT_MEDIAN.get(c, 0)):
        rows = [f"**{ctx}**\n", "| KV pool | trajectories / replica | sticky: step s, hit, LRU evictions | "
                + " | ".join(COMPARED) + " |", "|---|---|---|" + "---|" * len(COMPARED)]
        for p in sorted((p for p in main if p["ctx"] == ctx), key=lambda p: (p["kv"] == "all", p["kv_tokens"], p["conc"])):
            st = p["policies"]["sticky"]
            rows.append(f"| {p['kv']} ({p['kv_tokens'] / 1e6:.2f}M) | {p['conc']} "
                        f"| {sum(st['step_seconds']) / len(st['step_seconds']):.0f}, {st['hit_rate']:.0%}, {st['evicted_lru']:.0f} | "
                        + " | ".join(_ch(p["policies"].get(a)) for a in COMPARED) + " |")
        out.append("\n".join(rows))
    return "\n\n".join(out) + "\n\n" + _coverage_note(grid)


def sticky_table(grid: dict[str, Any]) -> str:
    idx = _index(grid)
    rows = ["| point | sticky map | sticky: LRU evictions/step, hit | margin 2 vs sticky | margin 4 | least-loaded |",
            "|---|---|---|---|---|---|"]
    for p in _block(grid, "sticky-table"):
        for lru in (VERL_STICKY_ENTRIES, None):
            q = idx.get((p["ctx"], p["kv"], p["conc"], lru, p["replicas"], p["routers"], p["exchange_s"]))
            if q is None:
                continue
            st = q["policies"]["sticky"]
            size = f"{lru:,} (verl)" if lru else "unbounded"
            rows.append(f"| {p['ctx']}, kv {p['kv']}, {p['conc']}/replica | {size} | {st['evicted_lru']:.0f}, {st['hit_rate']:.1%} "
                        f"| {_ch(q['policies'].get('margin2'))} | {_ch(q['policies'].get('margin4'))} | {_ch(q['policies'].get('least_loaded'))} |")
    return "\n".join(rows)


def scale_table(grid: dict[str, Any]) -> str:
    rows = ["| point | replicas (trajectories/step) | sticky step s | " + " | ".join(SCALE_ARMS) + " |",
            "|---|---|---|" + "---|" * len(SCALE_ARMS)]
    for q in _block(grid, "scale"):
        st = q["policies"]["sticky"]["step_seconds"]
        rows.append(f"| {q['ctx']}, kv {q['kv']}, {q['conc']}/replica | {q['replicas']} ({q['replicas'] * q['conc']:,}) "
                    f"| {sum(st) / len(st):.0f} | " + " | ".join(_ch(q["policies"].get(a)) for a in SCALE_ARMS) + " |")
    return "\n".join(rows)


def routers_table(grid: dict[str, Any]) -> str:
    pts = _block(grid, "routers")
    bases = list(dict.fromkeys(_key(p)[:5] for p in pts))
    rows = ["| point | routers | load exchange | margin 2 vs sticky | share of the 1-router gain | least-loaded vs sticky "
            f"| {RULE} vs sticky | sticky step s |", "|---|---|---|---|---|---|---|---|"]
    for base in bases:
        group = [p for p in pts if _key(p)[:5] == base]
        one = next((p for p in group if p["routers"] == 1), None)
        c1 = one["policies"]["margin2"]["change"] if one and "margin2" in one["policies"] else None
        gain1 = c1["median"] if c1 and _significant(c1) else math.nan  # a share of no gain means nothing
        for p in sorted(group, key=lambda p: (p["exchange_s"] is None, p["routers"])):
            m2 = p["policies"].get("margin2")
            share = m2["change"]["median"] / gain1 if m2 else math.nan
            ex = "—" if p["routers"] == 1 else ("none (own counts only)" if p["exchange_s"] is None else f"every {p['exchange_s'] * 1000:.0f} ms")
            st = p["policies"]["sticky"]["step_seconds"]
            rows.append(f"| {p['ctx']}, kv {p['kv']}, {p['conc']}/replica | {p['routers']} | {ex} | {_ch(m2)} "
                        f"| {'—' if math.isnan(share) else f'{share:.0%}'} | {_ch(p['policies'].get('least_loaded'))} "
                        f"| {_ch(p['policies'].get(RULE))} | {sum(st) / len(st):.0f} |")
    return "\n".join(rows) + "\n\n" + _coverage_note(grid)


def _short(p: dict[str, Any]) -> str:
    """``ctx2k x1 c768``, plus what differs from the main block: the sticky map, replicas, routers."""
    text = f"{p['ctx']} {p['kv']} c{p['conc']}"
    if p["lru"] is None:
        text += " lru=inf"
    if p["replicas"] != 8:
        text += f" R={p['replicas']}"
    if p["routers"] > 1:
        ex = "no exchange" if p["exchange_s"] is None else f"ex {p['exchange_s'] * 1000:.0f} ms"
        text += f" {p['routers']} routers, {ex}"
    return text


def _where(v: criterion.Verdict) -> str:
    sig = ", significant" if v.significant else ""
    return f"{v.excess:+.2%} at {_short(v.point)} (vs {v.best}{sig})"


def criterion_summary(grid: dict[str, Any]) -> str:
    """In-sample, out-of-sample and all points: the worst excess, points within 1%, points beating every peer."""
    rows = [f"| points | n | worst excess of {RULE} over the best baseline | within 1% | misses over 1% with every "
            "step above the best | beats every peer |", "|---|---|---|---|---|---|"]
    names = {"in-sample": "in-sample (its 40 s chosen on steps 0-2 of these)", "out-of-sample": "out-of-sample",
             "all": "all"}
    for name, verdicts in criterion.split(criterion.evaluate(grid)).items():
        s = criterion.summarize(verdicts)
        if not s.points:
            continue
        worst = _where(s.worst) if s.worst else "—"
        rows.append(f"| {names[name]} | {s.points} | {worst} | {s.within}/{s.points} | {s.significant_misses} "
                    f"| {s.beats_peers}/{s.points} |")
    return "\n".join(rows) + (f"\n\nBaselines: {', '.join(criterion.BASELINES)}; peers: {', '.join(PEERS)}. Excess: the "
                              f"median over the {grid['seeds']} paired steps of t_{RULE} / t_best - 1, best = the baseline "
                              "of lowest median change vs sticky at the point.")


def criterion_table(grid: dict[str, Any]) -> str:
    """Per point: the best baseline, the rule, its excess, the peers, and whether it beats them all."""
    verdicts = criterion.evaluate(grid)
    rows = [f"| point | sample | best baseline vs sticky | {RULE} vs sticky | excess over best: median [min, max] | "
            + " | ".join(PEERS) + " | beats every peer |", "|---|---|---|---|---|" + "---|" * len(PEERS) + "---|"]
    for v in verdicts:
        ex = f"{v.excess:+.1%} [{v.excess_low:+.1%}, {v.excess_high:+.1%}]"
        peers = " | ".join(f"**{v.change(a):+.2%}**" if a in v.beaten_by else f"{v.change(a):+.2%}" for a in PEERS)
        rows.append(f"| {_short(v.point)} | {'in' if v.in_sample else 'out'} | {v.best} {v.change(v.best):+.2%} "
                    f"| {v.change(RULE):+.2%} | {ex if v.within else f'**{ex}**'} | {peers} "
                    f"| {'yes' if v.beats_peers else 'no'} |")
    misses = [_miss(v) for v in verdicts if not v.within or not v.beats_peers]
    note = ("Cells: median paired change vs sticky. **Bold** excess: over 1%; **bold** peer: at or below "
            f"{RULE} there.")
    return "\n".join(rows) + "\n\n" + note + ("\n\nWhere it misses (means over the steps: prefix hit rate, share "
                                             "of later turns moved, preemptions per step, in-flight skew):\n\n"
                                             + "\n".join(misses) if misses else "")


def _diag(pol: dict[str, Any]) -> str:
    return (f"hit {pol['hit_rate']:.1%}, moved {pol['moved_share']:.1%}, {pol['preemptions']:.0f} preemptions, "
            f"skew {pol['skew']:.1f}")


def _miss(v: criterion.Verdict) -> str:
    pol = v.point["policies"]
    parts = [f"- {_short(v.point)} ({'in' if v.in_sample else 'out of'} sample): {RULE} {_diag(pol[RULE])}"]
    if not v.within:
        parts.append(f"over 1% ({v.excess:+.1%}) behind {v.best}: {_diag(pol[v.best])}")
    for a in v.beaten_by:
        parts.append(f"{a} {v.change(a):+.1%} against {v.change(RULE):+.1%}: {_diag(pol[a])}")
    return "; ".join(parts)


SECTIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "sources": lambda g: sources_table(),
    "presets": presets_table,
    "grid": main_table,
    "sticky-table": sticky_table,
    "scale": scale_table,
    "routers": routers_table,
    "criterion-summary": criterion_summary,
    "criterion": criterion_table,
}


def markdown(grid: dict[str, Any]) -> str:
    """Every section, headed, for ``--markdown`` and the terminal; a table this grid has no row of says so
    (a small grid such as ``quick`` lacks the points of several)."""
    return "\n\n".join(f"### {name}\n\n{_or_none(fn(grid), grid)}" for name, fn in SECTIONS.items())


def _or_none(body: str, grid: dict[str, Any]) -> str:
    """``body``, or a sentence instead of a table with a header and no row."""
    table = [line for line in body.splitlines() if line.startswith("|")]
    if not table or len(table) > 2:
        return body
    return f"(No point of grid {grid.get('grid', 'this')!r} belongs in this table; the full grid has them.)"


def fill(text: str, sections: dict[str, str]) -> str:
    """Replace each ``<!-- generated:NAME -->...<!-- /generated:NAME -->`` body; every marker must exist."""
    for name, body in sections.items():
        pattern = re.compile(rf"(<!-- generated:{re.escape(name)} -->\n).*?(<!-- /generated:{re.escape(name)} -->)", re.S)
        text, n = pattern.subn(lambda m: m.group(1) + body.rstrip() + "\n" + m.group(2), text)
        if n != 1:
            raise ValueError(f"expected one <!-- generated:{name} --> section, found {n}")
    return text


def sections(grid: dict[str, Any]) -> dict[str, str]:
    return {name: fn(grid) for name, fn in SECTIONS.items()}


README_SECTIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "simulator": presets_table,  # the presets beside the published numbers
    "rule": criterion_summary,  # cost_affinity against issue 13's criterion
}


def readme_sections(grid: dict[str, Any]) -> dict[str, str]:
    return {name: fn(grid) for name, fn in README_SECTIONS.items()}

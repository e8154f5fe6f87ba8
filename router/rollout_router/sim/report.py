"""Markdown tables of a study (the docs' tables are pasted from this output)."""
from __future__ import annotations

from typing import Any

OURS = "ours_margin2"

# Arm labels (``--policies``, the JSON) -> what the tables print
ARM_NAMES = {
    "sticky": "sticky (margin null)", "round_robin": "round robin", "least_loaded": "least loaded (no affinity)",
    "dual_threshold_abs4": "dual threshold, abs 4 (SGLang's gate)",
    "dual_threshold_abs8": "dual threshold, abs 8 (SGLang's gate)", "cache_aware": "cache aware (SGLang)",
    "consistent_hash_c1.25": "consistent hash, bounded loads c=1.25", "power_of_two": "power of two choices",
    "cand_token_load": "margin in tokens (32768)", "cand_context_margin": "margin 2 grown with context",
    "cand_cooldown": "margin 2, 30 s cooldown", "cost_affinity": "cost_affinity",
}


def arm_name(label: str) -> str:
    """What the tables print for an arm label: ``ours_marginN`` (any margin, ``--margins``) is "margin N"."""
    if label.startswith("ours_margin"):
        return f"margin {label.removeprefix('ours_margin')}"
    return ARM_NAMES.get(label, label)


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def reproduced_table(study: dict[str, Any]) -> str:
    rows = ["| preset | approximate context (published / simulated mean final) | baseline prefix hit rate (published / simulated) "
            "| paired steps (published / simulated) | published result | simulated margin=2 vs sticky [order-statistic CI of the median, >=95% or [min, max]], sign p, Wilcoxon p "
            "| prefix reuse with margin=2 |",
            "|---|---|---|---|---|---|---|"]
    for name, pr in study["presets"].items():
        p, pol = pr["preset"], pr["policies"]
        if OURS not in pol or not p["published_ctx"]:
            continue
        ch = pol[OURS]["paired_change_vs_sticky"]
        rows.append(
            f"| {name} | {p['published_ctx']} / {pr['mean_final_context'] / 1000:.1f}K "
            f"| {p['published_hit'] * 100:.1f}% / {pol['sticky']['prefix_hit_rate'] * 100:.1f}% "
            f"| {p['steps']} / {pr['steps']} | {_pct(p['published_change'])}"
            f"{' (' + p['published_note'] + ')' if p['published_note'] else ''} "
            f"| **{_pct(ch['median'])}** [{_pct(ch['ci_low'])}, {_pct(ch['ci_high'])}], p={ch['sign_p']:.2g}, {ch['wilcoxon_p']:.2g} "
            f"| {pol['sticky']['prefix_hit_rate'] * 100:.1f}% -> {pol[OURS]['prefix_hit_rate'] * 100:.1f}% |")
    return "\n".join(rows)


def preset_table(name: str, pr: dict[str, Any]) -> str:
    lb = pr["lower_bound"]
    head = (f"**{name}** — {pr['steps']} paired steps, mean final context {pr['mean_final_context']:.0f} tokens, "
            f"KV pool {pr['preset']['kv_tokens']:,} tokens/replica; lower bound (median) {lb['lb']:.0f} s "
            f"(work {lb['lb_work']:.0f} s, longest trajectory alone {lb['lb_path']:.0f} s)\n\n")
    rows = ["| policy | median step (s) | paired change vs sticky [order-statistic CI] | wins | sign p | Wilcoxon p | prefix hit | re-prefilled tokens/step | preemptions/step | in-flight skew | turns moved | gap to LB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = sorted(pr["policies"].items(), key=lambda kv: kv[1]["median_step_seconds"])
    for label, m in order:
        ch = m["paired_change_vs_sticky"]
        rows.append(
            f"| {arm_name(label)} | {m['median_step_seconds']:.1f} | {_pct(ch['median'])} [{_pct(ch['ci_low'])}, {_pct(ch['ci_high'])}] "
            f"| {ch['wins']}/{ch['n']} | {ch['sign_p']:.2g} | {ch['wilcoxon_p']:.2g} | {m['prefix_hit_rate'] * 100:.1f}% "
            f"| {m['recomputed_tokens_per_step'] / 1e6:.2f}M | {m['preemptions_per_step']:.0f} | {m['inflight_skew']:.2f} "
            f"| {m['moved_share'] * 100:.1f}% | {_pct(m['median_gap_to_lb'])} |")
    return head + "\n".join(rows)


def markdown(study: dict[str, Any]) -> str:
    """The reproduced table (only presets with published numbers have a row), then one table per preset."""
    table = reproduced_table(study)
    parts = (["### Reproduced table\n", table, ""] if table.count("\n") > 1 else
             ["(No reproduced table: none of these presets has published numbers; ctx2k, ctx9k, ctx20k and "
              "ctx9k-bigkv do.)\n"])
    for name, pr in study["presets"].items():
        parts += [preset_table(name, pr), ""]
    return "\n".join(parts)

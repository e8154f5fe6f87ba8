"""The study at the seed's scale (verl grid ``seed``), read from its result cache: tables, the candidate rule's choice
and confirmation, and the advice per regime.

It reads ``benchmarks/results/seed-cache.jsonl`` (what ``make seed-study`` has finished, so a run still going can
be reported as far as it went: a point is shown for an arm once all its paired steps are there) and writes the
``<!-- generated:seed-* -->`` sections of docs/simulator.md and the README's ``seed-advice``:

    .venv/bin/python -m rollout_router.sim.seedreport --docs docs/simulator.md --readme README.md

Cells: the median paired change of step time against verl's sticky balancer, its distribution-free interval (the
order statistics x_(2), x_(9) of 10 steps: 97.9%), the steps it won of those run, and the exact two-sided sign
test's p; **bold** when p < 0.05 (with 10 steps: 9 or 10 the same way).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .cache import ResultCache
from .gridreport import fill
from .stats import summarize
from .verlgrid import BASELINE, CANDIDATES, SEED, SEED_POINT, VERL_GRIDS, VPoint, choose, describe, plan, seed_halves

CACHE = Path("benchmarks/results/seed-cache.jsonl")
ALPHA = 0.05
SETTINGS = {"verl_margin0": "margin 0", "verl_margin2": "margin 2", "verl_margin8": "margin 8"}  # what a user sets
MARK_GAIN, MARK_WORST = -0.10, 0.01  # the study's mark for a rule: 10% faster where the seed gained, never 1% slower


def results(cache: ResultCache, grid: str = "seed") -> tuple[dict[VPoint, dict[str, dict[str, Any]]], int]:
    """Per point and arm, the summary of its paired change (only arms with every step of theirs and the baseline's
    done); and how many steps of the grid are done."""
    spec = VERL_GRIDS[grid]
    steps = spec["seeds"]
    out: dict[VPoint, dict[str, dict[str, Any]]] = {}
    done = 0
    for point, arms in plan(spec["blocks"]).items():
        rows = {arm: [cache.get(describe((point, arm, s, 0))) for s in range(steps)] for arm in arms}
        done += sum(r is not None for runs in rows.values() for r in runs)
        complete = {arm: [r for r in runs if r is not None] for arm, runs in rows.items()}
        base = complete[BASELINE]
        if len(base) < steps:
            continue
        times = [r["step_seconds"] for r in base]
        out[point] = {"_base": {"step": sum(times) / steps, "hit": sum(r["hit_rate"] for r in base) / steps}}
        for arm, runs in complete.items():
            if arm != BASELINE and len(runs) == steps:
                out[point][arm] = summarize([r["step_seconds"] for r in runs], times)
    return out, done


def cell(change: dict[str, Any] | None) -> str:
    if change is None:
        return "—"
    text = (f"{change['median']:+.1%} [{change['ci_low']:+.1%}, {change['ci_high']:+.1%}] "
            f"({change['wins']}/{change['n']}, p={change['sign_p']:.2g})")
    return f"**{text}**" if change["sign_p"] < ALPHA else text


def points_table(found: dict[VPoint, dict[str, dict[str, Any]]]) -> str:
    arms = [a for a in SEED if a != BASELINE]
    rows = ["| point | verl sticky: step, prefix hit | " + " | ".join(arms) + " |", "|" + "---|" * (2 + len(arms))]
    for point, arms_found in found.items():
        base = arms_found["_base"]
        rows.append(f"| {short(point)} | {base['step']:,.0f} s, {base['hit']:.0%} | "
                    + " | ".join(cell(arms_found.get(a)) for a in arms) + " |")
    return "\n".join(rows) + "\n"


def short(point: VPoint) -> str:
    """The point's label without what every seed point shares."""
    return point.label.replace("one-step-off-dapo-7b-tool ", "").replace(" out=1024 p=0.9", "")


def candidates_text(found: dict[VPoint, dict[str, dict[str, Any]]]) -> str:
    points = list(plan(VERL_GRIDS["seed"]["blocks"]))
    choosing, held_out = seed_halves(points)
    if not all(p in found and all(a in found[p] for a in CANDIDATES) for p in points):
        missing = sum(1 for p in points if p not in found or not all(a in found[p] for a in CANDIDATES))
        return f"Not yet: {missing} of {len(points)} points lack a candidate's steps (the choice needs them all).\n"
    changes = {a: [found[p][a]["median"] for p in choosing] for a in CANDIDATES}
    chosen = choose(changes)
    lines = ["| candidate | choosing half: mean, worst | held-out half: mean, worst, best |", "|---|---|---|"]
    for arm in CANDIDATES:
        mine = [found[p][arm]["median"] for p in held_out]
        lines.append(f"| {arm}{' (chosen)' if arm == chosen else ''} | {_mean(changes[arm]):+.1%}, "
                     f"{max(changes[arm]):+.1%} | {_mean(mine):+.1%}, {max(mine):+.1%}, {min(mine):+.1%} |")
    if chosen is None:
        verdict = "No candidate stays within +1% at every choosing point: none is chosen, none ships."
    else:
        held = [found[p][chosen]["median"] for p in held_out]
        margin8 = [found[p]["verl_margin8"]["median"] for p in held_out]
        seed = found[SEED_POINT][chosen]["median"]
        verdict = (f"Chosen: `{chosen}`. Held out, it is never more than 1% slower than verl's sticky balancer "
                   f"(worst {max(held):+.1%}) and at least 10% faster at {sum(1 for v in held if v <= MARK_GAIN)} "
                   f"of {len(held)} points (best {min(held):+.1%}); at the seed's point its change is {seed:+.1%}, short "
                   f"of 10%. Beside the absolute margin 8 on the same held-out points ({_mean(held):+.1%} against "
                   f"{_mean(margin8):+.1%} on average; faster at {sum(1 for a, b in zip(held, margin8) if a < b)} of "
                   f"{len(held)}) " + ("it wins" if _mean(held) < _mean(margin8) - 0.01 else
                                      "it does not win clearly: the plain margin stays the advice, the rule does not "
                                      "ship") + ".")
    return "\n".join(lines) + "\n\n" + verdict + "\n"


def _mean(values: Iterable[float]) -> float:
    v = list(values)
    return sum(v) / len(v)


def advice(found: dict[VPoint, dict[str, dict[str, Any]]]) -> str:
    """Per point: what to set (the setting whose change is significant and lowest, else keep null), with the
    evidence."""
    rows = ["| replicas | trajectories per replica | KV pool (fleet, util) | tool seconds | set | evidence |",
            "|---|---|---|---|---|---|"]
    for point, arms in found.items():
        if not all(a in arms for a in SETTINGS):
            continue
        best = _best(arms)
        worse = [SETTINGS[a] for a in SETTINGS if a in arms and arms[a]["sign_p"] < ALPHA and arms[a]["median"] > 0]
        setting = "`null` (keep)" if best is None else f"`{SETTINGS[best].split()[1]}`"
        evidence = (cell(arms[best]) if best is not None else "no margin is faster in 9 of 10 steps")
        if worse:
            evidence += f"; slower: {', '.join(worse)}"
        rows.append(f"| {point.replicas} | {point.batch} | {point.fleet} (hit {arms['_base']['hit']:.0%}) | "
                    f"{point.latency:g} | {setting} | {evidence} |")
    return "\n".join(rows) + "\n"


def _best(arms: dict[str, dict[str, Any]]) -> str | None:
    """The setting the advice picks at a point: the fastest margin faster in 9 or 10 of 10 steps, else None."""
    return min((a for a in SETTINGS if arms[a]["sign_p"] < ALPHA and arms[a]["median"] < 0),
               key=lambda a: arms[a]["median"], default=None)


def summary(found: dict[VPoint, dict[str, dict[str, Any]]]) -> str:
    """The README's table: the per-point advice grouped by model, fleet size and load per replica."""
    groups: dict[tuple[str, int, int | None], list[dict[str, dict[str, Any]]]] = {}
    for point, arms in found.items():
        if all(a in arms for a in SETTINGS):
            model = "Qwen2.5-32B, TP 4" if point.fleet.startswith("32b") else "Qwen2.5-7B, TP 4 (smaller model)"
            groups.setdefault((model, point.replicas, point.batch), []).append(arms)
    rows = ["| fleet | replicas | trajectories per replica | points | sticky prefix hit | set | its change in step time |",
            "|---|---|---|---|---|---|---|"]
    for (model, replicas, batch), members in groups.items():
        picks = [_best(arms) for arms in members]
        chosen = max(set(picks), key=lambda a: (picks.count(a), a is not None))
        hits = [arms["_base"]["hit"] for arms in members]
        if chosen is None:
            setting, change = "`null`", "no margin surely faster"
        else:
            medians = [arms[chosen]["median"] for arms in members]
            setting = f"`{SETTINGS[chosen].split()[1]}` ({picks.count(chosen)} of {len(members)})"
            change = f"{max(medians):+.1%} … {min(medians):+.1%}" if len(medians) > 1 else f"{medians[0]:+.1%}"
        rows.append(f"| {model} | {replicas} | {batch} | {len(members)} | {min(hits):.0%} … {max(hits):.0%} | "
                    f"{setting} | {change} |")
    return "\n".join(rows) + "\n"


def progress(done: int) -> str:
    spec = VERL_GRIDS["seed"]
    total = sum(len(arms) for arms in plan(spec["blocks"]).values()) * spec["seeds"]
    return f"{done:,} of {total:,} simulated steps done ({done / total:.0%}).\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollout_router.sim.seedreport", description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"the study's result cache (default {CACHE})")
    parser.add_argument("--docs", type=Path, help="rewrite this file's generated seed-* sections")
    parser.add_argument("--readme", type=Path, help="rewrite this file's generated seed-advice section")
    args = parser.parse_args(argv)
    found, done = results(ResultCache(args.cache))
    sections = {"seed-progress": progress(done), "seed-points": points_table(found),
                "seed-candidates": candidates_text(found), "seed-advice": advice(found), "seed-summary": summary(found)}
    for path, names in ((args.docs, tuple(n for n in sections if n != "seed-summary")), (args.readme, ("seed-summary",))):
        if path is not None:
            path.write_text(fill(path.read_text(), {n: sections[n] for n in names}))
    if args.docs is None and args.readme is None:
        for name, text in sections.items():
            print(f"## {name}\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tables of the verl grid (``sim.verlgrid``) and ``rollout-router simulate --verl-grid NAME``.

``verl-points`` lists every point; ``verl-compare`` sets the seed's four published rows (verl PR #7435, as
``workload.PRESETS`` records them) beside the points of the ``pr`` block whose mean final context is
nearest each row's, one per fleet. That choice only picks which rows to show: every point is in
``verl-points``, and no parameter was set from the published numbers.
"""
from __future__ import annotations

import json
from typing import Any

from . import groupreport
from .gridreport import _ch, _coverage_note, fill
from .workload import PRESETS

SHOWN = ("verl_margin0", "verl_margin1", "verl_margin2", "verl_margin4", "verl_margin2_random", "ours_margin2",
         "least_loaded", "cost_affinity")
PUBLISHED = ("ctx2k", "ctx9k", "ctx20k", "ctx9k-bigkv")
FLEET_ORDER = ("7b-tp4-0.8", "7b-tp2-0.5", "32b-tp4-0.8", "32b-tp4-0.9")


def _row(p: dict[str, Any], arms: tuple[str, ...]) -> str:
    base = p["policies"]["verl_sticky"]
    step = sum(base["step_seconds"]) / len(base["step_seconds"])
    cells = [_ch(p["policies"].get(a)) for a in arms]
    return (f"| {p['label']} | {p['context']:,.0f} | {p['turns']:.2f} | {step:,.0f} s, {base['hit_rate']:.1%} | "
            + " | ".join(cells) + " |")


def points_table(grid: dict[str, Any]) -> str:
    head = "| point | final context | turns | verl sticky: step, prefix hit | " + " | ".join(SHOWN) + " |"
    rows = [head, "|" + "---|" * (4 + len(SHOWN))]
    rows += [_row(p, SHOWN) for p in grid["points"]]
    return "\n".join(rows) + "\n\n" + _coverage_note(grid).replace("t_sticky", "t_verl_sticky")


def _nearest(grid: dict[str, Any], ctx: float, fleet: str) -> dict[str, Any] | None:
    pr = set(grid["blocks"].get("pr", []))
    cands = [p for p in grid["points"] if p["label"] in pr and p["fleet"] == fleet]
    return min(cands, key=lambda p: abs(p["context"] - ctx), default=None)


def compare_table(grid: dict[str, Any]) -> str:
    arms = ("verl_margin0", "verl_margin2", "verl_margin4", "least_loaded")
    head = ("| published row (verl PR #7435) | nearest point of the `pr` block | final context | "
            "verl sticky: prefix hit | " + " | ".join(arms) + " |")
    rows = [head, "|" + "---|" * (4 + len(arms))]
    for name in PUBLISHED:
        row = PRESETS[name]
        ctx = float(row.published_ctx.split("K")[0]) * 1000
        fleets = ("7b-tp4-0.8",) if name.endswith("bigkv") else FLEET_ORDER
        for fleet in fleets:
            p = _nearest(grid, ctx, fleet)
            if p is None:
                continue
            cells = " | ".join(_ch(p["policies"].get(a)) for a in arms)
            rows.append(f"| {row.published_ctx}: {row.published_change:+.1%}, hit {row.published_hit:.1%} | "
                        f"{p['fleet']} out={p['out']:g} p={p['tool_p']:g} | {p['context']:,.0f} | "
                        f"{p['policies']['verl_sticky']['hit_rate']:.1%} | {cells} |")
    return "\n".join(rows)


def sections(grid: dict[str, Any]) -> dict[str, str]:
    if grid["verl_grid"] == "group":  # GRPO siblings: its own table and section (sim.groupreport)
        return groupreport.sections(grid)
    return {"verl-points": points_table(grid), "verl-compare": compare_table(grid)}


def markdown(grid: dict[str, Any]) -> str:
    return "\n\n".join(f"### {name}\n\n{body}" for name, body in sections(grid).items())


def run_and_render(args) -> tuple[dict[str, Any], str]:
    """``--verl-grid NAME``: run (``--seeds``, ``--cache``, ``--jobs``), write ``--json-out`` and ``--docs`` (this
    module's generated sections of docs/simulator.md); the grid and its markdown, for the CLI to emit."""
    from .verlgrid import run_verl_grid

    grid = run_verl_grid(args.verl_grid, seeds=args.seeds, seed=args.seed, jobs=max(1, args.jobs),
                         progress=not args.no_progress, cache=args.cache)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(grid, fh, indent=1)
    md = markdown(grid)
    if args.docs:
        with open(args.docs) as fh:
            text = fh.read()
        with open(args.docs, "w") as fh:
            fh.write(fill(text, sections(grid)))
    return grid, md

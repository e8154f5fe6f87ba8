"""Tables of the verl grid (``sim.verlgrid``) and ``rollout-router simulate --verl-grid NAME``.

``verl-points`` lists every point under the margins, ``verl-others`` under the other policies (least-loaded,
``cost_affinity``, the peers); ``verl-compare`` sets the seed's four published rows (verl PR #7435, as
``workload.PRESETS`` records them) beside the points of the ``pr`` blocks whose mean final context is
nearest each row's (and within half of it), one per fleet. That choice only picks which rows to show: every point is in
``verl-points``, and no parameter was set from the published numbers. ``verl-summary`` (the README's) groups
the points by regime, read off each point's own description, not off its results but the baseline's hit rate.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import groupreport
from .grid import PEERS
from .gridreport import _ch, _coverage_note, _significant
from .verl import SINGLE_TURN, VERL_PRESETS
from .verlgrid import ARMS, BASELINE
from .workload import PRESETS

PUBLISHED = ("ctx2k", "ctx9k", "ctx20k", "ctx9k-bigkv")
FLEET_ORDER = ("7b-tp4-0.8", "7b-tp2-0.5", "32b-tp4-0.8", "32b-tp4-0.9")
SUMMARY = (("verl_margin0", "margin 0"), ("verl_margin2", "margin 2"), ("verl_margin4", "margin 4"),
           ("verl_margin8", "margin 8"), ("least_loaded", "least-loaded"), ("cost_affinity", "cost_affinity"))
NEAR = 0.5  # a point stands beside a published row only within half the row's context either way
TIGHT_HIT = 0.5  # a sticky prefix hit rate below this: the KV pool does not hold the step's trajectories


def _present(grid: dict[str, Any], keep: Callable[[str], bool]) -> tuple[str, ...]:
    """The arms ``keep`` selects that the grid ran somewhere, in the arms' order."""
    ran = {a for p in grid["points"] for a in p["policies"]}
    return tuple(a for a in ARMS if a in ran and a != BASELINE and keep(a))


def is_margin(arm: str) -> bool:
    return arm.startswith("verl_margin") and not arm.endswith("_random")


def _row(p: dict[str, Any], arms: tuple[str, ...]) -> str:
    base = p["policies"][BASELINE]
    step = sum(base["step_seconds"]) / len(base["step_seconds"])
    cells = [_ch(p["policies"].get(a)) for a in arms]
    return (f"| {p['label']} | {p['context']:,.0f} | {p['turns']:.2f} | {step:,.0f} s, {base['hit_rate']:.1%} | "
            + " | ".join(cells) + " |")


def _points_table(grid: dict[str, Any], arms: tuple[str, ...]) -> str:
    head = "| point | final context | turns | verl sticky: step, prefix hit | " + " | ".join(arms) + " |"
    rows = [head, "|" + "---|" * (4 + len(arms))]
    rows += [_row(p, arms) for p in grid["points"]]
    return "\n".join(rows) + "\n\n" + _coverage_note(grid).replace("t_sticky", "t_verl_sticky")


def points_table(grid: dict[str, Any]) -> str:
    return _points_table(grid, _present(grid, is_margin))


def others_table(grid: dict[str, Any]) -> str:
    return _points_table(grid, _present(grid, lambda a: not is_margin(a)))


def _nearest(grid: dict[str, Any], ctx: float, fleet: str) -> dict[str, Any] | None:
    pr = {label for name, labels in grid["blocks"].items() if name.startswith("pr") for label in labels}
    cands = [p for p in grid["points"] if p["label"] in pr and p["fleet"] == fleet]
    return min(cands, key=lambda p: abs(p["context"] - ctx), default=None)


def compare_table(grid: dict[str, Any]) -> str:
    arms = ("verl_margin0", "verl_margin2", "verl_margin4", "least_loaded")
    head = ("| published row (verl PR #7435) | nearest point of the `pr` blocks | final context | "
            "verl sticky: prefix hit | " + " | ".join(arms) + " |")
    rows = [head, "|" + "---|" * (4 + len(arms))]
    for name in PUBLISHED:
        row = PRESETS[name]
        ctx = float(row.published_ctx.split("K")[0]) * 1000
        fleets = ("7b-tp4-0.8",) if name.endswith("bigkv") else FLEET_ORDER
        for fleet in fleets:
            p = _nearest(grid, ctx, fleet)
            if p is None or abs(p["context"] - ctx) > NEAR * ctx:
                continue
            cells = " | ".join(_ch(p["policies"].get(a)) for a in arms)
            rows.append(f"| {row.published_ctx}: {row.published_change:+.1%}, hit {row.published_hit:.1%} | "
                        f"{p['fleet']} out={p['out']:g} p={p['tool_p']:g} | {p['context']:,.0f} | "
                        f"{p['policies'][BASELINE]['hit_rate']:.1%} | {cells} |")
    return "\n".join(rows)


def regime(p: dict[str, Any]) -> str:
    """Which kind of fleet and rollout a point is (its loop, its tools, whether sticky's pool holds the step)."""
    if VERL_PRESETS[p["preset"]].agent_loop == SINGLE_TURN:
        return "single_turn_agent (the DAPO recipes)"
    if p["latency"] > 0:
        return f"tool_agent, {p['latency']:g} s tool calls"
    if p["policies"][BASELINE]["hit_rate"] < TIGHT_HIT:
        return f"tool_agent, KV pool short (sticky hit < {TIGHT_HIT:.0%})"
    return f"tool_agent, KV pool holds the step (sticky hit >= {TIGHT_HIT:.0%})"


def _span(changes: list[dict[str, float]]) -> str:
    """The medians' range over the points, bold when every interval excludes 0 on the same side."""
    meds = [c["median"] for c in changes]
    lo, hi = min(meds), max(meds)
    text = f"{lo:+.1%}" if abs(hi - lo) < 5e-4 else f"{lo:+.1%} … {hi:+.1%}"
    same = all(_significant(c) for c in changes) and len({c["median"] > 0 for c in changes}) == 1
    return f"**{text}**" if same else text


def _best_peer(points: list[dict[str, Any]]) -> str:
    best = [min((a for a in PEERS if a in p["policies"]), key=lambda a: p["policies"][a]["change"]["median"],
                default=None) for p in points]
    if None in best:
        return "—"
    names = ", ".join(dict.fromkeys(b for b in best if b is not None))
    return f"{_span([p['policies'][b]['change'] for p, b in zip(points, best)])} ({names})"


def summary_table(grid: dict[str, Any]) -> str:
    """One row per regime: the range of each arm's median change over the regime's points."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in grid["points"]:
        groups.setdefault(regime(p), []).append(p)
    head = ("| verl rollout | points | verl sticky: prefix hit | " + " | ".join(name for _, name in SUMMARY)
            + " | best peer |")
    rows = [head, "|" + "---|" * (4 + len(SUMMARY))]
    for name, pts in groups.items():
        hits = [p["policies"][BASELINE]["hit_rate"] for p in pts]
        cells = [_span([p["policies"][a]["change"] for p in pts]) if all(a in p["policies"] for p in pts) else "—"
                 for a, _ in SUMMARY]
        hit = f"{min(hits):.0%}" if f"{min(hits):.0%}" == f"{max(hits):.0%}" else f"{min(hits):.0%} … {max(hits):.0%}"
        rows.append(f"| {name} | {len(pts)} | {hit} | " + " | ".join(cells)
                    + f" | {_best_peer(pts)} |")
    return "\n".join(rows) + (
        f"\n\nCells: the range over the points of the median change in step time against verl's sticky balancer "
        f"({grid['seeds']} paired steps each; **bold**: at every point the interval excludes 0 on that side); "
        "negative is faster.")


SECTIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "verl-compare": compare_table, "verl-points": points_table, "verl-others": others_table,
    "verl-summary": summary_table}
README_SECTIONS = ("verl-summary",)


def sections(grid: dict[str, Any]) -> dict[str, str]:
    """docs/simulator.md's generated sections (grid ``group``: its own table and section, sim.groupreport)."""
    if grid["verl_grid"] == "group":
        return groupreport.sections(grid)
    return {name: fn(grid) for name, fn in SECTIONS.items()}


def readme_sections(grid: dict[str, Any]) -> dict[str, str]:
    return {name: SECTIONS[name](grid) for name in README_SECTIONS}


def markdown(grid: dict[str, Any]) -> str:
    return "\n\n".join(f"### {name}\n\n{body}" for name, body in sections(grid).items())


def run(args) -> dict[str, Any]:
    """``--verl-grid NAME``: run it (``--seeds``, ``--cache``, ``--jobs``)."""
    from .verlgrid import run_verl_grid

    return run_verl_grid(args.verl_grid, seeds=args.seeds, seed=args.seed, jobs=max(1, args.jobs),
                         progress=not args.no_progress, cache=args.cache)


def is_verl(grid: dict[str, Any]) -> bool:
    """A saved verl grid (``--json-out`` of ``--verl-grid``), not a ``--grid`` one."""
    return "verl_grid" in grid

"""The table of verl grid ``group`` (GRPO siblings placed together): ours with and without the group key.

One row per point and margin: the step-time change of ours against verl's sticky balancer without and with
the group key, each with its prefix-cache hit rate, and the paired change the key itself makes (with / without,
same steps). Filled into docs/simulator.md's ``verl-group`` section by ``simulate --verl-grid group --docs``.
"""
from __future__ import annotations

from typing import Any

from .gridreport import _ch, _coverage_note
from .stats import summarize

MARGINS = (("sticky", "null (sticky)"), ("margin0", "0"), ("margin2", "2"), ("margin4", "4"))


def _cell(pol: dict[str, Any]) -> str:
    return f"{_ch(pol)}, hit {pol['hit_rate']:.1%}"


def _rows(p: dict[str, Any]) -> list[str]:
    pols = p["policies"]
    base = pols["verl_sticky"]
    step = sum(base["step_seconds"]) / len(base["step_seconds"])
    head = f"{p['label']} (verl sticky {step:,.0f} s, hit {base['hit_rate']:.1%})"
    rows = []
    for name, shown in MARGINS:
        plain, grouped = pols.get(f"ours_{name}"), pols.get(f"ours_{name}_group")
        if plain is None or grouped is None:
            continue
        key = _ch({"change": summarize(grouped["step_seconds"], plain["step_seconds"])})
        rows.append(f"| {head} | {shown} | {_cell(plain)} | {_cell(grouped)} | {key} |")
        head = ""
    if "least_loaded" in pols:
        rows.append(f"| | least_loaded | {_cell(pols['least_loaded'])} | — | — |")
    return rows


def group_table(grid: dict[str, Any]) -> str:
    rows = ["| point | margin | ours without the group key | ours with the group key | the key itself (with / without) |",
            "|---|---|---|---|---|"]
    for p in grid["points"]:
        rows += _rows(p)
    return "\n".join(rows) + "\n\n" + _coverage_note(grid).replace("t_sticky", "t_verl_sticky") + (
        " The last column is the paired change t_with_key / t_without_key - 1 over the same steps.")


def sections(grid: dict[str, Any]) -> dict[str, str]:
    return {"verl-group": group_table(grid)}

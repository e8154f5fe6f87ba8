"""PNG plots of a verl grid (``sim.verlgrid``; matplotlib, Agg backend), drawn from its JSON (``--json-out``).

``verl-heatmap.png``: every point (rows) x every arm (columns), the median paired change of step time against
verl's sticky balancer. ``verl-margins.png``: that change against the margin, one line per point, grouped by
regime (``verlreport.regime``), with the order-statistic intervals as error bars.
"""
from __future__ import annotations

import os
from typing import Any

from .plots import fit_title
from .verl import TOOL_AGENT, VERL_PRESETS
from .verlgrid import ARMS, BASELINE
from .verlreport import is_margin, regime

LIMIT = 10.0  # percent: the colour scale's ends (the cells carry the number)
SHORT = {"one-step-off-dapo-7b-tool": "tool", "one-step-off-dapo-7b": "single", "dapo-32b": "dapo-32b single",
         "retool-32b": "retool-32b"}


def short_label(p: dict[str, Any]) -> str:
    """A point's label without the parts every point shares."""
    text = f"{SHORT.get(p['preset'], p['preset'])} {p['fleet']} out={p['out']:g}"
    if VERL_PRESETS[p["preset"]].agent_loop == TOOL_AGENT:
        text += f" p={p['tool_p']:g}"
    if p["latency"]:
        text += f" lat={p['latency']:g}s"
    if p.get("batch"):
        text += f" B={p['batch']}"
    return text + (f" R={p['replicas']}" if p["replicas"] != 4 else "")


def write_verl_plots(grid: dict[str, Any], outdir: str, prefix: str = "verl-") -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(outdir, exist_ok=True)
    return [_heatmap(plt, grid, os.path.join(outdir, f"{prefix}heatmap.png")),
            _margins(plt, grid, os.path.join(outdir, f"{prefix}margins.png"))]


def _heatmap(plt, grid: dict[str, Any], path: str) -> str:
    pts = grid["points"]
    arms = [a for a in ARMS if a != BASELINE and any(a in p["policies"] for p in pts)]
    cells = [[p["policies"][a]["change"]["median"] * 100 if a in p["policies"] else float("nan") for a in arms]
             for p in pts]
    fig, ax = plt.subplots(figsize=(0.75 * len(arms) + 4.5, 0.36 * len(pts) + 2.2), layout="constrained")
    im = ax.imshow(cells, cmap="RdBu_r", vmin=-LIMIT, vmax=LIMIT, aspect="auto")
    for y, p in enumerate(pts):
        for x, a in enumerate(arms):
            if a in p["policies"]:
                c = p["policies"][a]["change"]
                star = "*" if c["ci_low"] > 0 or c["ci_high"] < 0 else ""
                dark = abs(c["median"] * 100) > 0.6 * LIMIT
                ax.text(x, y, f"{c['median'] * 100:+.1f}{star}", ha="center", va="center", fontsize=6,
                        color="white" if dark else "black")
    ax.set_xticks(range(len(arms)), [a.removeprefix("verl_") for a in arms], rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(pts)), [short_label(p) for p in pts], fontsize=7)
    fig.colorbar(im, ax=ax, shrink=0.6, label="% vs verl sticky (blue: faster)")
    fit_title(fig, f"verl grid '{grid['verl_grid']}': median paired change of step time vs verl's sticky balancer, % "
                   f"({grid['seeds']} steps per cell; * the interval excludes 0; colours end at ±{LIMIT:g}%)")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _margins(plt, grid: dict[str, Any], path: str) -> str:
    arms = [a for a in ARMS if is_margin(a) and any(a in p["policies"] for p in grid["points"])]
    xs = [float(a.removeprefix("verl_margin")) for a in arms]
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in grid["points"]:
        groups.setdefault(regime(p), []).append(p)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.6 * len(groups), 3.8), squeeze=False,
                             layout="constrained")
    for ax, (name, pts) in zip(axes[0], groups.items()):
        for k, p in enumerate(pts):
            have = [(x, p["policies"][a]["change"]) for x, a in zip(xs, arms) if a in p["policies"]]
            shift = (k - (len(pts) - 1) / 2) * 0.06  # keep the error bars apart
            med = [c["median"] * 100 for _, c in have]
            err = [[m - c["ci_low"] * 100 for m, (_, c) in zip(med, have)],
                   [c["ci_high"] * 100 - m for m, (_, c) in zip(med, have)]]
            ax.errorbar([x + shift for x, _ in have], med, yerr=err, fmt="-o", capsize=2, lw=1, ms=3,
                        label=short_label(p))
        ax.axhline(0, color="grey", lw=0.6)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.set_xlabel("verl's affinity_break_margin (grey line: sticky)")
        ax.set_title(name, fontsize=8)
        ax.legend(fontsize=6)
    for ax in axes[0]:
        ax.set_ylabel("step time vs verl sticky, %")
    fit_title(fig, f"verl grid '{grid['verl_grid']}': the margin's change in step time, median and interval "
                   f"({grid['seeds']} paired steps per point; below 0: faster than sticky)")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

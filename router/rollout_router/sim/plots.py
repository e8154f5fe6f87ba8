"""PNG plots of a study (matplotlib, Agg backend)."""
from __future__ import annotations

import math
import os
import textwrap
from typing import Any


def write_plots(study: dict[str, Any], outdir: str, prefix: str = "sim-") -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(outdir, exist_ok=True)
    written = []
    for name, pr in study["presets"].items():
        traces = pr.get("load_traces") or {}
        if traces:
            fig, axes = plt.subplots(len(traces), 1, figsize=(9, 2.6 * len(traces)), sharex=True, squeeze=False)
            for ax, (label, trace) in zip(axes[:, 0], sorted(traces.items(), reverse=True)):
                if not trace:
                    continue
                ts = [t for t, _ in trace]
                for r in range(len(trace[0][1])):
                    ax.step(ts, [loads[r] for _, loads in trace], where="post", lw=0.7)
                ax.set_title(f"{name}: in-flight requests per replica over step 0 — {label}", fontsize=9)
                ax.set_ylabel("in flight")
            axes[-1, 0].set_xlabel("simulated seconds")
            fig.tight_layout()
            path = os.path.join(outdir, f"{prefix}load-{name}.png")
            fig.savefig(path, dpi=90)
            plt.close(fig)
            written.append(path)
        pol = pr["policies"]
        labels = sorted(pol, key=lambda k: pol[k]["median_step_seconds"])
        fig, ax = plt.subplots(figsize=(9, 0.35 * len(labels) + 1.2))
        ax.boxplot([pol[k]["step_seconds"] for k in labels], orientation="horizontal", tick_labels=labels)
        ax.axvline(pr["lower_bound"]["lb"], color="k", ls="--", lw=0.8, label="lower bound (median)")
        ax.set_xlabel("generation time per step (simulated s)")
        ax.set_title(f"{name}: step time per policy ({pr['steps']} paired steps)", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        path = os.path.join(outdir, f"{prefix}steps-{name}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def write_grid_plots(grid: dict[str, Any], outdir: str, prefix: str = "grid-") -> list[str]:
    """Heatmaps of each policy's median paired change over KV pool x concurrency (one column per context): the
    margins, least-loaded and cost_affinity in one figure, the peer policies in another; and the margin's change
    against the number of routers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(outdir, exist_ok=True)
    from .grid import PEERS
    from .gridreport import COMPARED

    written = [_heatmaps(plt, grid, COMPARED, os.path.join(outdir, f"{prefix}heatmap.png"))]
    if any(a in p["policies"] for p in grid["points"] for a in PEERS):
        written.append(_heatmaps(plt, grid, PEERS, os.path.join(outdir, f"{prefix}peers-heatmap.png")))
    routed = [p for p in grid["points"] if p["routers"] > 1]
    if routed:
        written.append(_routers_plot(plt, grid, os.path.join(outdir, f"{prefix}routers.png")))
    return written


def _heatmaps(plt, grid: dict[str, Any], compared: tuple[str, ...], path: str) -> str:
    pts = [p for p in grid["points"] if p["routers"] == 1 and p["replicas"] == min(q["replicas"] for q in grid["points"])
           and p["lru"] is not None]
    ctxs = sorted({p["ctx"] for p in pts}, key=lambda c: [q["ctx"] for q in pts].index(c))
    kv_labels = sorted({p["kv"] for p in pts}, key=lambda k: (k == "all", 0.0 if k == "all" else float(k[1:])))
    concs = sorted({p["conc"] for p in pts})
    arms = [a for a in compared if any(a in p["policies"] for p in pts)]
    fig, axes = plt.subplots(len(arms), len(ctxs), figsize=(3.4 * len(ctxs) + 1.4, 2.2 * len(arms) + 0.8),
                             squeeze=False, layout="constrained")
    lim = 20.0  # percent
    for r, arm in enumerate(arms):
        for c, ctx in enumerate(ctxs):
            ax = axes[r, c]
            cells = [[math.nan] * len(kv_labels) for _ in concs]
            for p in pts:
                if p["ctx"] == ctx and arm in p["policies"]:
                    ch = p["policies"][arm]["change"]
                    y, x = concs.index(p["conc"]), kv_labels.index(p["kv"])
                    cells[y][x] = ch["median"] * 100
                    sig = ch["ci_low"] > 0 or ch["ci_high"] < 0
                    ax.text(x, y, f"{ch['median'] * 100:+.1f}{'*' if sig else ''}", ha="center", va="center", fontsize=7)
            im = ax.imshow(cells, cmap="RdBu_r", vmin=-lim, vmax=lim, origin="lower", aspect="auto")
            ax.set_xticks(range(len(kv_labels)), kv_labels, fontsize=7)
            ax.set_yticks(range(len(concs)), [str(c) for c in concs], fontsize=7)
            if r == 0:
                ax.set_title(ctx, fontsize=9)
            if c == 0:
                ax.set_ylabel(f"{arm}\ntraj./replica", fontsize=8)
            if r == len(arms) - 1:
                ax.set_xlabel("KV pool (x physical; all: never evicts)", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.5, label="% vs sticky (blue: faster)")
    fit_title(fig, f"Median paired change of step time vs sticky, % ({grid['seeds']} steps per cell; "
                   "* the interval excludes 0)")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def fit_title(fig, text: str, fontsize: int = 9) -> None:
    """The figure's title, wrapped to its width: a one-column grid (``--grid quick``) is too narrow for one line."""
    per_line = max(20, int(fig.get_figwidth() * 72 / (fontsize * 0.6)))  # about 0.6 em per character
    fig.suptitle(textwrap.fill(text, per_line), fontsize=fontsize)


def _routers_plot(plt, grid: dict[str, Any], path: str) -> str:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for p in grid["points"]:
        groups.setdefault((p["ctx"], p["kv"], p["conc"], p["lru"], p["replicas"]), []).append(p)
    groups = {k: v for k, v in groups.items() if any(p["routers"] > 1 for p in v)}
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.2), squeeze=False)
    for ax, (key, ps) in zip(axes[0], groups.items()):
        series = (("load exchange (periodic)", "b-s", lambda p: p["exchange_s"] is not None),
                  ("own counts only", "r--^", lambda p: p["exchange_s"] is None))
        for label, style, keep in series:
            sel = sorted((p for p in ps if "margin2" in p["policies"] and (p["routers"] == 1 or keep(p))),
                         key=lambda p: p["routers"])
            if len(sel) < 2:
                continue
            xs = [p["routers"] for p in sel]
            ch = [p["policies"]["margin2"]["change"] for p in sel]
            med = [c["median"] * 100 for c in ch]
            err = [[m - c["ci_low"] * 100 for m, c in zip(med, ch)], [c["ci_high"] * 100 - m for m, c in zip(med, ch)]]
            ax.errorbar(xs, med, yerr=err, fmt=style, capsize=3, lw=1, ms=4, label=label)
        ax.axhline(0, color="grey", lw=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
        ax.set_xlabel("routers")
        ax.set_ylabel("margin 2 vs sticky, %")
        ax.set_title(f"{key[0]}, kv {key[1]}, {key[2]}/replica", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

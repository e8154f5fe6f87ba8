"""PNG plots of a study (matplotlib, Agg backend)."""
from __future__ import annotations

import os
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

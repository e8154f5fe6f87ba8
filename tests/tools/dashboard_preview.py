"""Plot the dashboard's main panels from a real Prometheus run, into docs/img/dashboard.png.

    .venv/bin/python tests/tools/dashboard_preview.py [--seconds 36] [--out docs/img/dashboard.png]
    .venv/bin/python tests/tools/dashboard_preview.py --row margin --out docs/img/dashboard-margin.png

``--row margin`` draws the "Is the margin paying?" row instead (docs/observability.md).

Starts three simulated vLLM replicas (one of them half as fast) behind a router with margin 2,
a Prometheus scraping all four every second, drives three phases of multi-session traffic
(light, heavy, light; all on 127.0.0.0/8, bounded), then runs each panel's own PromQL through
/api/v1/query_range and draws it with matplotlib. About a minute on two cores.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tests.tools` importable without shadowing the stdlib
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import PercentFormatter

from rollout_router.localfleet import spawn_replica, spawn_router, stop, wait_healthy
from tests.tools import promfleet

ROOT = Path(__file__).resolve().parents[2]
PANELS = [
    "Affinity kept vs broken", "Break ratio", "Sessions pinned",
    "In-flight requests per replica", "In-flight skew (max - min)", "Ready replicas",
    "Request rate per replica", "Latency quantiles per replica", "Running requests",
    "Waiting requests", "KV-cache usage", "Prefix-cache hit rate",
]
ROWS = {"main": (PANELS, (4, 3), (16, 14), "main panels"),
        "margin": (["Re-prefilled tokens per minute", "Time to first byte: moved vs kept", "Breaks per minute",
                    "Gap at break", "Pin age at break"], (1, 5), (24, 5), 'row "Is the margin paying?"')}


def legend(template: str, metric: dict) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), template)
    return text.replace("http://", "")


def draw(prometheus: promfleet.Prometheus, start: float, end: float, out: Path, note: str, row: str = "main") -> None:
    dashboard = promfleet.load_dashboard()
    by_title = {p["title"]: p for p in promfleet.panels(dashboard)}
    values = promfleet.variable_values(rate_interval="5s")
    titles, shape, size, what = ROWS[row]
    fig, axes = plt.subplots(*shape, figsize=size, constrained_layout=True)
    for ax, title in zip(axes.flat, titles):
        panel = by_title[title]
        for target in panel["targets"]:
            if title == "Latency quantiles per replica" and "0.99" in target["expr"]:
                continue  # p50 and p95 keep the preview readable
            for series in prometheus.query_range(promfleet.substitute(target["expr"], values), start, end, 1.0):
                points = [(float(t) - start, float(v)) for t, v in series["values"] if math.isfinite(float(v))]
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, linewidth=1.2, label=legend(target["legendFormat"], series["metric"]))
        unit = panel["fieldConfig"]["defaults"].get("unit")
        if unit == "percentunit":
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_title(title, fontsize=11)
        ax.set_ylabel({"reqps": "req/s", "s": "seconds", "percentunit": ""}.get(unit, ""))
        ax.set_xlabel("seconds")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"RolloutRouter dashboard, {what}: each panel's PromQL from a real Prometheus run\n{note}", fontsize=12)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=36.0, help="traffic duration, three equal phases")
    parser.add_argument("--margin", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "dashboard.png")
    parser.add_argument("--row", choices=sorted(ROWS), default="main", help="which panels to draw")
    args = parser.parse_args(argv)
    # Replica 0 runs at half speed, so load skews towards it and the margin has work to do.
    starting = [spawn_replica(0, ["--speed", "0.5"]), spawn_replica(1), spawn_replica(2)]
    processes = [s.process for s in starting]  # stopped on exit, even those that never bound
    try:
        replicas = [wait_healthy(s.bound(), "/health") for s in starting]
        router = spawn_router([r.url for r in replicas], ["--affinity-break-margin", str(args.margin)])
        processes.append(router.process)
        router = wait_healthy(router.bound(), "/readyz")
        with promfleet.prometheus(str(router.admin_url), [r.url for r in replicas]) as prometheus:
            phase = args.seconds / 3
            start = time.time()
            for seed, sessions in enumerate((8, 32, 8)):
                traffic = promfleet.drive_traffic(router.url, sessions=sessions, turns=1000, max_tokens=32,
                                                  seconds=phase, think=0.2, errors=2, seed=seed, stagger=phase / 3)
                print(f"phase {seed}: {sessions} sessions, {traffic.ok} requests", flush=True)
            prometheus.wait_scraped_after(time.time() + 2)
            end = time.time()
            status = promfleet.router_status(str(router.admin_url))
            note = (f"3 fake vLLM replicas (one at half speed), margin {args.margin}, sessions 8 -> 32 -> 8; "
                    f"kept {status['affinity_kept']}, broken {status['affinity_broken']}")
            if args.row == "margin":
                margin = status["margin"]
                note += (f"; moved turns re-prefilled {margin['repin_prefill_tokens']} tokens over "
                         f"{margin['repin_prefill_turns']} turns")
            draw(prometheus, start, end, args.out, note, args.row)
    finally:
        for process in reversed(processes):
            stop(process)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

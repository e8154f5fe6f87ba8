"""Draw docs/img/layers.png and docs/img/layers-http.png: the router's layers as pyproject.toml's import-linter
contract states them, and the HTTP proxy's packages as importlinter-http.toml's does.

Each picture is read from the contract that `make lint` checks (``lint-imports``), so it cannot show a
layering the code does not keep. Highest layer on top; a module imports only from its own box's
joined neighbours (":") and from the rows below it. Needs matplotlib (the [sim] extra):

    .venv/bin/python docs/tools/draw_layers.py [-o PNG] [--http-output PNG]
"""
from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "img" / "layers.png"
HTTP_CONFIG = ROOT / "importlinter-http.toml"  # proxy/http's own contract (type-only imports counted)
HTTP_OUT = ROOT / "docs" / "img" / "layers-http.png"

# What each package holds, in a few words (docs/architecture.md says more).
ROLES = {
    "cli": "subcommands", "serve": "flags -> settings", "demo": "make demo", "sim": "fleet simulator",
    "integrations": "verl", "app": "builds & runs it all", "localfleet": "test processes",
    "fakevllm": "simulated replica", "observability": "/metrics, /status", "proxy": "listeners send",
    "fleet": "owners, peers' loads", "health": "ejection, probes",
    "kube": "API client, watch", "discovery": "pods -> replicas", "balancer": "route + lease", "descriptors": "fd limit, caps",
    "addresses": "URL policy", "tallies": "scrape tallies",
    "multicore": "--workers N parent", "multicore_admin": "pod admin, summed",
    "replicas": "replica set, leases", "settings": "one config model", "policy": "pure decisions",
    "listening": "sockets", "core": "hot state (C or Python)", "crossfield": "rules + CEL", "portrule": "port + CEL",
}
HTTP_ROLES = {
    "traffic": "HttpProxy: fast path, coroutine path", "admin_listener": "the admin port",
    "lane": "native lane (C), its glue, the hand-over", "forwarding": "one request on its way, sibling, owner hop",
    "connection": "client connection, upstream pools, relay", "wire": "bytes only: answers, heads, paths, request",
}


def layers(source: Path = ROOT / "pyproject.toml") -> list[tuple[list[str], str]]:
    """The one layers contract of ``source``'s import-linter configuration: its rows, highest first (packages,
    separator)."""
    config = tomllib.loads(source.read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    rows = []
    for row in contract["layers"]:
        separator = ":" if ":" in row else "|"
        rows.append(([name.strip() for name in re.split(r"[:|]", row)], separator))
    return rows


def draw(path: Path, rows: list[tuple[list[str], str]], roles: dict[str, str]) -> None:
    width, height = 10.0, 0.72 * len(rows) + 0.4
    figure, axes = plt.subplots(figsize=(width, height))
    axes.set_xlim(0, width)
    axes.set_ylim(0, height)
    axes.axis("off")
    for index, (names, separator) in enumerate(rows):
        y = height - 0.62 - index * 0.72
        box = (width - 1.0) / len(names)
        for position, name in enumerate(names):
            x = 0.5 + position * box
            joined = separator == ":" and len(names) > 1
            axes.add_patch(FancyBboxPatch((x + 0.06, y), box - 0.12, 0.5, boxstyle="round,pad=0.02",
                                          facecolor="#dbe8f5" if joined else "#eef3e2", edgecolor="#4a5a6a"))
            axes.text(x + box / 2, y + 0.32, name, ha="center", va="center", fontsize=10, weight="bold")
            axes.text(x + box / 2, y + 0.13, roles.get(name, ""), ha="center", va="center", fontsize=7.5)
        if index < len(rows) - 1:
            axes.annotate("", xy=(0.25, y - 0.2), xytext=(0.25, y + 0.5),
                          arrowprops={"arrowstyle": "->", "color": "#888888"})
    axes.text(0.05, 0.05, "imports point down only (blue: packages of one layer that may import each other)",
              fontsize=7.5, color="#555555")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=OUT, help=f"the router's PNG (default {OUT})")
    parser.add_argument("--http-output", type=Path, default=HTTP_OUT, help=f"proxy/http's PNG (default {HTTP_OUT})")
    args = parser.parse_args()
    draw(args.output, layers(), ROLES)
    draw(args.http_output, layers(HTTP_CONFIG), HTTP_ROLES)

"""What each router costs per request: CPU time, not throughput.

Throughput on these shared 2-core machines swings 2-3x between runs; the CPU a proxy spends per request at a
fixed offered load below saturation is steadier. For every arm: utime+stime of the arm's whole process tree
(from /proc/PID/stat) over the measured window, divided by the answers it relayed, plus the p50/p99 the
client saw, added over direct. Two loads, one after the other in each round:

  chat    --rate req/s (2,000) of small chat completions, 32 keep-alive connections, 256 rotating sessions
  SSE     --stream-rate streams/s (500), each 32 events + [DONE] from the replica

Arms: direct (one raw replica), ours (sticky; margin 2; cost_affinity with margin 2; sticky with
`--workers 2`, two processes sharing the sessions, docs/fleet.md "Several cores": a turn entering the worker
that does not own its session asks the owner for the replica, or with "2 entry workers" (`--ownership entry`)
pulls the pin), and the
peers of benchmarks/peer_arms.py (vllm-router, SGLang router, HAProxy, nginx; each skipped with a note when not
installed: `make bench-deps`). Rounds alternate the arms and rotate their order; the table shows the median
and the [min-max] over rounds. Every arm is checked to forward (the replicas answered every session) and
its sessions' spread over the two replicas is shown (0 split sessions = sticky).

The load generator is benchmarks/loadgen (Go, fixed rate, built into .cache/ on first use); "late" counts
requests that found every connection busy (the arm was not keeping up: lower the rate).

    .venv/bin/python benchmarks/proxy_cost.py [--rounds 5] [--seconds 5] [--rate 2000] [--stream-rate 500]
        [--baseline-src OLD/router]   (also ours (sticky), and ours (2 workers) and ours (python data path) when
                                       they run, from an older tree, in the same rounds)
        [--plot docs/img/proxy-cost.png]   (the table as a bar chart, issue 22's targets drawn in)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from peer_arms import PEERS, SESSION_HEADERS, ours, tool
from proxy_overhead import start_ours, start_raw_replica

from rollout_router.localfleet import Service

HERE = Path(__file__).resolve().parent
LOADGEN = HERE.parent / ".cache" / "bench" / "loadgen"
TICK = os.sysconf("SC_CLK_TCK")
EVENTS = 33  # data lines per stream: 32 events + [DONE] (raw_replica.EVENTS)
# The session id is in a header (SESSION_HEADERS) and in "user", which the replica reads when a router
# forwards no custom header (SGLang's router), so every arm's stickiness can be checked at the replicas.
CHAT = '{"model":"tiny","user":"%SESSION%","messages":[{"role":"user","content":"hello"}],"max_tokens":4}'
STREAM = ('{"model":"tiny","user":"%SESSION%","messages":[{"role":"user","content":"hello"}],"max_tokens":32,'
          '"stream":true}')
OURS = {"ours (sticky)": ours(), "ours (python data path)": ours("--data-path", "python"),
        "ours (margin 2)": ours("--affinity-break-margin", "2"),
        "ours (cost_affinity)": ours("--policy", "cost_affinity", "--affinity-break-margin", "2"),
        "ours (2 workers)": ours("--workers", "2"),  # sticky; the CPU of the parent and both workers
        "ours (2 workers; python data path)": ours("--workers", "2", "--data-path", "python"),
        "ours (2 entry workers)": ours("--workers", "2", "--ownership", "entry")}

BASELINE = "ours (sticky, baseline src)"  # --baseline-src: runs whatever --arms says
BASELINE_WORKERS = "ours (2 workers, baseline src)"  # --baseline-src with "ours (2 workers)" among the arms
BASELINE_PYTHON = "ours (python data path, baseline src)"  # --baseline-src with "ours (python data path)" too


def build_loadgen() -> Path:
    """benchmarks/loadgen built with the machine's Go (once; rebuilt when its source is newer)."""
    return build_go("loadgen", LOADGEN, "proxy_cost.py")


def build_go(folder: str, binary: Path, caller: str) -> Path:
    """The Go program in benchmarks/``folder`` built into ``binary`` (once; rebuilt when its source is newer)."""
    source = HERE / folder / "main.go"
    if binary.exists() and binary.stat().st_mtime >= source.stat().st_mtime:
        return binary
    if tool("go") is None:
        sys.exit(f"{caller}: the load generator is a Go program: put the Go toolchain (go) on PATH")
    binary.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=HERE / folder, check=True)
    return binary


def cpu_seconds(root: int) -> float:
    """utime + stime of ``root`` and every descendant process (nginx's worker, a launcher's child)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / TICK
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(times.get(pid, 0.0) for pid in tree)


@dataclass
class Arm:
    name: str
    service: Service
    samples: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {"chat": [], "sse": []})

    @property
    def prefix(self) -> str:
        """This arm's session ids, so the replicas' record of sessions can be split by arm."""
        return "".join(c for c in self.name if c.isalnum()) + "-"


def load(arm: Arm, body: str, rate: int, seconds: float, stream: bool) -> dict[str, float]:
    """One fixed-rate run against ``arm``: the load generator's figures plus the arm's CPU µs per answer."""
    args = [str(LOADGEN), "-url", arm.service.url + "/v1/chat/completions", "-rate", str(rate),
            "-seconds", str(seconds), "-conns", "32", "-sessions", "256", "-body", body,
            "-headers", ",".join(SESSION_HEADERS), "-prefix", arm.prefix, *(["-stream"] if stream else [])]
    before = cpu_seconds(arm.service.process.pid)
    out = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
    spent = cpu_seconds(arm.service.process.pid) - before
    out["cpu_us"] = spent * 1e6 / max(out["ok"], 1)
    return out


def seen(replicas: list[Service]) -> list[set[str]]:
    """The session ids each raw replica has answered (benchmarks/raw_replica.py ``/seen``)."""
    sets = []
    for replica in replicas:
        with urllib.request.urlopen(replica.url + "/seen", timeout=5) as answer:
            sets.append(set(answer.read().decode().split()))
    return sets


def start_arms(backends: list[Service], names: set[str] | None, arms: list[Arm], tree: Path | None) -> list[str]:
    """Every arm that can run here, appended to ``arms`` in table order (so the caller stops those started
    even if a later one fails), and a note for each that cannot run."""
    urls = [b.url for b in backends]
    starters: dict[str, Callable[[list[str]], Service | None]] = {"direct (one replica)": lambda _: backends[0],
                                                                  **OURS, **PEERS}
    baselines = {"direct (one replica)"}
    if tree is not None:
        starters[BASELINE] = lambda urls: start_ours(urls, tree)
        baselines.add(BASELINE)
        if names is None or "ours (2 workers)" in names:
            starters[BASELINE_WORKERS] = lambda urls: start_ours(urls, tree, "--workers", "2")
            baselines.add(BASELINE_WORKERS)
        if names is None or "ours (python data path)" in names:
            starters[BASELINE_PYTHON] = lambda urls: start_ours(urls, tree, "--data-path", "python")
            baselines.add(BASELINE_PYTHON)
    notes = []
    for name, start in starters.items():
        if names is not None and name not in names and name not in baselines:
            continue
        service = start(urls)
        if service is None:
            notes.append(f"{name}: not installed (make bench-deps)")
        else:
            arms.append(Arm(name, service))
    return notes


def measure(arms: list[Arm], args: argparse.Namespace) -> None:
    """Warm every arm up, then ``args.rounds`` rounds of both loads, the arms' order rotating each round."""
    for arm in arms:
        load(arm, CHAT, args.rate // 4, 1, stream=False)
    for index in range(args.rounds):
        order = arms[index % len(arms):] + arms[:index % len(arms)]
        for arm in order:
            arm.samples["chat"].append(load(arm, CHAT, args.rate, args.seconds, stream=False))
            arm.samples["sse"].append(load(arm, STREAM, args.stream_rate, args.seconds, stream=True))
        print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)


def spread(arm: Arm, sets: list[set[str]]) -> str:
    """Sessions answered / expected and how many were answered by both replicas (moved or not sticky)."""
    mine = [{s for s in replica if s.startswith(arm.prefix)} for replica in sets]
    return f"{len(set().union(*mine))}/256, {len(mine[0] & mine[1])} split"


def figure(samples: list[dict[str, float]], key: str, minus: float = 0.0) -> str:
    values = [s[key] - minus for s in samples]
    return f"{statistics.median(values):.0f} [{min(values):.0f}-{max(values):.0f}]"


def median_cpu(arms: list[Arm], name: str, load: str) -> float | None:
    """The named arm's median CPU for one load, or None when that arm did not run."""
    arm = next((a for a in arms if a.name == name), None)
    return statistics.median(s["cpu_us"] for s in arm.samples[load]) if arm else None


def report(arms: list[Arm], sets: list[set[str]], reference: str, stream_reference: str) -> str:
    """The table: CPU per request and per stream with their ranges and ratios, latency added over direct, checks.

    Requests are compared with `reference` and streams with `stream_reference` (issue 22's targets: HAProxy per
    request, nginx per stream)."""
    direct = arms[0].samples
    base = {k: statistics.median(s[k] for s in direct["chat"]) for k in ("p50_ms", "p99_ms")}
    ref_req, ref_sse = median_cpu(arms, reference, "chat"), median_cpu(arms, stream_reference, "sse")
    head = (f"| arm | CPU µs per request | vs {reference.split(' (')[0]} | SSE µs per stream "
            f"| vs {stream_reference.split(' (')[0]} | p50 / p99 added ms | non-2xx, errors, late "
            "| sessions answered, split |")
    lines = [head, "|" + "---|" * 8]
    for arm in arms:
        chat, sse = arm.samples["chat"], arm.samples["sse"]
        req, stream = statistics.median(s["cpu_us"] for s in chat), statistics.median(s["cpu_us"] for s in sse)
        bad = sum(s["non2xx"] + s["errors"] for s in chat + sse)
        late = sum(s["late"] for s in chat + sse)
        short = sum(s["ok"] * EVENTS - s["events"] for s in sse)
        added = (f"{statistics.median(s['p50_ms'] for s in chat) - base['p50_ms']:+.2f} / "
                 f"{statistics.median(s['p99_ms'] for s in chat) - base['p99_ms']:+.2f}")
        relay = arm is not arms[0]  # direct's CPU is the replica's own work, not a relay's
        ratios = (f"{req / ref_req:.2f}x" if relay and ref_req else "-",
                  f"{stream / ref_sse:.2f}x" if relay and ref_sse else "-")
        checks = f"{bad}, late {late}" + (f", {short} events short" if short else "")
        lines.append(f"| {arm.name} | {figure(chat, 'cpu_us')} | {ratios[0]} | {figure(sse, 'cpu_us')} | {ratios[1]} "
                     f"| {added} | {checks} | {spread(arm, sets)} |")
    return "\n".join(lines)


def plot(arms: list[Arm], path: Path, reference: str, stream_reference: str) -> None:
    """The table as a picture: each relay's median CPU per request and per stream, the rounds' range as a whisker,
    beside issue 22's targets (1.3x the request reference, 1.2x the stream reference) as dashed lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    relays = arms[1:]  # direct's CPU is the replica's own work, not a relay's
    fig, panels = plt.subplots(1, 2, figsize=(12, 0.45 * len(relays) + 1.6), sharey=True)
    for panel, load, unit, ref, factor in ((panels[0], "chat", "CPU µs per request", reference, 1.3),
                                           (panels[1], "sse", "CPU µs per SSE stream", stream_reference, 1.2)):
        values = [[s["cpu_us"] for s in arm.samples[load]] for arm in relays]
        medians = [statistics.median(v) for v in values]
        whiskers = [[m - min(v) for m, v in zip(medians, values)], [max(v) - m for m, v in zip(medians, values)]]
        colours = ["tab:blue" if arm.name.startswith("ours") else "tab:gray" for arm in relays]
        panel.barh(range(len(relays)), medians, xerr=whiskers, color=colours, capsize=3)
        target = median_cpu(arms, ref, load)
        if target is not None:
            panel.axvline(target * factor, color="tab:red", ls="--", lw=1,
                          label=f"issue 22's target: {factor}x {ref.split(' (')[0]}")
            panel.legend(fontsize=8, loc="lower right")
        panel.set_xlabel(unit + " (median, whisker: min-max over rounds)")
    panels[0].set_yticks(range(len(relays)), [arm.name for arm in relays], fontsize=8)
    panels[0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def load_options(parser: argparse.ArgumentParser, rounds: int, seconds: float) -> None:
    """The two fixed-rate loads' options (also lane_timed.py's); ``loads_checked`` refuses what is not positive."""
    parser.add_argument("--rounds", type=int, default=rounds, help=f"rounds, arms alternating (default {rounds})")
    parser.add_argument("--seconds", type=float, default=seconds,
                        help=f"seconds per load per arm per round (default {seconds:g})")
    parser.add_argument("--rate", type=int, default=2000, help="chat requests per second offered (default 2000)")
    parser.add_argument("--stream-rate", type=int, default=500, help="SSE streams per second offered (default 500)")


def loads_checked(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The parsed arguments, the loads' options each positive (else one line and exit 2, naming the flag)."""
    args = parser.parse_args()
    for flag, value in (("--rounds", args.rounds), ("--seconds", args.seconds), ("--rate", args.rate),
                        ("--stream-rate", args.stream_rate)):
        if value <= 0:
            parser.error(f"{flag} must be positive, got {value}")
    return args


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    load_options(parser, rounds=5, seconds=5)
    parser.add_argument("--arms", help="comma-separated arm names to run (default: all); direct always runs")
    parser.add_argument("--baseline-src", type=Path, metavar="DIR", help="also run 'ours (sticky)' from this "
                        "source directory (the folder holding an older rollout_router package), side by side")
    parser.add_argument("--reference", default="HAProxy 2.6 (one thread)",
                        help="the arm the per-request ratios are against (default: HAProxy)")
    parser.add_argument("--stream-reference", default="nginx 1.22 (one worker)",
                        help="the arm the per-stream ratios are against (default: nginx)")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also draw the table as a bar chart into PNG")
    args = loads_checked(parser)
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        parser.error(f"--plot {args.plot}: matplotlib is not installed (pip install matplotlib)")
    if args.plot is not None and not args.plot.parent.is_dir():
        parser.error(f"--plot {args.plot}: no directory {args.plot.parent}")
    if args.baseline_src is not None and not (args.baseline_src / "rollout_router" / "__init__.py").is_file():
        parser.error(f"--baseline-src {args.baseline_src}: no rollout_router package in that directory")
    build_loadgen()
    before = os.getloadavg()[0]  # the peers' costs move with what else the machine runs (docs/benchmarks.md)
    backends = [start_raw_replica(f"127.0.0.{20 + i}") for i in range(2)]
    arms: list[Arm] = []
    try:
        notes = start_arms(backends, set(args.arms.split(",")) if args.arms else None, arms, args.baseline_src)
        measure(arms, args)
        print(f"fixed {args.rate} req/s chat and {args.stream_rate} streams/s SSE ({EVENTS} events), "
              f"{args.seconds:g} s each, {args.rounds} rounds, 32 connections, 256 sessions per arm; "
              f"median [min-max] over rounds; load average {before:.1f} before, {os.getloadavg()[0]:.1f} after")
        print(report(arms, seen(backends), args.reference, args.stream_reference))
        if args.plot is not None:
            plot(arms, args.plot, args.reference, args.stream_reference)
            print(f"the chart: {args.plot}")
        for note in notes:
            print(note)
    finally:
        stop(arms[1:], backends)  # arm 0, direct, is a backend
    return 0


def stop(arms: list[Arm], backends: list[Service]) -> None:
    """Stop the routers, then the replicas they forward to."""
    for service in [arm.service for arm in arms] + backends:
        service.stop()


if __name__ == "__main__":
    sys.exit(main())

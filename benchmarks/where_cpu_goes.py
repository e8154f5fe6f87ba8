"""Where a router's CPU goes per request: on-CPU time by shared library (perf), and syscalls (strace).

    .venv/bin/python benchmarks/where_cpu_goes.py [--stream] [--seconds 4] [--syscalls] [--arms A,B]

proxy_cost.py says what each arm costs; this says where, for ours (sticky) beside the lane floor (the router's
own lane with its routing stubbed out) by default, so the difference between the two columns is what the
routing and bookkeeping cost, by library. Each arm gets the load proxy_cost.py offers (2,000 chat requests/s,
or with ``--stream`` 500 SSE streams/s) while ``perf record -F 1999 -p PID`` samples it; every library's share
of the samples times perf's event count (ns on CPU), divided by the answers, is its µs per request. perf's own
overhead is in the figures (a few µs). ``--syscalls`` runs the load again under ``strace -c -f`` and prints
each arm's syscalls per request. Needs perf (and strace) and the permission to attach to a process.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peer_arms import PEERS, tool
from proxy_cost import CHAT, OURS, STREAM, Arm, build_loadgen, load
from proxy_overhead import start_raw_replica

ARMS = {**OURS, **PEERS}
DEFAULT_ARMS = "ours (sticky),lane floor (routing stubbed)"
LIBRARY = re.compile(r"^\s*([\d.]+)%\s+(\S+)", re.M)


def shortened(library: str) -> str:
    """``_lane.cpython-311-x86_64-linux-gnu.so`` -> ``_lane``; ``libpython3.11.so.1.0`` -> ``libpython3.11``."""
    return re.sub(r"(\.cpython-[^ ]*|\.so(\.[\d.]+)?)$", "", library)


def watched(command: list[str], arm: Arm, body: str, rate: int, seconds: float, stream: bool) -> dict[str, float]:
    """``command`` (a profiler attached to the arm) running while the arm takes ``seconds`` of load."""
    profiler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # attaching; the profiler runs a second longer than the load
    result = load(arm, body, rate, seconds, stream)
    _, errors = profiler.communicate()
    if not result.get("ok") or (profiler.returncode != 0 and command[0] == "perf"):
        sys.exit(f"where_cpu_goes.py: {command[0]} failed: {errors.strip()}")
    return result


def by_library(arm: Arm, body: str, rate: int, seconds: float, stream: bool) -> dict[str, float]:
    """µs on CPU per answer, by shared library (the kernel is ``[kernel.kallsyms]``)."""
    with tempfile.TemporaryDirectory() as work:
        data = str(Path(work) / "perf.data")
        out = watched(["perf", "record", "-F", "1999", "-p", str(arm.service.process.pid), "-o", data, "--",
                       "sleep", str(seconds + 1)], arm, body, rate, seconds, stream)
        report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso", "--stdio"],
                                capture_output=True, text=True, check=True).stdout
    events = re.search(r"Event count \(approx\.\): (\d+)", report)
    if events is None or not out.get("ok"):
        sys.exit(f"where_cpu_goes.py: no samples of {arm.name}")
    per_answer = int(events.group(1)) / 1000 / out["ok"]  # cpu-clock events are ns on CPU
    return {shortened(name): float(share) * per_answer / 100 for share, name in LIBRARY.findall(report)}


def syscalls(arm: Arm, body: str, rate: int, seconds: float, stream: bool) -> dict[str, float]:
    """Syscalls per answer, by name (every thread of the arm's process)."""
    with tempfile.TemporaryDirectory() as work:
        counts = Path(work) / "strace.txt"
        out = watched(["timeout", "-s", "INT", str(seconds + 1.5), "strace", "-c", "-f", "-o", str(counts), "-p",
                       str(arm.service.process.pid)], arm, body, rate, seconds, stream)
        text = counts.read_text()
    rows = re.findall(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", text, re.M)
    return {name: int(calls) / max(out.get("ok", 0), 1) for calls, name in rows if name != "total"}


def table(title: str, columns: dict[str, dict[str, float]], digits: int) -> str:
    """One row per library or syscall, one column per arm, the biggest first."""
    names = sorted({k for c in columns.values() for k in c}, key=lambda k: -max(c.get(k, 0) for c in columns.values()))
    lines = [f"| {title} | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name in names:
        if max(c.get(name, 0) for c in columns.values()) >= 10 ** -digits:
            lines.append(f"| {name} | " + " | ".join(f"{c.get(name, 0):.{digits}f}" for c in columns.values()) + " |")
    lines.append("| total | " + " | ".join(f"{sum(c.values()):.{digits}f}" for c in columns.values()) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", action="store_true", help="SSE streams (500/s) instead of chat requests")
    parser.add_argument("--seconds", type=float, default=4, help="seconds of load per arm (default 4)")
    parser.add_argument("--syscalls", action="store_true", help="also count syscalls per answer (strace)")
    parser.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma-separated arms (default: {DEFAULT_ARMS})")
    args = parser.parse_args()
    names = args.arms.split(",")
    if unknown := [n for n in names if n not in ARMS]:
        parser.error(f"--arms: no arm named {unknown[0]!r} (proxy_cost.py's names: {', '.join(ARMS)})")
    if args.seconds <= 0:
        parser.error(f"--seconds must be positive, got {args.seconds}")
    for needed in ["perf"] + (["strace"] if args.syscalls else []):
        if tool(needed) is None:
            parser.error(f"{needed} is not installed")
    build_loadgen()
    body, rate = (STREAM, 500) if args.stream else (CHAT, 2000)
    backends = [start_raw_replica(f"127.0.0.{20 + i}") for i in range(2)]
    arms: list[Arm] = []
    try:
        for name in names:
            service = ARMS[name]([b.url for b in backends])
            if service is None:
                sys.exit(f"where_cpu_goes.py: {name} is not installed (make bench-deps)")
            arms.append(Arm(name, service))
        for arm in arms:
            load(arm, body, rate // 4, 1, args.stream)  # warm up
        unit = "stream" if args.stream else "request"
        print(f"{rate} {unit}s/s for {args.seconds:g} s per arm")
        print(table(f"µs on CPU per {unit} (perf)", {a.name: by_library(a, body, rate, args.seconds, args.stream)
                                                     for a in arms}, 1))
        if args.syscalls:
            print(table(f"syscalls per {unit} (strace)", {a.name: syscalls(a, body, rate, args.seconds, args.stream)
                                                          for a in arms}, 2))
    finally:
        for service in [a.service for a in arms] + backends:
            service.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

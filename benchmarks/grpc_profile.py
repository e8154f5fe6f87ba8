"""Where our gRPC relay's CPU per call goes: grpc_cost.py's load on ``rollout-router serve --grpc-port``, profiled.

Two windows of the same fixed-rate load (paced, or ``--burst``), one profiler each, never both at once:

  perf     ``perf record -F 1999 -g -p PID`` (on-CPU samples): µs per call by shared object (the kernel, libpython,
           uvloop, libc ...) and the top symbols, perf's event count (ns on CPU) over the calls answered
  py-spy   ``py-spy record --gil --nonblocking --format raw`` (Python stacks of the thread holding the GIL, so the
           event loop's waits are left out): each sample put in the first category its stack meets from the leaf
           up (HPACK, frame parsing, frame handling, routing, recording ...; ``CATEGORIES``), scaled to µs per call
           by the router's utime+stime over that window (/proc)

The py-spy figures are the Python side's split of the whole CPU per call (the kernel time of a syscall goes to
the Python function that made it: a socket write to ``flush``); perf's split says how much of it is the kernel
and how much the interpreter. Needs perf and py-spy (``pip install py-spy``) and the permission to attach.

    .venv/bin/python benchmarks/grpc_profile.py [--seconds 8] [--rate 200] [--burst] [--arm-flags "--affinity-break-margin 2"]
"""
from __future__ import annotations

import argparse
import collections
import inspect
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc_cost
from peer_arms import tool
from proxy_cost import cpu_seconds

from rollout_router.proxy.grpc.conn import H2Connection, py_data_received
from rollout_router.proxy.grpc.outbound import H2Output

# (category, pattern on a py-spy frame "function (file:line)"), first match from the leaf up wins
CATEGORIES = [
    ("HPACK decode (pure-Python hpack)", r"\(hpack/"),
    ("health probes (grpcio, every 5 s)", r"\(grpc/|grpc_probe\.py|health/probes\.py"),
    ("recording: metrics, outliers, turns, usage", r"rollout_router/(observability|tallies|decisionlog|usage)\.py|"
                                                  r"prometheus_client|health/outliers\.py|proxy/(turns|decisions)\.py|"
                                                  r"proxy/grpc/usage\.py|metrics"),
    ("routing: key, policy, balancer, leases", r"rollout_router/(balancer|replicas|pinfile)\.py|rollout_router/policy/|"
                                               r"proxy/(session_key|attempts|owner)\.py|rollout_router/fleet/|"
                                               r"^(_keys|_route|_attempt) \("),
    ("frame parsing (split_frames)", r"^(split_frames|unpad) \("),
    ("HPACK encode and frame building (h2.py)", r"proxy/grpc/h2\.py"),
    ("writes: joining the frames, the transport call (flush)", r"^(flush|flush_dirty) \(.*outbound\.py"),
    ("write side: windows, pending, emit", r"proxy/grpc/outbound\.py"),
    ("the call's relay (call.py: heads, DATA, ends)", r"proxy/grpc/call\.py"),
    ("read side: frame dispatch and flow control (conn.py)", r"proxy/grpc/(conn|guard)\.py"),
    ("connections and calls opened (server, upstream, traffic)", r"proxy/grpc/(server|upstream|traffic|rules)\.py"),
    ("asyncio: the call's task, futures", r"asyncio/(tasks|futures|base_events|events)\.py|asyncio/timeouts"),
]


def _line(function: object, text: str) -> int:
    """The line of ``function`` that holds ``text`` (found, not written down: edits move it)."""
    lines, first = inspect.getsourcelines(function)  # type: ignore[arg-type]
    return first + next(i for i, line in enumerate(lines) if text in line)


# uvloop's write(2) from ``H2Output.flush`` (frames written outside a read) ...
SYSCALL_SITE = re.compile(rf"^H2Output\.flush \(.*outbound\.py:{_line(H2Output.flush, 'transport.write(')}\)$")
# ... and where a read is handled: with the compiled frame engine, a sample there is in its C (the DATA relay, the
# windows) or in the socket writes it makes at the read's end, not in the interpreter (the Python it calls back
# into shows as deeper frames); without it, the deeper frames are always there. (With it, a read, a replica's or a
# client's, has no Python frame at all: its samples are the loop's, below.)
ENGINE_SITE = re.compile(rf"^H2Connection\.(data_received \(.*conn\.py:{_line(py_data_received, 'h2.read(')}|"
                         rf"_work \(.*conn\.py:{_line(H2Connection._work, 'h2.read(')})\)$")
LOOP = re.compile(r"^Runner\.run \(")  # the innermost Python frame is the loop itself: uvloop's C (reads, dispatch)
FRAME = re.compile(r"^(.*) (\d+)$")
SYSCALL = "write(2) called from flush"
ENGINE = "the compiled frame engine's C and the socket writes it makes"
KERNEL_ENTRY = re.compile(r"\[k\] (__x64_sys_\w+|ksys_\w+|do_syscall_64|tcp_sendmsg|tcp_recvmsg|sock_\w+_iter|"
                          r"schedule|asm_sysvec_\w+|asm_common_interrupt|net_rx_action|__do_softirq)$")


def by_category(stacks: str) -> tuple[collections.Counter[str], int]:
    """Samples per category from py-spy's raw (collapsed) stacks, and the total. A sample whose innermost frame
    is the socket write is the kernel's (perf counts that CPU, py-spy also the time the process was preempted
    there, which on shared cores is most of it): it is counted as ``SYSCALL``, left out of the user split, as is a
    sample in the compiled frame engine (``ENGINE``: its C, and the socket writes it makes)."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    rules = [(name, re.compile(pattern)) for name, pattern in CATEGORIES]
    for line in stacks.splitlines():
        found = FRAME.match(line.strip())
        if found is None:
            continue
        frames, samples = found.group(1).split(";"), int(found.group(2))
        total += samples
        if SYSCALL_SITE.match(frames[-1]):
            counts[SYSCALL] += samples
            continue
        if ENGINE_SITE.match(frames[-1]):
            counts[ENGINE] += samples
            continue
        if LOOP.match(frames[-1]):
            counts["uvloop's own C (the loop, reads, callbacks), under no Python frame"] += samples
            continue
        for frame in reversed(frames):  # from the leaf up
            name = next((name for name, rule in rules if rule.search(frame)), None)
            if name is not None:
                counts[name] += samples
                break
        else:
            counts["other (" + frames[-1].split(" (")[0] + ")"] += samples
    return counts, total


def window(profiler: list[str], arm: grpc_cost.Arm, replicas: list, args: argparse.Namespace) -> dict[str, float]:
    """The load for ``args.seconds`` with ``profiler`` attached to the arm."""
    process = subprocess.Popen(profiler, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # attaching; the profiler runs longer than the load
    before = cpu_seconds(arm.endpoint.process.pid)
    out = grpc_cost.load(arm, replicas, args, 0 if args.burst else None, args.seconds, args.rate)
    out["router_s"] = cpu_seconds(arm.endpoint.process.pid) - before
    _, errors = process.communicate()
    if not out["ok"] or process.returncode not in (0, None):
        sys.exit(f"grpc_profile.py: {profiler[0]} failed ({process.returncode}): {errors.strip()[-2000:]}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--messages", type=int, default=16)
    parser.add_argument("--interval-ms", type=float, default=10)
    parser.add_argument("--conns", type=int, default=4)
    parser.add_argument("--burst", action="store_true", help="the burst load (all of a call's messages at once)")
    parser.add_argument("--arm-flags", default="", help="more `serve` flags for our arm")
    parser.add_argument("--symbols", type=int, default=25, help="perf's top symbols to print")
    parser.add_argument("--stacks", type=Path, help="also keep py-spy's raw stacks in this file")
    args = parser.parse_args()
    for name in ("perf", "py-spy"):
        if tool(name) is None:
            parser.error(f"{name} is not installed")
    args.request = grpc_cost.request_hex(args.messages)
    grpc_cost.build_grpcload()
    replicas, router = [], None
    try:
        replicas += [grpc_cost.replica(f"127.0.0.{30 + i}", args) for i in range(2)]
        router = grpc_cost.ours(*shlex.split(args.arm_flags))([r.target for r in replicas])
        arm = grpc_cost.Arm("ours", router)
        grpc_cost.load(arm, replicas, args, None, 2, args.rate)  # warm-up
        pid, span = str(router.process.pid), str(int(args.seconds + 3))
        with tempfile.TemporaryDirectory() as work:
            data = str(Path(work) / "perf.data")
            out = window(["perf", "record", "-F", "1999", "-g", "-p", pid, "-o", data, "--", "sleep", span],
                         arm, replicas, args)
            print(f"perf window: {out['ok']} calls, router CPU {out['router_s'] * 1e6 / out['ok']:.0f} µs per call "
                  "(/proc; perf's own overhead included)")
            libraries = report(data, out["ok"], args.symbols)
            raw = str(Path(work) / "stacks.txt")
            out = window([str(tool("py-spy")), "record", "--gil", "--nonblocking", "-r", "500", "-d", span, "-p", pid,
                          "--format", "raw", "-o", raw], arm, replicas, args)
            counts, total = by_category(Path(raw).read_text())
            if args.stacks is not None:
                args.stacks.write_text(Path(raw).read_text())
        python = libraries.get("libpython3.11.so.1.0", 0.0) or next(
            (v for k, v in libraries.items() if k.startswith("libpython")), 0.0)
        kept = {k: v for k, v in counts.items() if k not in (SYSCALL, ENGINE) and not k.startswith("uvloop")}
        kept_total = sum(kept.values())
        print(f"\npy-spy window: {out['ok']} calls, router CPU {out['router_s'] * 1e6 / out['ok']:.0f} µs per call "
              f"(/proc); {total} samples holding the GIL, {counts[SYSCALL]} of them in the socket write's syscall, "
              f"{counts[ENGINE]} in the compiled frame engine (its C and its socket writes) "
              f"and {total - kept_total - counts[SYSCALL] - counts[ENGINE]} in uvloop's C: the other {kept_total} split perf's "
              f"libpython ({python:.0f} µs per call) by where the Python stack was:")
        print("| where (innermost known frame) | share | µs per call | µs per message |\n|---|---|---|---|")
        for name, samples in sorted(kept.items(), key=lambda item: -item[1]):
            share = samples / max(kept_total, 1)
            print(f"| {name} | {share:.1%} | {share * python:.0f} | {share * python / args.messages:.1f} |")
    finally:
        for endpoint in ([router] if router else []) + replicas:
            endpoint.stop()
    return 0


def report(data: str, calls: float, symbols: int) -> dict[str, float]:
    """perf's on-CPU samples as µs per call by shared object, the kernel's by system call (inclusive), then the
    top symbols (self time); returns the µs per call by shared object."""
    libraries: dict[str, float] = {}
    for sort, children, limit in (("dso", False, 12), ("sym", True, 40), ("dso,sym", False, symbols)):
        text = subprocess.run(["perf", "report", "-i", data, "--children" if children else "--no-children",
                               "--sort", sort, "--stdio", "-g", "none", "--percent-limit", "0.3"],
                              capture_output=True, text=True).stdout
        events = re.search(r"Event count \(approx\.\): (\d+)", text)
        if events is None:
            sys.exit("grpc_profile.py: perf recorded no samples")
        per_call = int(events.group(1)) / 1000 / calls  # cpu-clock events are ns on CPU
        if children:  # inclusive time of the kernel's system call entries: what each syscall costs
            rows = [(share, name) for share, _, name in re.findall(r"^\s*([\d.]+)%\s+([\d.]+)%\s+(.+?)\s*$", text, re.M)
                    if KERNEL_ENTRY.search(name)]
            print(f"\nperf, the kernel by system call (inclusive) and interrupts, of {per_call:.0f} µs per call:")
        else:
            rows = re.findall(r"^\s*([\d.]+)%\s+(.+?)\s*$", text, re.M)[:limit]
            print(f"\nperf, by {sort}: {per_call:.0f} µs on CPU per call")
        for share, name in rows:
            micros = float(share) * per_call / 100
            if sort == "dso":
                libraries[name.strip()] = micros
            print(f"  {float(share):5.1f}%  {micros:6.1f} µs  {' '.join(name.split())}")
    return libraries


if __name__ == "__main__":
    sys.exit(main())

"""What each gRPC relay costs per call and per message: CPU time at a fixed rate of vLLM ``Generate`` calls.

proxy_cost.py for gRPC. A fixed ``--rate`` of ``Generate`` calls (server streaming, ``--messages`` messages
each, one of 256 session ids in ``x-session-id`` metadata) over ``--conns`` HTTP/2 connections, from
benchmarks/grpcload (Go, built into .cache/ on first use), to two raw-frame replicas
(benchmarks/grpc_replica.py) through each arm. Two loads, one after the other in each round:

  paced   the replica sends a call's messages one every ``--interval-ms`` (10) ms, as a decode emits tokens:
          each message arrives at a relay in a read of its own
  burst   the replica sends a call's messages all at once, in one write (as raw_replica.py sends an SSE stream)

Arms: direct (one replica; its CPU is the replica's own work, not a relay's), ours (``rollout-router serve
--grpc-port``, sticky; and margin 2), HAProxy 2.6 (``nbthread 1``, h2 to the client and to the replicas,
``balance hdr(x-session-id)`` consistent) and nginx (one worker, ``grpc_pass``, ``hash $http_x_session_id
consistent``, upstream ``keepalive``), each skipped with a note when not installed (``make bench-deps``). For
every arm: utime+stime of its whole process tree (proxy_cost.cpu_seconds) over the measured window, divided by
the calls answered whole (grpc-status 0 and every message), and by the messages. Rounds alternate the arms and
rotate their order; each cell is the median and [min-max] over rounds. Every arm is checked to forward (the
replicas saw each of its 256 sessions) and to stay sticky (how many sessions both replicas saw: 0 is sticky;
margin 2 moves sessions by design).

    .venv/bin/python benchmarks/grpc_cost.py [--rounds 5] [--seconds 4] [--rate 200] [--messages 16]
        [--arms "ours (sticky),HAProxy 2.6 (one thread)"]   (direct always runs)
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from peer_arms import haproxy_config, nginx_config, tool
from proxy_cost import build_go, cpu_seconds, figure

from rollout_router.localfleet import Service, free_port, spawn, wait_healthy

HERE = Path(__file__).resolve().parent
GRPCLOAD = HERE.parent / ".cache" / "bench" / "grpcload"
LOADS = {"paced": None, "burst": 0}  # x-bench-interval-ms per load (None: the replica's --interval-ms)
PROMPT_TOKENS = 512


def build_grpcload() -> Path:
    """benchmarks/grpcload built with the machine's Go (once; rebuilt when its source is newer)."""
    return build_go("grpcload", GRPCLOAD, "grpc_cost.py")


def request_hex(messages: int) -> str:
    """The request every call sends: a tokenized ``GenerateRequest`` of ``PROMPT_TOKENS`` tokens, streaming."""
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb
    return pb.GenerateRequest(request_id="bench", tokenized=pb.TokenizedInput(input_ids=list(range(PROMPT_TOKENS))),
                              sampling_params=pb.SamplingParams(max_tokens=messages), stream=True
                              ).SerializeToString().hex()


@dataclass
class Endpoint:
    """A running arm: where its gRPC listener is, and its process (the tree whose CPU is counted)."""
    target: str
    process: subprocess.Popen
    service: Service | None = None  # ours: stopped as a router (SIGTERM, drain)

    def stop(self) -> None:
        (self.service or Service("", self.process)).stop()


def listening(target: str, process: subprocess.Popen, name: str, timeout: float = 30.0) -> None:
    """Wait until ``target`` accepts a TCP connection (a peer whose listener speaks HTTP/2 only)."""
    host, _, port = target.rpartition(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            errors = process.stderr.read()[-2000:] if process.stderr else ""
            raise RuntimeError(f"{name} exited with {process.returncode}: {errors}")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{name} did not listen on {target} within {timeout}s")


def replica(host: str, args: argparse.Namespace) -> Endpoint:
    port = free_port(host)
    process = subprocess.Popen([sys.executable, str(HERE / "grpc_replica.py"), host, str(port), "--messages",
                                str(args.messages), "--interval-ms", str(args.interval_ms)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    service = wait_healthy(Service(f"http://{host}:{port}", process), "/health")
    return Endpoint(f"{host}:{port}", process, service)


def ours(*extra: str) -> Callable[[list[str]], Endpoint]:
    """``rollout-router serve --grpc-port 0`` in front of the replicas (``grpc://`` backends: gRPC only, probed
    with VllmEngine/HealthCheck every 5 s as by default), with ``extra`` flags."""
    def start(targets: list[str]) -> Endpoint:
        backends = [a for t in targets for a in ("--backend", f"grpc://{t}")]
        router = wait_healthy(spawn(["serve", "--log-level", "warning", "--grpc-port", "0", *backends, *extra],
                                    "127.0.0.1").bound(), "/readyz")
        assert router.grpc_target is not None
        return Endpoint(router.grpc_target, router.process, router)
    return start


def ours_from(source: str) -> Callable[[list[str]], Endpoint]:
    """``ours (sticky)`` run from another checkout's ``router`` folder (``--baseline-src``: the tree before a
    change, ``git archive REV router``), so before and after alternate in one run on the same machine."""
    def start(targets: list[str]) -> Endpoint:
        previous = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = source  # the child imports rollout_router from there (spawn inherits the env)
        try:
            return ours()(targets)
        finally:
            if previous is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = previous
    return start


def _peer(args: list[str], port: int) -> Endpoint:
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    target = f"127.0.0.1:{port}"
    listening(target, process, Path(args[0]).name)
    return Endpoint(target, process)


def haproxy(targets: list[str]) -> Endpoint | None:
    """HAProxy, one thread, HTTP/2 on both sides (``proto h2``), hashing the session metadata consistently."""
    binary = tool("haproxy")
    if binary is None:
        return None
    port = free_port()
    config = haproxy_config(port, [f"{t} proto h2" for t in targets], bind=" proto h2", front="",
                            header="x-session-id")
    return _peer([binary, "-db", "-f", str(config)], port)


def nginx(targets: list[str]) -> Endpoint | None:
    """nginx, one worker, ``grpc_pass`` (Debian's build has ngx_http_grpc_module), hashing the session metadata."""
    binary = tool("nginx")
    if binary is None:
        return None
    port = free_port()
    config = nginx_config(port, targets, listen=" http2", location="      grpc_pass grpc://replicas;")
    return _peer([binary, "-p", str(config.parent), "-c", str(config)], port)


STARTERS: dict[str, Callable[[list[str]], Endpoint | None]] = {
    "ours (sticky)": ours(),
    "ours (margin 2)": ours("--affinity-break-margin", "2"),
    "HAProxy 2.6 (one thread)": haproxy,
    "nginx 1.22 (one worker)": nginx,
}
DIRECT = "direct (one replica)"
BASELINE = "ours (sticky; baseline)"


@dataclass
class Arm:
    name: str
    endpoint: Endpoint
    samples: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {load: [] for load in LOADS})

    @property
    def prefix(self) -> str:
        """This arm's session ids, so the replicas' record of sessions can be split by arm."""
        return "".join(c for c in self.name if c.isalnum()) + "-"


def load(arm: Arm, replicas: list[Endpoint], args: argparse.Namespace, interval: int | None, seconds: float,
         rate: float) -> dict[str, float]:
    """One fixed-rate run against ``arm``: grpcload's figures, plus the CPU µs per call of the arm, of the
    replicas and of the load generator."""
    command = [str(GRPCLOAD), "-target", arm.endpoint.target, "-rate", str(rate), "-seconds", str(seconds),
               "-conns", str(args.conns), "-sessions", "256", "-prefix", arm.prefix, "-messages", str(args.messages),
               "-request", args.request, *(["-interval-ms", str(interval)] if interval is not None else [])]
    pids = [arm.endpoint.process.pid] + [r.process.pid for r in replicas]
    before = [cpu_seconds(pid) for pid in pids]
    out = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    after = [cpu_seconds(pid) for pid in pids]
    calls = max(out["ok"], 1)
    out["cpu_us"] = (after[0] - before[0]) * 1e6 / calls
    out["replicas_us"] = sum(a - b for a, b in zip(after[1:], before[1:])) * 1e6 / calls
    out["loadgen_us"] = out["loadgen_cpu_s"] * 1e6 / calls
    out["msg_us"] = out["cpu_us"] / args.messages
    return out


def measure(arms: list[Arm], replicas: list[Endpoint], args: argparse.Namespace) -> None:
    """Warm every arm up (and check it answers), then ``args.rounds`` rounds of both loads, the arms' order
    rotating each round."""
    for arm in arms:
        warm = load(arm, replicas, args, 0, 1, args.rate / 4)
        if not warm["ok"]:
            sys.exit(f"grpc_cost.py: {arm.name} answered no call: {warm.get('first_failure')}")
    for index in range(args.rounds):
        order = arms[index % len(arms):] + arms[:index % len(arms)]
        for arm in order:
            for name, interval in LOADS.items():
                arm.samples[name].append(load(arm, replicas, args, interval, args.seconds, args.rate))
        print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)


def seen(replicas: list[Endpoint]) -> list[set[str]]:
    """The session ids each replica has answered (grpc_replica.py ``GET /seen``)."""
    sets = []
    for endpoint in replicas:
        with urllib.request.urlopen(f"http://{endpoint.target}/seen", timeout=5) as answer:
            sets.append(set(answer.read().decode().split()))
    return sets


def spread(arm: Arm, sets: list[set[str]]) -> str:
    """Sessions answered / expected and how many both replicas answered (moved, or not sticky)."""
    mine = [{s for s in replica if s.startswith(arm.prefix)} for replica in sets]
    return f"{len(set().union(*mine))}/256, {len(mine[0] & mine[1])} split"


def report(arms: list[Arm], sets: list[set[str]], reference: str) -> str:
    """The table: CPU per call and per message for both loads, with ranges and ratios to ``reference``; the
    latency added over direct; the replicas' CPU per call; the checks."""
    ref = next((a for a in arms if a.name == reference), None)
    refs = {name: statistics.median(s["cpu_us"] for s in ref.samples[name]) if ref else None for name in LOADS}
    direct = arms[0].samples["paced"]
    base = {k: statistics.median(s[k] for s in direct) for k in ("p50_ms", "p99_ms")}
    short = reference.split(" (")[0]
    lines = [f"| arm | paced: CPU µs per call | µs per message | vs {short} | burst: CPU µs per call | µs per message "
             f"| vs {short} | paced p50 / p99 added ms | replicas µs per call | failed, late | sessions answered, split |",
             "|" + "---|" * 11]
    for arm in arms:
        relay = arm is not arms[0]  # direct's CPU is the replica's own work, not a relay's
        cells = []
        for name in LOADS:
            samples = arm.samples[name]
            median = statistics.median(s["cpu_us"] for s in samples)
            reference_cpu = refs[name]
            ratio = f"{median / reference_cpu:.2f}x" if relay and reference_cpu else "-"
            cells += [figure(samples, "cpu_us"), figure(samples, "msg_us") if relay else "-", ratio]
        paced = arm.samples["paced"]
        added = (f"{statistics.median(s['p50_ms'] for s in paced) - base['p50_ms']:+.2f} / "
                 f"{statistics.median(s['p99_ms'] for s in paced) - base['p99_ms']:+.2f}")
        every = [s for name in LOADS for s in arm.samples[name]]
        checks = f"{sum(s['failed'] for s in every)}, late {sum(s['late'] for s in every)}"
        lines.append(f"| {arm.name}{' (replica CPU)' if not relay else ''} | {' | '.join(cells)} | {added} "
                     f"| {figure(paced, 'replicas_us')} | {checks} | {spread(arm, sets)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds, arms alternating (default 5)")
    parser.add_argument("--seconds", type=float, default=4, help="seconds per load per arm per round (default 4)")
    parser.add_argument("--rate", type=float, default=200, help="calls per second offered (default 200)")
    parser.add_argument("--messages", type=int, default=16, help="messages per Generate call (default 16)")
    parser.add_argument("--interval-ms", type=float, default=10, help="the paced load's interval between a call's "
                        "messages (default 10)")
    parser.add_argument("--conns", type=int, default=4, help="HTTP/2 connections from the client (default 4)")
    parser.add_argument("--arms", help="comma-separated arm names to run (default: all); direct always runs")
    parser.add_argument("--reference", default="HAProxy 2.6 (one thread)", help="the arm ratios are against")
    parser.add_argument("--baseline-src", help="another checkout's router folder: adds the arm "
                        f"{BASELINE!r}, ours (sticky) run from it")
    args = parser.parse_args()
    if args.baseline_src:
        STARTERS[BASELINE] = ours_from(str(Path(args.baseline_src).resolve()))
    for flag, value in (("--rounds", args.rounds), ("--seconds", args.seconds), ("--rate", args.rate),
                        ("--messages", args.messages), ("--conns", args.conns)):
        if value <= 0:
            parser.error(f"{flag} must be positive, got {value}")
    names = set(args.arms.split(",")) if args.arms else set(STARTERS)
    if unknown := names - set(STARTERS):
        parser.error(f"--arms: no arm named {', '.join(sorted(unknown))} (arms: {', '.join(STARTERS)})")
    args.request = request_hex(args.messages)
    build_grpcload()
    before = os.getloadavg()[0]
    replicas: list[Endpoint] = []
    arms: list[Arm] = []
    notes = []
    try:
        replicas += [replica(f"127.0.0.{30 + i}", args) for i in range(2)]
        arms.append(Arm(DIRECT, replicas[0]))
        targets = [r.target for r in replicas]
        for name, start in STARTERS.items():
            if name in names:
                endpoint = start(targets)
                if endpoint is None:
                    notes.append(f"{name}: not installed (make bench-deps)")
                else:
                    arms.append(Arm(name, endpoint))
        measure(arms, replicas, args)
        loadgen = statistics.median(s["loadgen_us"] for a in arms for n in LOADS for s in a.samples[n])
        print(f"fixed {args.rate:g} Generate calls/s of {args.messages} messages (paced: one every "
              f"{args.interval_ms:g} ms; burst: all at once), {args.seconds:g} s per load, {args.rounds} rounds, "
              f"{args.conns} HTTP/2 connections, 256 sessions per arm; median [min-max] over rounds; load average "
              f"{before:.1f} before, {os.getloadavg()[0]:.1f} after; the load generator's own CPU {loadgen:.0f} µs "
              "per call (median)")
        print(report(arms, seen(replicas), args.reference))
        for note in notes:
            print(note)
    finally:
        for arm in arms[1:]:  # arm 0, direct, is a replica
            arm.endpoint.stop()
        for endpoint in replicas:
            endpoint.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Proxy overhead: throughput, streaming and latency through each router, side by side with direct.

Arms (same backends, same load, one run):
  direct                       straight to one backend (the ceiling)
  rollout-router               ours, sessions keyed by X-Session-ID
  vllm-router consistent_hash  the Rust peer, sticky on X-Session-Id (if `vllm-router` is installed)

Backends: two raw-protocol replicas (benchmarks/raw_replica.py, asyncio + httptools on uvloop, fast
enough not to be the limit), and with ``--fake-vllm`` also two simulated vLLM replicas
(`rollout-router fake-vllm`).

Loads, every arm in turn, rounds alternating between arms, medians over ``--rounds``:
  throughput   wrk, 1 thread, 32 connections, small chat completions, one of 256 session ids each
  streaming    wrk, the same with "stream": true; the replica sends 32 SSE events + [DONE] per request
  latency      hey at a fixed 1,000 req/s (10 workers x 100/s): p50 and p99

Only ratios within one run mean anything: on 2 shared cores the load generator, the router and the
backends compete for CPU.

    .venv/bin/python benchmarks/proxy_overhead.py [--seconds 8] [--rounds 3] [--fake-vllm] [--baseline-src DIR]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rollout_router.localfleet import Service, command, free_port, spawn, spawn_replica, wait_healthy

HERE = Path(__file__).resolve().parent
EVENTS = 32  # SSE events per streamed request (raw_replica.EVENTS)
CHAT = '{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":4}'
STREAM = '{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":32,"stream":true}'

WRK_SCRIPT = '''
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
request = function()
  wrk.headers["X-Session-ID"] = "session-" .. math.random(256)
  return wrk.format(nil, "/v1/chat/completions")
end
'''


def tool(name: str) -> str | None:
    """A command from PATH or from this interpreter's virtualenv."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def start_raw_replica(host: str) -> Service:
    port = free_port(host)
    process = subprocess.Popen([sys.executable, str(HERE / "raw_replica.py"), host, str(port)],
                               stderr=subprocess.PIPE, text=True)
    return wait_healthy(Service(f"http://{host}:{port}", process), "/health")


def start_ours(backends: list[str], source: Path | None = None, *extra: str) -> Service:
    """``rollout-router serve`` with ``extra`` flags; with ``source``, the package from that directory (an older
    checkout)."""
    args = ["serve", "--log-level", "warning", *[a for u in backends for a in ("--backend", u)], *extra]
    if source is None:
        return wait_healthy(spawn(args, "127.0.0.1").bound(), "/readyz")
    port = free_port()  # an older checkout may not report a port-0 bind
    args += ["--host", "127.0.0.1", "--port", str(port), "--admin-port", "0"]
    env = {**os.environ, "PYTHONPATH": str(source)}
    process = subprocess.Popen(command(*args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return wait_healthy(Service(f"http://127.0.0.1:{port}", process), "/readyz")


def start_vllm_router(backends: list[str]) -> Service:
    port, binary = free_port(), tool("vllm-router")
    assert binary is not None, "vllm-router is not installed"
    args = [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", "consistent_hash",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--worker-urls", *backends]
    service = Service(f"http://127.0.0.1:{port}", subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                                                    stderr=subprocess.PIPE, text=True))
    return wait_healthy(service, "/health", timeout=60)


def _find(pattern: str, text: str, flags: int = 0) -> str:
    """The first group of ``pattern`` in a load tool's output; fails naming what was missing."""
    found = re.search(pattern, text, flags)
    if found is None:
        raise RuntimeError(f"no {pattern!r} in the load tool's output:\n{text[-2000:]}")
    return found.group(1)


def wrk(url: str, script: Path, seconds: int, connections: int = 32) -> dict[str, float]:
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
                         capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": float(_find(r"Requests/sec:\s+([\d.]+)", out)),
            "non2xx": float(errors.group(1)) if errors else 0.0}


def hey(url: str, seconds: int, rate: int = 1000, workers: int = 10, key: str = "s1") -> dict[str, float]:
    """Latency at a fixed request rate (hey paces each worker at rate/workers per second), one session ``key``."""
    out = subprocess.run(["hey", "-z", f"{seconds}s", "-c", str(workers), "-q", str(rate // workers),
                          "-m", "POST", "-T", "application/json", "-H", f"X-Session-ID: {key}", "-d", CHAT,
                          f"{url}/v1/chat/completions"], capture_output=True, text=True, check=True).stdout
    def percentile(p: int) -> float:
        return float(_find(rf"^\s+{p}% in ([\d.]+) secs", out, re.M)) * 1000
    codes = re.findall(r"\[(\d+)\]\s+(\d+) responses", out)
    return {"p50": percentile(50), "p99": percentile(99),
            "rps": float(_find(r"Requests/sec:\s+([\d.]+)", out)),
            "non2xx": float(sum(int(n) for code, n in codes if not code.startswith("2")))}


def run_rounds(arms: dict[str, Service], measure, rounds: int) -> dict[str, dict[str, float]]:
    """``measure(url)`` for every arm, rounds alternating between arms; the median of each figure."""
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, service in arms.items():
            samples[name].append(measure(service.url))
    return {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for name, runs in samples.items()}


def table(title: str, results: dict[str, dict[str, float]], columns: dict[str, str]) -> str:
    """One table; ``columns`` maps a figure to its heading; ratios against direct and vllm-router."""
    names = list(results)
    direct, peer = results[names[0]]["rps"], results.get("vllm-router consistent_hash", {}).get("rps")
    head = f"{title:<30}" + "".join(f"{h:>12}" for h in columns.values()) + f"{'vs direct':>11}{'vs vllm-router':>16}"
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        vs_peer = f"{r['rps'] / peer:>15.2f}x" if peer else f"{'n/a':>16}"
        lines.append(f"{name:<30}" + "".join(f"{r[k]:>12.{0 if k in ('rps', 'eps', 'non2xx') else 2}f}"
                                             for k in columns) + f"{r['rps'] / direct:>10.2f}x{vs_peer}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fake-vllm", action="store_true", help="also measure behind simulated vLLM replicas")
    parser.add_argument("--baseline-src", type=Path, help="also run rollout-router from this source directory "
                        "(the folder holding an older rollout_router package), as a before/after arm")
    args = parser.parse_args()
    for name in ("wrk", "hey"):
        if not shutil.which(name):
            sys.exit(f"{name} is missing: apt-get install -y wrk hey")
    work = Path(tempfile.mkdtemp())
    (work / "chat.lua").write_text(WRK_SCRIPT % CHAT)
    (work / "stream.lua").write_text(WRK_SCRIPT % STREAM)
    services: list[Service] = []
    try:
        backends = [start_raw_replica(f"127.0.0.{20 + i}") for i in range(2)]
        services += backends
        arms = start_arms([b.url for b in backends], backends[0], services, args.baseline_src)
        for service in arms.values():
            wrk(service.url, work / "chat.lua", 2)  # warm-up: pools, JIT-less caches
        chat = run_rounds(arms, lambda url: wrk(url, work / "chat.lua", args.seconds), args.rounds)
        print(table("throughput (raw replicas)", chat, {"rps": "req/s", "non2xx": "non-2xx"}), flush=True)
        stream = run_rounds(arms, lambda url: wrk(url, work / "stream.lua", args.seconds), args.rounds)
        for r in stream.values():
            r["eps"] = r["rps"] * (EVENTS + 1)
        print("\n" + table("SSE streaming (raw replicas)", stream,
                           {"rps": "streams/s", "eps": "events/s", "non2xx": "non-2xx"}), flush=True)
        latency = run_rounds(arms, lambda url: hey(url, args.seconds), args.rounds)
        print("\n" + table("fixed 1,000 req/s", latency,
                           {"rps": "req/s", "p50": "p50 ms", "p99": "p99 ms", "non2xx": "non-2xx"}), flush=True)
        if args.fake_vllm:
            fakes = [wait_healthy(spawn_replica(10 + i).bound(), "/health") for i in range(2)]
            services += fakes
            arms = start_arms([f.url for f in fakes], fakes[0], services, args.baseline_src)
            fake = run_rounds(arms, lambda url: wrk(url, work / "chat.lua", args.seconds), args.rounds)
            print("\n" + table("throughput (fake-vllm)", fake, {"rps": "req/s", "non2xx": "non-2xx"}), flush=True)
    finally:
        for service in services:
            service.stop()
    return 0


def start_arms(urls: list[str], direct: Service, services: list[Service],
               baseline: Path | None) -> dict[str, Service]:
    arms = {"direct (one backend)": direct, "rollout-router": start_ours(urls)}
    services.append(arms["rollout-router"])
    if baseline is not None:
        arms["rollout-router (baseline src)"] = start_ours(urls, baseline)
        services.append(arms["rollout-router (baseline src)"])
    if tool("vllm-router"):
        arms["vllm-router consistent_hash"] = start_vllm_router(urls)
        services.append(arms["vllm-router consistent_hash"])
    return arms


if __name__ == "__main__":
    sys.exit(main())

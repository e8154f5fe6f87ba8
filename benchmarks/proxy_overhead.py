"""Proxy overhead: requests/s and latency through each router, side by side with the baseline.

Arms (same backends, same load, one run):
  direct                     wrk straight to one backend (the ceiling)
  rollout-router margin=2    ours, sessions keyed by X-Session-ID
  vllm-router consistent_hash  a Rust peer, sticky on X-Session-Id (if `vllm-router` is installed)
  vllm-router round_robin    the same peer without affinity

Load: wrk (Debian package `wrk`), 1 thread, 32 connections, small chat completions, each request
carrying one of 256 session ids. Only ratios within one run mean anything: on 2 shared cores the
load generator, the router and the backends compete for CPU.

    .venv/bin/python benchmarks/proxy_overhead.py [--seconds 8] [--connections 32]
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rollout_router.localfleet import Service, free_port, spawn, wait_healthy

BACKEND = '''
import sys, uvloop
from aiohttp import web
BODY = {"id": "x", "object": "chat.completion", "model": "tiny", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
async def chat(request):
    await request.read()
    return web.json_response(BODY)
async def health(request):
    return web.Response(text="ok")
app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
app.router.add_get("/health", health)
web.run_app(app, host=sys.argv[1], port=int(sys.argv[2]), access_log=None, print=None, loop=uvloop.new_event_loop())
'''

WRK_SCRIPT = '''
wrk.method = "POST"
wrk.body = '{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":4}'
wrk.headers["Content-Type"] = "application/json"
request = function()
  wrk.headers["X-Session-ID"] = "session-" .. math.random(256)
  return wrk.format(nil, "/v1/chat/completions")
end
'''


def start_backend(host: str, script: Path) -> Service:
    port = free_port(host)
    service = Service(f"http://{host}:{port}", subprocess.Popen([sys.executable, str(script), host, str(port)],
                                                                 stderr=subprocess.PIPE, text=True))
    return wait_healthy(service, "/health")


def tool(name: str) -> str | None:
    """A command from PATH or from this interpreter's virtualenv."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def start_vllm_router(backends: list[str], policy: str) -> Service:
    port = free_port()
    args = [tool("vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--worker-urls", *backends]
    service = Service(f"http://127.0.0.1:{port}", subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                                                    stderr=subprocess.PIPE, text=True))
    return wait_healthy(service, "/health", timeout=60)


def wrk(url: str, script: Path, seconds: int, connections: int) -> dict[str, float]:
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
                         capture_output=True, text=True, check=True).stdout
    def latency(label: str) -> float:
        value, unit = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50": latency("50%"), "p99": latency("99%"), "non2xx": float(errors.group(1)) if errors else 0.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--backends", type=int, default=2)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is missing: apt-get install wrk")
    work = Path(tempfile.mkdtemp())
    (work / "backend.py").write_text(BACKEND)
    (work / "load.lua").write_text(WRK_SCRIPT)
    services: list[Service] = []
    try:
        backends = [start_backend(f"127.0.0.{20 + i}", work / "backend.py") for i in range(args.backends)]
        services += backends
        urls = [b.url for b in backends]
        arms = {"direct (one backend)": backends[0]}
        port = free_port()
        ours = spawn(["serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                      "--affinity-break-margin", "2", *[a for u in urls for a in ("--backend", u)]],
                     f"http://127.0.0.1:{port}")
        services.append(wait_healthy(ours, "/readyz"))
        arms["rollout-router margin=2"] = ours
        if tool("vllm-router"):
            for policy in ("consistent_hash", "round_robin"):
                peer = start_vllm_router(urls, policy)
                services.append(peer)
                arms[f"vllm-router {policy}"] = peer
        results = {}
        for name, service in arms.items():
            wrk(service.url, work / "load.lua", 2, args.connections)  # warm-up
            results[name] = wrk(service.url, work / "load.lua", args.seconds, args.connections)
    finally:
        for service in services:
            service.stop()
    print(table(results))
    return 0


def table(results: dict[str, dict[str, float]]) -> str:
    direct = next(iter(results.values()))["rps"]
    peer = results.get("vllm-router consistent_hash", {}).get("rps")
    lines = [f"{'arm':<30}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'non-2xx':>9}{'vs direct':>11}{'vs vllm-router ch':>19}"]
    lines.append("-" * len(lines[0]))
    for name, r in results.items():
        vs_peer = f"{r['rps'] / peer:>18.2f}x" if peer else f"{'n/a':>19}"
        lines.append(f"{name:<30}{r['rps']:>9.0f}{r['p50']:>9.2f}{r['p99']:>9.2f}{r['non2xx']:>9.0f}"
                     f"{r['rps'] / direct:>10.2f}x{vs_peer}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

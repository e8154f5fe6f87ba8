"""gRPC passthrough overhead: calls/s and latency, direct to a replica and through `rollout-router --grpc-port`.

The replica is a raw-bytes grpc.aio server (no protobuf work) serving vLLM's ``Generate`` method path as
a server stream of ``--messages`` messages; the client (grpc.aio, its own process) keeps ``--concurrency``
calls in flight, each with one of 256 session ids in ``x-session-id``. Rounds alternate between the arms;
medians. The Python gRPC client and server cost more than the router's relay, so the ratio is the point.
``--baseline-src DIR`` adds an arm running `rollout-router` from another source tree (an older checkout's
``router/`` folder), measured in the same run.

    .venv/bin/python benchmarks/grpc_passthrough.py [--seconds 8] [--rounds 3] [--baseline-src DIR]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollout_router.localfleet import Service, free_port, spawn, wait_healthy

METHOD = "/vllm.grpc.engine.VllmEngine/Generate"


async def serve(host: str, port: int, messages: int) -> None:
    """The replica: every call streams ``messages`` small messages back."""
    import grpc
    from grpc import aio

    async def generate(request: bytes, context):
        for index in range(messages):
            yield b"token-%d" % index

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            return grpc.unary_stream_rpc_method_handler(generate) if details.method == METHOD else None

    server = aio.server()
    server.add_generic_rpc_handlers((Handler(),))
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await server.wait_for_termination()


async def load(target: str, seconds: float, concurrency: int) -> dict[str, float]:
    """Closed-loop calls for ``seconds``: calls/s, p50 and p99 in ms."""
    from grpc import aio
    latencies: list[float] = []
    async with aio.insecure_channel(target) as channel:
        call = channel.unary_stream(METHOD)
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                async for _ in call(b"prompt", metadata=(("x-session-id", f"s{random.randrange(256)}"),)):
                    pass
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    latencies.sort()
    return {"cps": len(latencies) / seconds, "p50": latencies[len(latencies) // 2] * 1e3,
            "p99": latencies[int(len(latencies) * 0.99)] * 1e3}


def start_router(config: str, source: Path | None = None) -> Service:
    """``rollout-router serve --grpc-port 0``; with ``source``, the package from that directory."""
    saved = os.environ.get("PYTHONPATH")
    if source is not None:
        os.environ["PYTHONPATH"] = str(source)
    try:
        router = spawn(["serve", "--grpc-port", "0", "--log-level", "warning", "--config", config], "127.0.0.1").bound()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    assert router.grpc_target is not None
    return wait_healthy(router, "/readyz")


def measure(target: str, seconds: int, concurrency: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--load", target, "--seconds", str(seconds),
                          "--concurrency", str(concurrency)], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--messages", type=int, default=16)
    parser.add_argument("--baseline-src", type=Path, help="also run rollout-router from this source directory")
    parser.add_argument("--serve", nargs=2, metavar=("HOST", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--load", metavar="TARGET", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve[0], int(args.serve[1]), args.messages))
        return 0
    if args.load:
        print(json.dumps(asyncio.run(load(args.load, args.seconds, args.concurrency))))
        return 0
    host, port = "127.0.0.40", free_port("127.0.0.40")
    replica = subprocess.Popen([sys.executable, __file__, "--serve", host, str(port), "--messages", str(args.messages)])
    config = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)  # read by the router process
    with config:  # the replica serves gRPC only, so nothing answers health probes on its HTTP URL
        json.dump({"backends": [{"url": f"http://{host}:{port}", "grpc": f"{host}:{port}"}],
                   "health": {"probeIntervalSeconds": None}}, config)
    routers = {"rollout-router": start_router(config.name)}
    if args.baseline_src is not None:
        routers["rollout-router (baseline)"] = start_router(config.name, args.baseline_src)
    arms = {"direct": f"{host}:{port}", **{name: str(r.grpc_target) for name, r in routers.items()}}
    try:
        for target in arms.values():
            measure(target, 2, args.concurrency)  # warm-up
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, target in arms.items():
                samples[name].append(measure(target, args.seconds, args.concurrency))
    finally:
        for router in routers.values():
            router.stop()
        Service("", replica).stop()
        os.unlink(config.name)
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} after the run, {os.cpu_count()} cores")
    print(f"{'arm':<27}{'calls/s':>10}{'msgs/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'vs direct':>11}")
    direct = statistics.median(s["cps"] for s in samples["direct"])
    for name, runs in samples.items():
        cps, p50, p99 = (statistics.median(s[k] for s in runs) for k in ("cps", "p50", "p99"))
        print(f"{name:<27}{cps:>10.0f}{cps * args.messages:>10.0f}{p50:>9.2f}{p99:>9.2f}{cps / direct:>10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

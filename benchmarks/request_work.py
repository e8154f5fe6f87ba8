"""The router's own work per proxied request, counted rather than timed: calls and memory blocks.

An in-process router (sticky, the default settings) in front of benchmarks/raw_replica.py, one keep-alive
client connection in the same process sending ``--requests`` small chat completions, each with its own
session id cycling over 256 (so they are sticky hits after the first lap). Counted per request:

  python calls   Python functions entered outside the client's own code (this file and asyncio's streams):
                 rollout_router's and the libraries' it calls, prometheus_client's included
  C calls        builtins and C methods called from that code
  blocks         sys.getallocatedblocks() after minus before, over the requests (retained: should be ~0)
  CPU            process time per request over a second, unprofiled pass (router and this client together;
                 the client's share is the same for every tree, so differences are the router's)

The counts are deterministic for a given tree, so two trees compare exactly (``PYTHONPATH=OLD/router``
runs an older checkout's package). CPU time per request is benchmarks/proxy_cost.py's job.

    .venv/bin/python benchmarks/request_work.py [--requests 2000]
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

from proxy_overhead import start_raw_replica

import rollout_router
from rollout_router.app import Runtime
from rollout_router.settings import RouterSettings

PACKAGE = str(Path(rollout_router.__file__).parent)
CLIENT = (__file__, asyncio.streams.__file__)  # the client's side of the exchange, not counted
BODY = b'{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":4}'


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


async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                 b"X-Session-ID: s%d\r\nContent-Length: %d\r\n\r\n%s" % (index % 256, len(BODY), BODY))
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)


async def run(url: str, requests: int) -> tuple[float, float, float, float]:
    settings = RouterSettings(backends=[url])
    runtime = Runtime(settings)
    port = await runtime.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for index in range(512):  # warm: every session pinned, the connections pooled, the caches filled
            await send(reader, writer, index)
        counting = Counting()
        gc.collect()
        gc.disable()
        blocks = sys.getallocatedblocks()
        sys.setprofile(counting)
        for index in range(requests):
            await send(reader, writer, index)
        sys.setprofile(None)
        retained = sys.getallocatedblocks() - blocks
        gc.enable()
        started = time.process_time()
        for index in range(requests):
            await send(reader, writer, index)
        cpu = (time.process_time() - started) * 1e6 / requests
        return counting.python / requests, counting.c / requests, retained / requests, cpu
    finally:
        writer.close()
        await runtime.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests counted (default 2000)")
    args = parser.parse_args()
    if args.requests <= 0:
        parser.error(f"--requests must be positive, got {args.requests}")
    replica = start_raw_replica("127.0.0.21")
    try:
        python, c, blocks, cpu = asyncio.run(run(replica.url, args.requests))
    finally:
        replica.stop()
    print(f"rollout_router from {PACKAGE}, {args.requests} sticky requests on one keep-alive connection")
    print(f"per request: {python:.1f} Python calls, {c:.1f} C calls, {blocks:+.2f} blocks retained, "
          f"{cpu:.0f} µs CPU (router and client)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

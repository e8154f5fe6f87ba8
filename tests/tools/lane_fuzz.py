"""Hostile bytes through the native lane built with AddressSanitizer (run by tests/test_lane_asan.py).

    LD_PRELOAD=libasan.so python tests/tools/lane_fuzz.py BUILT_MODULE [--cases N] [--seed S]

The module is the sanitizers' build of ``_lane.pyx``; it stands in for the lane the router imports. Then: the
request parser over mutated requests (fed whole and a byte at a time: ``read_request_head``), the response parser
over mutated heads, the chunk reader over mutated bodies (a byte at a time), and a router on real sockets whose clients send mutated requests, cut short or whole, and
whose replica answers mutated answers (heads, Content-Length and chunked bodies, trailers, SSE) split at random
points. A read or write out of bounds, a use after free or undefined behaviour aborts the process; the router must
also end with nothing held (budget, leases, answers in progress). Prints one line and exits 0 when all went well.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import random
import sys

REQUESTS = [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Session-ID: s-%d\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    b"GET /v1/models HTTP/1.1\r\nHost: r\r\nConnection: keep-alive\r\n\r\n",
    b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer k \r\nX-Session-ID:s-%d\r\n"
    b"Content-Length: 5\r\n\r\nhello",
]
ANSWERS = [
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}",
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    b"e\r\ndata: {\"a\":1}\r\n\r\n10\r\ndata: [DONE]\n\n\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2;ext=1\r\n{}\r\n0\r\nx-t: 1\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
]
BYTES = b"\r\n \t:;0123456789abcdefABCDEF/%.#?\x00\x7f\x80\xff"


def mutate(data: bytes, rng: random.Random) -> bytes:
    """A few byte-level edits: flips, insertions of protocol bytes, deletions, a cut, a duplication."""
    out = bytearray(data)
    for _ in range(rng.randint(0, 4)):
        if not out:
            break
        at = rng.randrange(len(out))
        edit = rng.randrange(5)
        if edit == 0:
            out[at] = rng.choice(BYTES)
        elif edit == 1:
            out[at:at] = bytes(rng.choice(BYTES) for _ in range(rng.randint(1, 8)))
        elif edit == 2:
            del out[at:at + rng.randint(1, 8)]
        elif edit == 3:
            del out[at:]
        else:
            out[at:at] = out[rng.randrange(len(out)):][:rng.randint(1, 64)]
    return bytes(out)


def pieces(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 4)))) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def parsers(lane, cases: int, rng: random.Random) -> None:
    for index in range(cases):
        request = mutate(rng.choice(REQUESTS).replace(b"%d", b"%d" % index), rng)
        lane.read_request_head(request, (b"x-session-id", b"x-group-id"))
        head, _, body = rng.choice(ANSWERS).partition(b"\r\n\r\n")
        head = mutate(head, rng) + b"\r\n\r\n"
        if head.find(b"\r\n\r\n") == len(head) - 4:
            lane.read_response_head(head)
        lane.read_chunked(mutate(body, rng))


async def router(cases: int, rng: random.Random) -> None:
    from rollout_router.app import Runtime
    from rollout_router.settings import HealthSettings, RouterSettings

    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                for piece in pieces(mutate(rng.choice(ANSWERS), rng) if rng.random() < 0.5 else rng.choice(ANSWERS), rng):
                    writer.write(piece)
                    await writer.drain()
                if rng.random() < 0.1:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(replica, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    runtime = Runtime(RouterSettings(backends=[url], health=HealthSettings(probe_interval_seconds=None),
                                     first_byte_timeout_seconds=1, upstream_timeout_seconds=1), data_path="native")
    port = await runtime.start("127.0.0.1", 0)
    assert runtime.http_proxy.lane is not None, "the sanitizers' lane did not load"

    async def client(index: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for turn in range(rng.randint(1, 4)):
                request = rng.choice(REQUESTS).replace(b"%d", b"%d" % (index * 10 + turn))
                for piece in pieces(mutate(request, rng) if rng.random() < 0.3 else request, rng):
                    writer.write(piece)
                if rng.random() < 0.1:
                    return  # gone before the answer
                await asyncio.wait_for(reader.read(65536), 1)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    for start in range(0, cases, 64):
        await asyncio.gather(*(client(index) for index in range(start, min(cases, start + 64))))
    proxy = runtime.http_proxy
    for _ in range(300):  # the last answers end, or time out at the sweep
        if not proxy.active and not proxy.answering and not proxy.budget.held and not runtime.replicas.total_inflight():
            break
        await asyncio.sleep(0.05)
    held = (len(proxy.active), proxy.answering, proxy.budget.held, runtime.replicas.total_inflight())
    await runtime.stop()
    server.close()
    assert held == (0, 0, 0, 0), f"left held (answers, answering, budget bytes, leases): {held}"
    forwarded = proxy.lane.native.forwarded if proxy.lane is not None else 0
    print(f"lane_fuzz: {cases} router cases, {forwarded} answered on the lane, handovers "
          f"{ {k: v for k, v in proxy.lane.handovers().items() if v} if proxy.lane else {} }")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", help="the built _lane module (a sanitizers' build)")
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=22)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("rollout_router.proxy.http.lane._lane", args.module)
    assert spec is not None and spec.loader is not None
    lane = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = lane
    spec.loader.exec_module(lane)
    logging.basicConfig(level=logging.CRITICAL)  # the broken answers' warnings, by the thousand
    rng = random.Random(args.seed)
    parsers(lane, args.cases * 10, rng)
    import uvloop
    uvloop.run(router(args.cases, rng))


if __name__ == "__main__":
    main()

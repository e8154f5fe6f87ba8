"""The traffic port's native lane (``lane/_lane.pyx``, ``lane/glue.py``): built where it can be, taking the common request,
handing the rest to the Python path on the same connection and taking the connection back, and answering
byte for byte what the Python path answers.

The rest of the suite runs on the lane too (``--data-path auto``, the default); ``make test`` runs the data
path's test modules once more on the Python path alone (``ROLLOUT_ROUTER_DATA_PATH=python``).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import sysconfig

import pytest

from rollout_router.proxy.http import lane
from rollout_router.settings import RouterSettings
from tests.support import NO_PROBES, running_router
from tests.test_http_wire import OK, RawReplica, exchange, post, read_response

ON_LANE = pytest.mark.skipif(lane.unavailable() is not None or os.environ.get("ROLLOUT_ROUTER_DATA_PATH") == "python",
                             reason="the router runs its Python data path here (test_the_lane_is_built_... says why)")


def test_the_lane_is_built_and_as_new_as_its_sources_where_there_is_a_c_compiler():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here: the router runs its Python data path")
    assert lane.unavailable() is None


def counts(runtime) -> dict[str, int]:
    return {reason: count for reason, count in runtime.http_proxy.lane.handovers().items() if count}


@ON_LANE
async def test_the_common_request_is_forwarded_by_the_lane_and_leaves_nothing_held():
    raw = RawReplica(lambda index, connection: OK)
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            answers = await exchange(base, b"".join(post() for _ in range(5)), responses=5)
            proxy = runtime.http_proxy
            assert [code for code, _, _ in answers] == [200] * 5
            assert proxy.lane.native.forwarded == 5 and counts(runtime) == {}
            assert proxy.buffered == 0 and proxy.budget.held == 0 and proxy.answering == 0
            assert runtime.replicas.total_inflight() == 0 and raw.connections == 1
            assert runtime.metrics.status()["affinity_kept"] == 4
            path = runtime.metrics.status()["data_path"]
            assert path["http"] == "native" and path["lane_requests"] == 5 and not any(path["lane_handovers"].values())
            # one session: a new pin (a measured turn: LaneGlue), then four sticky hits routed in C (the replica's
            # kept decision made on the first); the four kept turns' answers are recorded in C
            assert path["lane_sticky"] == {"routed": 4, "recorded": 4}
            [(_, _, body)] = await exchange(runtime.admin_url, b"GET /metrics HTTP/1.1\r\nHost: r\r\n\r\n")
            assert b"rolloutrouter_http_lane_requests_total 5.0" in body
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES), data_path="python") as (_, runtime):
            assert runtime.metrics.status()["data_path"] == {"http": "python"}
    finally:
        await raw.stop()


@ON_LANE
@pytest.mark.parametrize("odd, reason", [
    (b"GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n", "declined"),  # a probe: the Python path answers it
    (b"DELETE /v1/models HTTP/1.1\r\nHost: r\r\n\r\n", "method"),
    (b"GET /v1/models HTTP/1.0\r\nHost: r\r\nConnection: keep-alive\r\n\r\n", "version"),
    (post(extra=b"Keep-Alive: timeout=5\r\n"), "hop_by_hop"),
    (post(path=b"/v1/chat/%63ompletions"), "target"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Session-ID: s\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"3\r\n{}\n\r\n0\r\n\r\n", "hop_by_hop"),
])
async def test_a_request_the_lane_does_not_take_is_answered_on_the_same_connection_which_comes_back(odd, reason):
    """Before and after the odd request, the common one is the lane's: the connection went to the Python path
    for it and came back. (Pipelined behind the odd one, it would be the Python path's: it has read it.)"""
    raw = RawReplica(lambda index, connection: OK)
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            host, port = base.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            codes = []
            for data in (post(), odd, post()):
                writer.write(data)
                codes.append((await asyncio.wait_for(read_response(reader), 10))[0])
            writer.close()
            assert codes[0] == codes[2] == 200 and codes[1] < 500, codes
            assert counts(runtime) == {reason: 1}
            assert runtime.http_proxy.lane.native.forwarded == 2
            assert runtime.http_proxy.budget.held == 0 and runtime.replicas.total_inflight() == 0
    finally:
        await raw.stop()


@ON_LANE
async def test_a_client_whose_every_request_is_odd_stays_on_the_python_path():
    """Handing a connection back and forth costs more than it saves once its requests keep coming odd."""
    raw = RawReplica(lambda index, connection: OK)
    url = await raw.start()
    odd = post(path=b"/v1/chat/%63ompletions")
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            host, port = base.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            for _ in range(8):
                writer.write(odd)
                code, _, _ = await read_response(reader)
                assert code == 200
            writer.close()
            assert counts(runtime) == {"target": 5}  # four times back, then no more
    finally:
        await raw.stop()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


REPLIES = {
    "json": OK,
    "sse": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
           + chunk(b'data: {"a": 1}\n\n') + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n",
    "error": b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
    "no content": b"HTTP/1.1 204 No Content\r\nserver: x\r\n\r\n",
    "interim": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK,
    "trailers": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"{}") + b"0\r\nx-t: 1\r\n\r\n",
    "large": b"HTTP/1.1 200 OK\r\ncontent-length: 2000000\r\n\r\n" + b"x" * 2_000_000,
    "odd spaces": b"HTTP/1.1 200 \r\nX-A:  v \r\nContent-Length:  2 \r\nConnection: keep-alive\r\n\r\n{}",
}
REQUESTS = {
    "chat": post(),
    "models": b"GET /v1/models?x=1 HTTP/1.1\r\nHost: r\r\nAccept: */*\r\n\r\n",
    "spaces": post(extra=b"Authorization:   Bearer k  \r\nX-Stainless-Lang:python\r\nConnection: keep-alive\r\n"),
}


async def raw_answer(reader: asyncio.StreamReader) -> bytes:
    """One answer as it came, 1xx heads before it included."""
    out = b""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        out += head
        if not head.startswith(b"HTTP/1.1 1"):
            break
    lines = head.lower().split(b"\r\n")
    length = next((int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:")), None)
    if length is not None:
        return out + await reader.readexactly(length)
    if b"transfer-encoding: chunked" in lines:
        while size := int(line := await reader.readline(), 16):
            out += line + await reader.readexactly(size + 2)
        return out + line + await reader.readline()
    return out


@ON_LANE
@pytest.mark.parametrize("reply", REPLIES, ids=list(REPLIES))
@pytest.mark.parametrize("request_name", REQUESTS)
async def test_the_lane_answers_and_forwards_byte_for_byte_what_the_python_path_does(reply, request_name):
    raw = RawReplica(lambda index, connection: REPLIES[reply])
    url = await raw.start()
    seen: dict[str, tuple[bytes, list]] = {}
    try:
        for data_path in ("native", "python"):
            raw.seen.clear()
            async with running_router(RouterSettings(backends=[url], health=NO_PROBES), data_path=data_path) \
                    as (base, runtime):
                host, port = base.removeprefix("http://").split(":")
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(REQUESTS[request_name] * 2)  # the second on the pooled connection
                answers = await asyncio.wait_for(raw_answer(reader), 10) + await asyncio.wait_for(raw_answer(reader), 10)
                writer.close()
                seen[data_path] = (answers, list(raw.seen))
                if data_path == "native":
                    assert runtime.http_proxy.lane.native.forwarded == 2 and counts(runtime) == {}
                assert runtime.replicas.total_inflight() == 0 and runtime.http_proxy.budget.held == 0
    finally:
        await raw.stop()
    assert seen["native"][0] == seen["python"][0]  # what the client read
    assert seen["native"][1] == seen["python"][1]  # what the replica read


@ON_LANE
async def test_concurrent_requests_reuse_the_pooled_connections():
    """An empty pool is falsy: the lane once made a new one for every request that found its pool empty, and
    every request under concurrency opened (and leaked) a connection."""
    raw = RawReplica(lambda index, connection: OK)
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            for _ in range(5):
                rounds = await asyncio.gather(*(exchange(base, post() * 3, responses=3) for _ in range(8)))
                assert [code for answers in rounds for code, _, _ in answers] == [200] * 24
            assert runtime.http_proxy.lane.native.forwarded == 120 and raw.connections <= 8
    finally:
        await raw.stop()


@pytest.mark.skipif(lane._lane is None, reason="the lane is not built here (test_the_lane_is_built_... says why)")
def test_the_lane_stops_at_the_python_paths_bounds():
    """The lane's parsers hand over at the bounds the Python path enforces, and its relay holds, keeps and pools as
    much: one number each, compiled into the lane, checked against the Python constants here."""
    from rollout_router.proxy.http.connection import client as server
    from rollout_router.proxy.http.connection import relay
    from rollout_router.proxy.http.connection import upstream as pools
    from rollout_router.proxy.turns import TAIL_BYTES
    assert lane._lane.BOUNDS == {"MAX_HEAD": server.MAX_HEAD, "MAX_HEADERS": server.MAX_HEADERS,
                                 "MAX_RESPONSE_HEAD": relay.MAX_RESPONSE_HEAD,
                                 "MAX_RESPONSE_FIELDS": relay.MAX_RESPONSE_FIELDS, "BUFFER_LIMIT": relay.BUFFER_LIMIT,
                                 "TAIL_BYTES": TAIL_BYTES, "DONE_TAIL": relay.DONE_TAIL, "POOL_SIZE": pools.POOL_SIZE}


@ON_LANE
@pytest.mark.parametrize("partial", [b"\r\r\n\r\n", b"POST /v1/chat/%63ompletions HTTP/1.1\r\nHost: r\r\n", b""])
async def test_a_head_handed_over_unfinished_keeps_its_clock(partial):
    """The head's clock started in the lane (at its first byte, or at the connect): the Python path answers 408
    when it has not ended within headerTimeoutSeconds of then (it once never did: the clock stayed behind)."""
    raw = RawReplica(lambda index, connection: OK)
    url = await raw.start()
    try:
        settings = RouterSettings(backends=[url], health=NO_PROBES, header_timeout_seconds=1)
        async with running_router(settings) as (base, runtime):
            host, port = base.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(partial)
            code, _, _ = await asyncio.wait_for(read_response(reader), 10)
            writer.close()
            assert code == 408 and raw.requests == 0
    finally:
        await raw.stop()

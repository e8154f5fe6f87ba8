"""The HTTP data path on the wire: strict parsing, pipelining, HEAD, 1xx, pooled connections, back-pressure.

Clients here write raw bytes on real sockets, so the tests control framing
exactly; replicas are small asyncio servers that misbehave on purpose.
"""
from __future__ import annotations

import asyncio
import json
import socket
from types import SimpleNamespace

import pytest

from rollout_router.proxy.http.connection.client import MAX_HEAD, WRITE_HIGH_WATER
from rollout_router.proxy.http.connection.relay import STREAMING, Exchange
from rollout_router.settings import RouterSettings
from tests.support import NO_PROBES, ScriptedReplica, running_router, wait_for

CHAT = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'


def post(body: bytes = CHAT, extra: bytes = b"", path: bytes = b"/v1/chat/completions") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nX-Session-ID: s\r\n%s"
            b"Content-Length: %d\r\n\r\n%s" % (path, extra, len(body), body))


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response off a raw connection: status, headers (lower-cased), body (Content-Length or chunked)."""
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    headers = {}
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int((await reader.readline()).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readline()
        await reader.readline()
        return status, headers, body
    return status, headers, b""


async def exchange(base: str, data: bytes, responses: int = 1) -> list[tuple[int, dict[str, str], bytes]]:
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    try:
        return [await read_response(reader) for _ in range(responses)]
    finally:
        writer.close()


@pytest.fixture
async def replica():
    started = await ScriptedReplica("127.0.0.10").start()
    yield started
    await started.stop()


@pytest.mark.parametrize("case, data, status, words", [
    ("cl_and_te", b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"3\r\nabc\r\n0\r\n\r\n", 400, "Transfer-Encoding"),
    ("two_lengths", b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
     400, "Content-Length"),
    ("bad_chunk_size", b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
     400, "chunk size"),
    ("chunk_overrun", b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n",
     400, "malformed"),
    ("gzip_te", b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
     400, "only chunked"),
    ("bad_header", b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nBad Header: x\r\nContent-Length: 0\r\n\r\n", 400, "malformed"),
    ("huge_head", b"POST /v1/chat/completions HTTP/1.1\r\nX-Big: " + b"a" * (MAX_HEAD + 10), 431, "head exceeds"),
    # RFC 9112: Host exactly once in HTTP/1.1 (3.2), only HTTP/1.x here, and an Upgrade the router does not do
    # must not cost the body (issue 21, finding 8: the replica got Content-Length: 0 and the client a 200)
    ("no_host", b"GET /v1/models HTTP/1.1\r\n\r\n", 400, "exactly one Host header, not 0"),
    ("two_hosts", b"GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "exactly one Host header, not 2"),
    ("http2_line", b"GET /v1/models HTTP/2.0\r\nHost: r\r\n\r\n", 505, "HTTP/2.0 is not supported"),
    ("upgrade_with_body", b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(CHAT), CHAT),
     400, "Connection: Upgrade is refused"),
])
async def test_bad_framing_gets_json_error_and_reaches_no_replica(replica, case, data, status, words):
    async with running_router(RouterSettings(backends=[replica.url])) as (base, runtime):
        [(code, headers, body)] = await exchange(base, data)
        error = json.loads(body)["error"]
        assert code == status == error["code"] and words in error["message"], error
        assert headers["connection"] == "close"
        assert not replica.seen and runtime.replicas.total_inflight() == 0
        [(code, _, _)] = await exchange(base, post())
        assert code == 200  # the router goes on


async def test_an_upgrade_without_a_body_is_answered_and_the_connection_closed(replica):
    """``curl --http2 http://...`` asks for h2c this way. Upgrades are not offered: the request is answered over
    HTTP/1.1, saying the connection closes, and it does (it used to stay open, never read again)."""
    async with running_router(RouterSettings(backends=[replica.url])) as (base, runtime):
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: r\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                         b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
            code, headers, _ = await asyncio.wait_for(read_response(reader), 10)
            assert code == 200 and headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the router
        finally:
            writer.close()
        assert runtime.replicas.total_inflight() == 0


async def test_pipelined_requests_are_answered_in_order(replica):
    async with running_router(RouterSettings(backends=[replica.url])) as (base, runtime):
        models = b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n"
        answers = await exchange(base, post() + models + post(b'{"model":"tiny","n":2}') + models, responses=4)
    assert [code for code, _, _ in answers] == [200] * 4
    kinds = [json.loads(body)["object"] for _, _, body in answers]
    assert kinds == ["chat.completion", "list", "chat.completion", "list"]
    assert [seen["body"] for seen in replica.seen] == [json.loads(CHAT), {"model": "tiny", "n": 2}]


async def test_an_http10_client_gets_no_chunked_framing_and_needs_no_host(replica):
    """HTTP/1.0 has no chunked coding: a streamed answer is delimited by the close, even on keep-alive."""
    async with running_router(RouterSettings(backends=[replica.url])) as (base, _):
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = b'{"model":"tiny","stream":true,"messages":[]}'
        writer.write(b"POST /v1/chat/completions HTTP/1.0\r\nConnection: keep-alive\r\nX-Session-ID: s\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        head, _, rest = (await reader.read(-1)).partition(b"\r\n\r\n")  # to the close
        writer.close()
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding" not in head, head
    assert b"Connection: close" in head and rest.rstrip().endswith(b"data: [DONE]"), rest


async def test_head_gets_the_head_only_and_the_connection_goes_on(replica):
    async with running_router(RouterSettings(backends=[replica.url])) as (base, _):
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HEAD /v1/models HTTP/1.1\r\nHost: r\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: " in head
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n")  # no body bytes of the HEAD may precede this
        code, _, body = await read_response(reader)
        writer.close()
    assert code == 200 and json.loads(body)["object"] == "list"


class RawReplica:
    """A replica that speaks raw bytes: ``answer(request_index, connection_index)`` returns what to send."""

    def __init__(self, answer):
        self.answer, self.requests, self.connections = answer, 0, 0
        self.seen: list[tuple[bytes, bytes]] = []  # (head, body) of every request, as received
        self.server: asyncio.AbstractServer | None = None

    async def start(self, host: str = "127.0.0.30") -> str:
        self.server = await asyncio.start_server(self._serve, host, 0)
        return f"http://{host}:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection, self.connections = self.connections, self.connections + 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.seen.append((head, await reader.readexactly(length)))
                index, self.requests = self.requests, self.requests + 1
                reply = self.answer(index, connection)
                if reply is None:
                    break  # close without answering
                writer.write(reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"


async def test_interim_responses_are_relayed_and_expect_continue_answered():
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
    raw = RawReplica(lambda index, connection: early + OK)
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url])) as (base, _):
            host, port = base.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nExpect: 100-continue\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(CHAT))
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(CHAT)
            interim = await reader.readuntil(b"\r\n\r\n")
            assert interim.startswith(b"HTTP/1.1 103") and b"Link: </a.css>" in interim
            code, headers, body = await read_response(reader)
            writer.close()
    finally:
        await raw.stop()
    assert code == 200 and body == b'{"ok":true}' and headers["x-rolloutrouter-replica"] == url


async def test_stale_pooled_connection_is_retried_once_on_a_fresh_one():
    answered: set[int] = set()

    def first_per_connection(index: int, connection: int) -> bytes | None:
        """Every connection answers its first request and drops the next one unanswered."""
        if connection in answered:
            return None
        answered.add(connection)
        return OK

    raw = RawReplica(first_per_connection)
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            first = await exchange(base, post())
            second = await exchange(base, post())  # the pooled connection is dropped: retried on a new one
        assert [code for code, _, _ in first + second] == [200, 200]
        assert raw.connections == 2 and raw.requests == 3
        assert runtime.replicas.total_inflight() == 0
    finally:
        await raw.stop()


async def test_stale_retry_happens_only_once():
    raw = RawReplica(lambda index, connection: OK if index == 0 else None)  # only the very first is answered
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            await exchange(base, post())
            [(code, _, body)] = await exchange(base, post())
        assert code == 502 and "closed the connection" in json.loads(body)["error"]["message"]
        assert raw.connections == 2 and raw.requests == 3  # the reused one, then one fresh one, no more
        assert runtime.replicas.total_inflight() == 0
    finally:
        await raw.stop()


@pytest.mark.parametrize("extra", [b"garbage!", b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n"],
                         ids=["junk", "a second head"])
async def test_bytes_after_an_answer_in_the_same_read_keep_its_connection_out_of_the_pool(extra):
    """Parsed after the answer ended, they would be taken for the next request's answer (a 502 counted against a
    replica that answered it, or the bytes of an answer nobody asked for)."""
    raw = RawReplica(lambda index, connection: OK + extra if index == 0 else OK)  # one write: one read, mostly
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            answers = await exchange(base, post()) + await exchange(base, post())
            assert [(code, body) for code, _, body in answers] == [(200, b'{"ok":true}')] * 2
            assert raw.connections == 2  # the first one was closed, not pooled
            [replica] = runtime.replicas.replicas()
            assert replica.failures == 0 and runtime.replicas.total_inflight() == 0
    finally:
        await raw.stop()


@pytest.mark.parametrize("answer, words", [
    (b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", "101"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 101 + b"Content-Length: 11\r\n\r\n{\"ok\":true}", "header fields"),
    (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 200_000, "response head over 65536 bytes"),
], ids=["101", "too-many-fields", "head-never-ends"])
async def test_a_response_head_the_router_cannot_relay_is_a_502(answer, words):
    raw = RawReplica(lambda index, connection: answer)
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            [(code, _, body)] = await exchange(base, post())
            assert code == 502 and words in json.loads(body)["error"]["message"], body
            assert runtime.replicas.total_inflight() == 0 and not runtime.http_proxy.active
    finally:
        await raw.stop()


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = b"data: {}\n\n"


@pytest.mark.parametrize("trailers", [
    b"X-T: " + b"a" * 200_000,  # one field that never ends (llhttp holds it, calling nobody)
    (b"X-T: " + b"a" * 100 + b"\r\n") * 2_000,  # fields for ever (each was kept with the head's fields)
], ids=["a-field-never-ends", "fields-without-end"])
async def test_a_replicas_trailers_are_bounded_as_its_head_is(trailers):
    """After the last chunk, more than the head's bound ends the stream with an error event; nothing held."""
    raw = RawReplica(lambda index, connection: SSE_HEAD + b"%x\r\n%s\r\n0\r\n" % (len(EVENT), EVENT) + trailers)
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            [(code, _, body)] = await exchange(base, post())
            assert code == 200 and body.startswith(EVENT), body
            assert b"after its body's last bytes (trailers)" in body, body
            assert runtime.replicas.total_inflight() == 0 and not runtime.http_proxy.active
    finally:
        await raw.stop()


async def test_silent_replica_times_out_by_the_sweep(replica):
    replica.hold = asyncio.Event()
    settings = RouterSettings(backends=[replica.url], first_byte_timeout_seconds=0.5)
    async with running_router(settings) as (base, runtime):
        [(code, headers, body)] = await exchange(base, post())
        assert code == 504 and "did not answer in time" in json.loads(body)["error"]["message"]
        assert headers["x-rolloutrouter-replica"] == replica.url
        await wait_for(lambda: replica.cancelled == 1)  # the replica learns at once
        assert runtime.replicas.total_inflight() == 0


async def test_a_replica_trickling_its_head_is_timed_out_too():
    """firstByteTimeoutSeconds bounds the whole head: a header line every 0.1 s must not hold the lease forever."""
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        try:
            for line in range(100):  # 10 s at most, then the replica gives up by itself
                writer.write(b"X-Line-%d: x\r\n" % line)
                await writer.drain()
                await asyncio.sleep(0.1)
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(trickle, "127.0.0.31", 0)
    url = f"http://127.0.0.31:{server.sockets[0].getsockname()[1]}"
    settings = RouterSettings(backends=[url], health=NO_PROBES, first_byte_timeout_seconds=0.5)
    try:
        async with running_router(settings) as (base, runtime):
            [(code, _, body)] = await asyncio.wait_for(exchange(base, post()), 5)
            assert code == 504 and "did not answer in time" in json.loads(body)["error"]["message"]
            assert runtime.replicas.total_inflight() == 0 and not runtime.http_proxy.active
    finally:
        server.close()


class Flood(asyncio.Protocol):
    """A replica streaming SSE events as fast as its socket takes them, pausing when the socket is full."""

    def __init__(self) -> None:
        self.paused = asyncio.Event()
        self.sent = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" in data:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n")
            self._pump()

    def _pump(self) -> None:
        event = b'data: {"choices":[{"delta":{"content":"' + b"x" * 4000 + b'"}}]}\n\n'
        while not self.paused.is_set() and self.sent < 1 << 30:
            self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.sent += len(event)

    def pause_writing(self) -> None:
        self.paused.set()

    def resume_writing(self) -> None:
        self.paused.clear()
        asyncio.get_running_loop().call_soon(self._pump)


async def test_slow_sse_reader_does_not_make_the_router_buffer_the_stream():
    flood = Flood()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: flood, "127.0.0.31", 0)
    url = f"http://127.0.0.31:{server.sockets[0].getsockname()[1]}"
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            host, port = base.removeprefix("http://").split(":")
            client = socket.create_connection((host, int(port)))
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.sendall(post(b'{"model":"tiny","stream":true}'))  # then never read
            # The router stops reading the replica once the client's buffer is full; the replica's socket
            # then fills and its writes pause. Without back-pressure the router would keep reading.
            proxy = runtime.http_proxy
            await wait_for(lambda: flood.paused.is_set() and any(e.paused for e in proxy.active), timeout=20)
            buffered = sum(c.transport.get_write_buffer_size() for c in proxy.clients)
            assert buffered <= WRITE_HIGH_WATER + (1 << 20), buffered
            assert flood.sent < 1 << 30
            client.close()
            await wait_for(lambda: runtime.replicas.total_inflight() == 0)
    finally:
        server.close()


async def test_a_refused_upload_still_gets_its_413_while_the_client_keeps_sending(replica):
    async with running_router(RouterSettings(backends=[replica.url], max_body_bytes=2048)) as (base, runtime):
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: r\r\nContent-Length: 8388608\r\n\r\n")
        for _ in range(128):  # the client uploads its whole 8 MiB body after the router has refused it
            writer.write(b"x" * 65536)
            await writer.drain()
        code, headers, body = await read_response(reader)
        writer.close()
    assert code == 413 and "maxBodyBytes=2048" in json.loads(body)["error"]["message"]
    assert headers["connection"] == "close" and not replica.seen


BIG = 512 * 1024  # an answer of known length, buffered whole by the router before it is written


async def never_reading_client(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose receive window is tiny, so what the router writes stays in the router's buffer."""
    host, port = base.removeprefix("http://").split(":")
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window is set then
    client.setblocking(False)
    await asyncio.get_running_loop().sock_connect(client, (host, int(port)))
    return await asyncio.open_connection(sock=client)


@pytest.mark.parametrize("path, count", [(b"/v1/models", 200), (b"/healthz", 60000)])
async def test_a_pipelining_client_that_never_reads_holds_one_answer_beyond_the_high_water_mark(path, count):
    """Finding 1 of issue 21: pipelined requests and no read must not make the router answer them all.

    Replica answers (``/v1/models``, 512 KiB each) and the router's own (``/healthz``) alike: once the
    client's write buffer is above the mark, the next request waits, the queue fills, reading pauses. When
    the client then reads, every answer arrives, in order.
    """
    big = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % BIG + b"x" * BIG
    raw = RawReplica(lambda index, connection: big)
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            reader, writer = await never_reading_client(base)
            writer.write(b"GET %s HTTP/1.1\r\nHost: r\r\n\r\n" % path * count)  # not drained: the router may stop
            proxy = runtime.http_proxy
            await wait_for(lambda: any(c.write_paused and c.exchange is None and c._read_paused
                                       for c in proxy.clients), timeout=60)
            buffered = sum(c.transport.get_write_buffer_size() for c in proxy.clients)
            assert buffered <= WRITE_HIGH_WATER + BIG + 4096, buffered
            if path == b"/v1/models":
                assert raw.requests < 40, raw.requests  # the kernel's buffers hold a few; not 200
            answers = [await read_response(reader) for _ in range(count)]
            writer.close()
    finally:
        await raw.stop()
    assert [code for code, _, _ in answers] == [200] * count


async def test_a_client_that_reads_nothing_for_the_stall_timeout_is_cut(monkeypatch):
    """Writes paused without any drain for WRITE_STALL_SECONDS: the connection is cut and counted."""
    from rollout_router.proxy.http.connection import client as server
    monkeypatch.setattr(server, "WRITE_STALL_SECONDS", 0.5)
    async with running_router(RouterSettings(backends=["http://127.0.0.30:9"], health=NO_PROBES)) as (base, runtime):
        _, writer = await never_reading_client(base)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n" * 60000)
        proxy = runtime.http_proxy

        def stalls() -> float | None:
            return runtime.metrics.registry.get_sample_value("rolloutrouter_client_write_stalls_total",
                                                             {"listener": "traffic"})
        # paused, or already cut when the test's loop got the CPU late (a busy machine): either way it was paused
        await wait_for(lambda: any(c.write_paused for c in proxy.clients) or stalls(), timeout=60)
        await wait_for(lambda: not proxy.clients, timeout=60)  # the sweep cut it
        writer.close()
        assert stalls() == 1


async def test_remembered_response_heads_follow_each_answer_and_stay_bounded():
    """The client's head is built once per shape of the replica's head (heads.HEADS): an answer whose head
    differs (a new Date every request here) gets its own head, and the memory of shapes stays bounded."""
    from rollout_router.proxy.http.wire import heads
    count = heads.HEADS_KEPT + 44

    def answer(index: int, connection: int) -> bytes:
        return b"HTTP/1.1 200 OK\r\nDate: d%d\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}" % index

    raw = RawReplica(answer)
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, _):
            answers = await exchange(base, post() * count, responses=count)
        assert [headers["date"] for _, headers, _ in answers] == [f"d{i}" for i in range(count)]
        assert all(code == 200 and body == b"{}" and headers["x-rolloutrouter-replica"] == url for code, headers, body in answers)
        assert 0 < len(heads.HEADS) <= heads.HEADS_KEPT
    finally:
        await raw.stop()


async def test_answers_of_every_length_share_one_remembered_head():
    """A completion's length is its own: answers that differ only in Content-Length are one shape (heads.HEADS),
    each relayed with its own length and body."""
    from rollout_router.proxy.http.wire import heads

    def answer(index: int, connection: int) -> bytes:
        body = b'{"n":"%s"}' % (b"t" * index)
        return b"HTTP/1.1 200 OK\r\ndate: d\r\ncontent-length: %d\r\ncontent-type: application/json\r\n\r\n%s" % (
            len(body), body)

    raw = RawReplica(answer)
    url = await raw.start()
    heads.HEADS.clear()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, _):
            answers = await exchange(base, post() * 40, responses=40)
        assert [json.loads(body)["n"] for _, _, body in answers] == ["t" * i for i in range(40)]
        assert all(int(headers["content-length"]) == len(body) and headers["date"] == "d"
                   and headers["content-type"] == "application/json" for _, headers, body in answers)
        assert len(heads.HEADS) == 1
    finally:
        await raw.stop()


@pytest.mark.parametrize(("pieces", "seen"), [
    ([b"data: {}\n\ndata: [DO", b"NE]\n\n"], True),  # split inside the marker
    ([b"data: [DONE]", b"\n", b"\n"], True),  # the blank line in chunks of its own
    ([b"d", b"a", b"t", b"a: [DONE]\n\n"], True),  # chunks shorter than the tail kept
    ([b"x" * 100 + b"data: [DONE]\n\n"], True),
    ([b"data: [DONE] and more\n\n"], False),
    ([b"data: [DONE]\n\n" + b"data: {}\n\n"], False),
])
def test_a_streams_done_event_is_seen_at_its_end_however_the_replica_splits_it(pieces, seen):
    """`data: [DONE]` at the end of what came so far, across reads of any size, and only there."""
    exchange = Exchange(SimpleNamespace(), SimpleNamespace(), SimpleNamespace(), "r", SimpleNamespace(), True,
                        on_done=lambda *_: None)
    exchange.state, exchange.sse, exchange.chunked = STREAMING, True, True
    for piece in pieces:
        exchange.on_body(piece)
    assert exchange.done_seen is seen
    assert b"".join(exchange.out) == b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)

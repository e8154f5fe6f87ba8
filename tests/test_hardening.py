"""What a hostile client can do to the traffic port: paths, slow and partial requests, huge keys, connections.

Raw bytes on real sockets against an in-process router; replicas record
what reached them, so "refused" also means "the replica saw nothing".
"""
from __future__ import annotations

import asyncio
import gzip
import json
import logging

import pytest

from rollout_router.app import Runtime
from rollout_router.core.pins import SessionTable
from rollout_router.policy.base import Counters
from rollout_router.proxy.http.connection import client as server
from rollout_router.settings import MetricsSettings, RouterSettings, SessionSettings
from tests.support import NO_PROBES, running_router, wait_for
from tests.test_http_wire import CHAT, OK, RawReplica, exchange, post, read_response


@pytest.fixture
async def raw():
    replica = RawReplica(lambda index, connection: OK)
    url = await replica.start()
    replica.url = url  # type: ignore[attr-defined]
    yield replica
    await replica.stop()


def error_of(body: bytes) -> dict:
    return json.loads(body)["error"]


async def metric(runtime: Runtime, name: str, **labels: str) -> float:
    value = runtime.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


@pytest.mark.parametrize("path", [
    b"/v1/models/../../sleep", b"/v1/models/%2e%2e/%2e%2e/sleep", b"/v1/models/%2E%2E/reset_prefix_cache",
    b"/v1/models/.%2e/x", b"/v1/models/..;/x", b"/v1/models/%252e%252e/x", b"/v1/models/%25252e%25252e/x",
    b"/v1/models/./x", b"/v1/models/%2e/x", b"/v1/models/a%2fb", b"/v1/models/a%2Fb", b"/v1/models/a%252Fb",
    b"/v1/models/a%5cb", b"/v1/chat/completions/..", b"/v1/responses/%2e%2e%3b/x", b"/v1/models/a%00b",
    b"/v1/models/%zz",
])
async def test_paths_that_could_reach_another_route_are_refused(raw, path):
    async with running_router(RouterSettings(backends=[raw.url], health=NO_PROBES)) as (base, runtime):
        [(code, _, body)] = await exchange(base, post(path=path))
        assert code == 400 and error_of(body)["param"] == "path", body
        assert raw.requests == 0 and runtime.replicas.total_inflight() == 0
        assert await metric(runtime, "rolloutrouter_request_errors_total", reason="bad_path") == 1


@pytest.mark.parametrize("sent, received", [
    (b"/v1/chat/%63ompletions", b"/v1/chat/completions"),  # checked as the replica will read it
    (b"/v1/models/my%20model?x=%2e%2e/../", b"/v1/models/my%20model?x=%2e%2e/../"),  # the query is not a path
    (b"/v1/models/caf%c3%a9", b"/v1/models/caf%C3%A9"),
    (b"/v1/responses/resp_1.json", b"/v1/responses/resp_1.json"),  # a dot inside a segment is fine
])
async def test_the_replica_gets_exactly_the_path_that_was_checked(raw, sent, received):
    async with running_router(RouterSettings(backends=[raw.url], health=NO_PROBES)) as (base, _):
        [(code, _, _)] = await exchange(base, post(path=sent))
    assert code == 200
    (head, _), = raw.seen
    assert head.split(b" ")[1] == received


async def test_session_keys_above_max_key_bytes_get_400_and_no_pin(raw):
    settings = RouterSettings(backends=[raw.url], health=NO_PROBES, session=SessionSettings(body_fields=["session_id"], max_key_bytes=16))
    async with running_router(settings) as (base, runtime):
        fits = b"k" * 16
        [(code, _, _)] = await exchange(base, post().replace(b"X-Session-ID: s", b"X-Session-ID: " + fits))
        assert code == 200
        long_header = post().replace(b"X-Session-ID: s\r\n", b"X-Session-ID: " + b"k" * 17 + b"\r\n")
        long_body = post(json.dumps({"session_id": "\u00e9" * 9}).encode()).replace(b"X-Session-ID: s\r\n", b"")
        for request, param in ((long_header, "X-Session-ID"), (long_body, "session_id")):
            [(code, _, body)] = await exchange(base, request)
            error = error_of(body)
            assert code == 400 and error["param"] == param and "session.maxKeyBytes=16" in error["message"]
        assert raw.requests == 1 and runtime.balancer.policy.sessions() == 1
        assert await metric(runtime, "rolloutrouter_request_errors_total", reason="session_key_too_long") == 2


async def test_a_body_nested_too_deep_to_read_its_key_from_is_a_400_not_a_500(raw):
    settings = RouterSettings(backends=[raw.url], health=NO_PROBES, session=SessionSettings(body_fields=["session_id"]))
    async with running_router(settings) as (base, runtime):
        nested = post(b"[" * 100_000 + b"]" * 100_000).replace(b"X-Session-ID: s\r\n", b"")
        [(code, _, body)] = await exchange(base, nested)
        assert code == 400 and "not valid JSON (nested too deeply" in error_of(body)["message"]
        assert raw.requests == 0 and runtime.replicas.total_inflight() == 0


async def test_a_body_key_that_is_a_lone_surrogate_is_a_400_not_a_500(raw):
    """JSON can spell a lone surrogate ("\\ud800"), which has no UTF-8: measuring the key raised."""
    settings = RouterSettings(backends=[raw.url], health=NO_PROBES, session=SessionSettings(body_fields=["session_id"]))
    async with running_router(settings) as (base, runtime):
        request = post(b'{"session_id": "\\ud800", "model": "m"}').replace(b"X-Session-ID: s\r\n", b"")
        [(code, _, body)] = await exchange(base, request)
        assert code == 400 and error_of(body)["param"] == "session_id", body
        assert "not valid Unicode" in error_of(body)["message"]
        assert raw.requests == 0 and runtime.replicas.total_inflight() == 0


async def test_a_number_too_long_to_read_is_bad_json_on_both_ports(raw):
    """Python refuses to convert an integer of more than 4,300 digits with a plain ValueError: it was a 500 and a
    traceback per request on the traffic port, and no answer at all on the admin port."""
    settings = RouterSettings(backends=[raw.url], health=NO_PROBES, session=SessionSettings(body_fields=["session_id"]))
    huge = b'{"session_id": "a", "n": ' + b"9" * 5000 + b"}"
    async with running_router(settings) as (base, runtime):
        [(code, _, body)] = await exchange(base, post(huge).replace(b"X-Session-ID: s\r\n", b""))
        assert code == 400 and "not valid JSON (a number too long to read" in error_of(body)["message"]
        [(code, _, body)] = await exchange(runtime.admin_url, b"POST /workers HTTP/1.1\r\nHost: r\r\n"
                                           b"Content-Length: %d\r\n\r\n%s" % (len(huge), huge))
        assert code == 400 and "not valid JSON (a number too long to read" in error_of(body)["message"]
        assert raw.requests == 0 and runtime.replicas.total_inflight() == 0


async def test_an_answer_whose_usage_cannot_be_read_still_ends_its_exchange():
    """Every kept turn measured: a replica whose answer ends in a ``usage`` nested too deep for the parser. The
    keep-alive connection goes on and nothing is left held (in flight, answering, budget, exchanges)."""
    answer = b'{"id":"x","usage": ' + b"[" * 1500 + b"]" * 1500 + b"}"  # within the tail read (TAIL_BYTES)
    raw = RawReplica(lambda index, connection: b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                               b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer))
    url = await raw.start()
    settings = RouterSettings(backends=[url], health=NO_PROBES, metrics=MetricsSettings(kept_prefill_sample_rate=1.0))
    try:
        async with running_router(settings) as (base, runtime):
            # new, then two kept turns, both measured; a third answer never came while the second's exchange hung
            answers = await asyncio.wait_for(exchange(base, post() * 3, responses=3), 10)
            assert [code for code, _, _ in answers] == [200, 200, 200]
            proxy = runtime.http_proxy
            await wait_for(lambda: runtime.replicas.total_inflight() == 0 and proxy.answering == 0
                           and proxy.budget.held == 0 and not proxy.active)
    finally:
        await raw.stop()


async def test_a_session_header_that_is_not_utf8_is_a_400_not_a_500(raw):
    async with running_router(RouterSettings(backends=[raw.url], health=NO_PROBES)) as (base, runtime):
        [(code, _, body)] = await exchange(base, post().replace(b"X-Session-ID: s", b"X-Session-ID: \xff\xfe"))
        assert code == 400 and "not valid UTF-8" in error_of(body)["message"]
        assert raw.requests == 0 and runtime.balancer.policy.sessions() == 0


async def read_one(base: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` (a partial request) and keep the connection open until the router answers."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    try:
        return await asyncio.wait_for(read_response(reader), 15)
    finally:
        writer.close()


async def test_a_head_that_never_completes_gets_408(raw):
    async with running_router(RouterSettings(backends=[raw.url], health=NO_PROBES, header_timeout_seconds=1)) as (base, runtime):
        code, headers, body = await read_one(base, b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Sl")
        assert code == 408 and "headerTimeoutSeconds=1" in error_of(body)["message"]
        assert headers["connection"] == "close"
        code, _, body = await read_one(base, b"")  # a connection that never sends a byte is no better
        assert code == 408
        assert await metric(runtime, "rolloutrouter_request_errors_total", reason="header_timeout") == 2
        assert raw.requests == 0 and runtime.http_proxy.buffered == 0


class Broken:
    """A client connection whose deadline check raises (a bug): the sweep must go on to the others."""

    def check(self, now: float, limits: object) -> None:
        raise RuntimeError("a bug in one connection's check")


async def test_a_bug_in_one_connections_check_does_not_end_the_sweep(raw, caplog):
    async with running_router(RouterSettings(backends=[raw.url], health=NO_PROBES, header_timeout_seconds=1)) as (base, runtime):
        broken = Broken()
        runtime.http_proxy.clients.add(broken)  # type: ignore[arg-type]
        code, _, body = await read_one(base, b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Sl")
        runtime.http_proxy.clients.discard(broken)  # type: ignore[arg-type]
        assert code == 408 and "headerTimeoutSeconds=1" in error_of(body)["message"]
        assert "sweep failed on a client connection" in caplog.text


async def test_a_body_that_never_completes_gets_408_and_its_bytes_are_released(raw):
    settings = RouterSettings(backends=[raw.url], health=NO_PROBES, body_timeout_seconds=1, min_body_bytes_per_second=0)
    async with running_router(settings) as (base, runtime):
        head = post(b"x" * 1000)[:-1000]
        code, _, body = await read_one(base, head + b"x" * 10)
        assert code == 408 and "bodyTimeoutSeconds=1" in error_of(body)["message"]
        await wait_for(lambda: runtime.http_proxy.buffered == 0)
        assert raw.requests == 0 and runtime.replicas.total_inflight() == 0


async def test_a_body_slower_than_the_minimum_rate_gets_408(raw, monkeypatch):
    monkeypatch.setattr(server, "BODY_GRACE_SECONDS", 0.0)  # judged from the first sweep, not after 10 s
    settings = RouterSettings(backends=[raw.url], health=NO_PROBES, body_timeout_seconds=None, min_body_bytes_per_second=10_000)
    async with running_router(settings) as (base, runtime):
        code, _, body = await read_one(base, post(b"x" * 100_000)[:-99_000])
        assert code == 408 and "minBodyBytesPerSecond=10000" in error_of(body)["message"]
        assert await metric(runtime, "rolloutrouter_request_errors_total", reason="body_too_slow") == 1


async def test_the_buffered_bytes_budget_refuses_with_503_and_recovers(raw):
    settings = RouterSettings(backends=[raw.url], health=NO_PROBES, max_buffered_bytes=64 * 1024)
    async with running_router(settings) as (base, runtime):
        [(code, _, body)] = await exchange(base, post(b"x" * 100_000))  # declared larger than the whole budget
        assert code == 503 and "maxBufferedBytes=65536" in error_of(body)["message"]
        host, port = base.removeprefix("http://").split(":")
        _, holder = await asyncio.open_connection(host, int(port))
        holder.write(post(b"x" * 60_000)[:-10_000])  # 50 kB held, waiting for the rest
        await wait_for(lambda: runtime.http_proxy.buffered >= 50_000)
        [(code, _, body)] = await exchange(base, post(json.dumps({"pad": "x" * 20_000}).encode()))
        assert code == 503 and "retry later" in error_of(body)["message"]
        holder.close()
        await wait_for(lambda: runtime.http_proxy.buffered == 0)
        [(code, _, _)] = await exchange(base, post(json.dumps({"pad": "x" * 20_000}).encode()))
        assert code == 200
        assert await metric(runtime, "rolloutrouter_request_errors_total", reason="buffer_full") == 2


async def test_a_head_cut_across_reads_holds_its_bytes_in_the_budget_until_it_ends(raw):
    """Heads are charged once, at their end or at the end of the read that brought part of them."""
    async with running_router(RouterSettings(backends=[raw.url], health=NO_PROBES)) as (base, runtime):
        host, port = base.removeprefix("http://").split(":")
        _, holder = await asyncio.open_connection(host, int(port))
        holder.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Pad: " + b"p" * 20_000 + b"\r\nX-M")  # the next line ends the header
        await wait_for(lambda: runtime.http_proxy.buffered >= 20_000)
        holder.close()
        await wait_for(lambda: runtime.http_proxy.buffered == 0)
        [(code, _, _)] = await exchange(base, post(b"{}"))
        assert code == 200 and runtime.http_proxy.buffered == 0


async def test_connections_beyond_the_bound_get_503_and_one_log_line(raw, caplog):
    caplog.set_level(logging.WARNING, logger="rollout_router.proxy.listener")
    async with running_router(RouterSettings(backends=[raw.url], health=NO_PROBES, max_connections=3)) as (base, runtime):
        host, port = base.removeprefix("http://").split(":")
        idle = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
        await wait_for(lambda: len(runtime.http_proxy.clients) == 3)
        for _ in range(2):
            code, headers, body = await read_one(base, post())
            assert code == 503 and "maxConnections=3" in error_of(body)["message"]
        assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
        assert "maxConnections=3" in caplog.records[0].message and len(caplog.records) == 1
        assert await metric(runtime, "rolloutrouter_connections_rejected_total", listener="traffic") == 2
        idle[0][1].close()
        await wait_for(lambda: len(runtime.http_proxy.clients) < 3)
        [(code, _, _)] = await exchange(base, post())
        assert code == 200 and raw.requests == 1
        for _, writer in idle[1:]:
            writer.close()


async def test_a_gzip_body_is_forwarded_as_received_and_its_key_read(raw):
    settings = RouterSettings(backends=[raw.url], health=NO_PROBES, max_body_bytes=4096,
                              session=SessionSettings(headers=[], body_fields=["session_id"]))
    compressed = gzip.compress(json.dumps({**json.loads(CHAT), "session_id": "zipped"}).encode())
    async with running_router(settings) as (base, runtime):
        [(code, _, _)] = await exchange(base, post(compressed, b"Content-Encoding: gzip\r\n"))
        assert code == 200
        head, body = raw.seen[0]
        assert body == compressed and b"\r\nContent-Encoding: gzip\r\n" in head
        assert [key for key, _ in runtime.balancer.policy.table] == ["zipped"]
        bomb = gzip.compress(b"{" + b" " * 100_000 + b"}")  # small on the wire, 100 kB inflated
        [(code, _, body)] = await exchange(base, post(bomb, b"Content-Encoding: gzip\r\n"))
        assert code == 413 and "inflates" in error_of(body)["message"]
        [(code, _, body)] = await exchange(base, post(b"xx", b"Content-Encoding: br\r\n"))
        assert code == 400 and "session header" in error_of(body)["message"]
        assert raw.requests == 1


def test_pin_expiry_takes_a_bounded_batch_per_call():
    table = SessionTable(Counters(), max_sessions=100, idle_ttl=10.0)
    for index in range(25):
        table.pin(f"old{index}", "r", now=0.0)
    table.pin("fresh", "r", now=95.0)
    assert [table.expire(100.0, limit=10) for _ in range(4)] == [10, 10, 5, 0]
    assert [key for key, _ in table] == ["fresh"]


async def test_the_runtime_expires_pins_in_batches_and_lets_the_loop_run(monkeypatch):
    import rollout_router.app as app
    monkeypatch.setattr(app, "EXPIRY_BATCH", 10)
    clock = [0.0]
    runtime = Runtime(RouterSettings(session=SessionSettings(idle_timeout_seconds=5)))
    runtime.balancer.clock = lambda: clock[0]
    for index in range(25):
        runtime.balancer.policy.table.pin(f"k{index}", "r", now=0.0)
    clock[0] = 100.0
    seen_meanwhile: list[int] = []

    async def other_work() -> None:
        seen_meanwhile.append(runtime.balancer.policy.sessions())
    task = asyncio.get_running_loop().create_task(other_work())
    assert await runtime.expire_pins() == 25
    await task
    assert seen_meanwhile == [15]  # ran between the first and the second batch

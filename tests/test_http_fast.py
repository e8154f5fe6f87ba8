"""The traffic listener's fast path: a request with an idle pooled connection to its replica is forwarded from
the parser's callbacks and finished from the relay's, with no Task (``HttpProxy._fast``).

Each test first warms the pool with one request, so the one it examines takes the fast path, and counts the
Tasks the listener starts (``ClientConnection.answer_later``) to show it did.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from rollout_router.proxy.http.connection.client import ClientConnection
from rollout_router.settings import RouterSettings
from tests.support import NO_PROBES, ScriptedReplica, running_router, wait_for
from tests.test_http_wire import OK, RawReplica, exchange, post, read_response


@pytest.fixture
def tasks(monkeypatch) -> list[bytes]:
    """The target of every request answered in a Task rather than on the fast path."""
    started: list[bytes] = []
    later = ClientConnection.answer_later

    def counted(self, request, answering):
        started.append(request.target)
        later(self, request, answering)

    monkeypatch.setattr(ClientConnection, "answer_later", counted)
    return started


async def metrics_text(runtime) -> str:
    [(_, _, body)] = await exchange(runtime.admin_url, b"GET /metrics HTTP/1.1\r\nHost: r\r\n\r\n")
    return body.decode()


async def test_pipelined_requests_on_the_fast_path_keep_their_order(tasks):
    raw = RawReplica(lambda index, connection: b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                               b"Content-Length: 9\r\n\r\n{\"n\":%03d}" % index)
    url = await raw.start()
    try:
        async with running_router(RouterSettings(backends=[url], health=NO_PROBES)) as (base, runtime):
            await exchange(base, post())  # the first opens the connection the others reuse
            tasks.clear()
            answers = await exchange(base, b"".join(post(b'{"model":"tiny","n":%d}' % n) for n in range(6)),
                                     responses=6)
            assert runtime.replicas.total_inflight() == 0
    finally:
        await raw.stop()
    assert [body for _, _, body in answers] == [b'{"n":%03d}' % index for index in range(1, 7)]
    assert [json.loads(body)["n"] for _, body in raw.seen[1:]] == list(range(6))  # forwarded in order too
    assert tasks == [] and raw.connections == 1


async def test_a_client_gone_mid_answer_on_the_fast_path_releases_its_lease_and_counts_499(tasks):
    replica = await ScriptedReplica("127.0.0.11").start()
    try:
        async with running_router(RouterSettings(backends=[replica.url], health=NO_PROBES)) as (base, runtime):
            await exchange(base, post())
            replica.hold = asyncio.Event()
            tasks.clear()
            host, port = base.removeprefix("http://").split(":")
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(post())
            await wait_for(lambda: replica.active == 1)
            assert runtime.replicas.total_inflight() == 1 and tasks == []
            writer.close()  # the client hangs up before the answer
            await wait_for(lambda: runtime.replicas.total_inflight() == 0)
            await wait_for(lambda: replica.cancelled == 1)  # the replica's connection is cut at once
            assert runtime.http_proxy.answering == 0
            assert 'code="499"} 1.0' in await metrics_text(runtime)
            replica.hold.set()
            [(code, _, _)] = await exchange(base, post())
            assert code == 200  # the router goes on
    finally:
        await replica.stop()


async def test_a_pooled_connection_closed_before_answering_is_retried_elsewhere(tasks):
    """The replica closes the reused connection and refuses a new one: the coroutine path's retries take over."""
    dying: set[int] = set()
    raws: list[RawReplica] = []

    def answer(which: int):
        return lambda index, connection: None if which in dying else OK

    for which in range(2):
        raws.append(RawReplica(answer(which)))
    urls = [await raw.start(f"127.0.0.{31 + which}") for which, raw in enumerate(raws)]
    try:
        async with running_router(RouterSettings(backends=urls, health=NO_PROBES)) as (base, runtime):
            [(_, headers, _)] = await exchange(base, post())
            first = urls.index(headers["x-rolloutrouter-replica"])
            dying.add(first)
            assert raws[first].server is not None
            raws[first].server.close()  # no new connection: a fresh one to it is refused
            await raws[first].server.wait_closed()
            tasks.clear()
            [(code, headers, body)] = await exchange(base, post())
            handed = list(tasks)
            assert runtime.replicas.total_inflight() == 0 and runtime.http_proxy.answering == 0
            metrics = await metrics_text(runtime)
    finally:
        for raw in raws:
            await raw.stop()
    assert code == 200 and body == b'{"ok":true}'
    assert headers["x-rolloutrouter-replica"] == urls[1 - first]
    assert raws[first].requests == 2 and raws[1 - first].requests == 1  # the stale attempt reached it
    assert handed == [b"/v1/chat/completions"]  # handed to the coroutine path once the pooled connection went stale
    assert f'rolloutrouter_upstream_retries_total{{backend="{urls[first]}"}} 1.0' in metrics


async def test_a_silent_replica_on_the_fast_path_times_out_by_the_sweep(tasks):
    replica = await ScriptedReplica("127.0.0.12").start()
    try:
        settings = RouterSettings(backends=[replica.url], first_byte_timeout_seconds=0.5, health=NO_PROBES)
        async with running_router(settings) as (base, runtime):
            await exchange(base, post())
            replica.hold = asyncio.Event()
            tasks.clear()
            host, port = base.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(post() + post())  # the second waits its turn behind the one timed out
            first, second = await read_response(reader), await read_response(reader)
            writer.close()
            assert runtime.replicas.total_inflight() == 0 and runtime.http_proxy.answering == 0
            replica.hold.set()
    finally:
        await replica.stop()
    assert first[0] == 504 and "did not answer in time" in json.loads(first[2])["error"]["message"]
    assert second[0] == 504  # the replica is still held: its connection was cut, the next one waits as long


async def test_with_a_fleet_a_key_this_router_decides_takes_the_fast_path(tasks):
    """A fleet whose only live member is this router (its peer refuses): every key is decided here, no Task."""
    from rollout_router.settings import FleetSettings
    raw = RawReplica(lambda index, connection: OK)
    url = await raw.start()
    try:
        settings = RouterSettings(backends=[url], health=NO_PROBES, fleet=FleetSettings(peers=["http://127.0.0.1:1"]))
        async with running_router(settings) as (base, runtime):
            assert runtime.fleet is not None
            await exchange(base, post())
            tasks.clear()
            answers = await exchange(base, post() + post(), responses=2)
            assert runtime.replicas.total_inflight() == 0 and runtime.http_proxy.answering == 0
            assert runtime.fleet.forwarded == 0
    finally:
        await raw.stop()
    assert [code for code, _, _ in answers] == [200, 200]
    assert tasks == [] and raw.connections == 1

"""A replica that never completes the TCP handshake (its accept queue is full: the kernel drops the SYNs) is a
timeout, not a refusal: the request goes to another replica as after a refusal, and the timeout counts towards
the replica's ejection (Python's TimeoutError is an OSError, so the order of the handlers decides this)."""
from __future__ import annotations

import socket
import time

import pytest

from rollout_router.proxy.http.connection import upstream
from rollout_router.settings import HealthSettings, RouterSettings
from tests.support import ScriptedReplica, running_router


@pytest.fixture
def unanswered():
    """A listener on 127.0.0.78 whose accept queue is full and never drained: new connects hang."""
    listener = socket.socket()
    listener.bind(("127.0.0.78", 0))
    listener.listen(0)
    fillers = []
    for _ in range(3):  # a backlog of 0 still queues one or two; more connects than that stay unanswered
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(listener.getsockname())
        fillers.append(filler)
    time.sleep(0.05)  # the fillers' handshakes are the kernel's own, on loopback: done at once
    yield f"http://127.0.0.78:{listener.getsockname()[1]}"
    for sock in (*fillers, listener):
        sock.close()


async def test_a_connect_that_times_out_counts_towards_ejection_and_the_request_goes_elsewhere(
        unanswered, http, monkeypatch):
    monkeypatch.setattr(upstream, "CONNECT_SECONDS", 0.3)
    good = await ScriptedReplica("127.0.0.79").start()
    try:
        settings = RouterSettings(backends=[unanswered, good.url], health=HealthSettings(
            consecutive_failures=1, probe_interval_seconds=None))
        async with running_router(settings) as (base, runtime):
            runtime.balancer.policy.table.pin("s", unanswered, time.monotonic())
            async with http.post(f"{base}/v1/chat/completions", json={"messages": []},
                                 headers={"X-Session-ID": "s"}) as answer:
                assert answer.status == 200 and answer.headers["X-RolloutRouter-Replica"] == good.url
            assert runtime.replicas.get(unanswered).ejected_until > time.monotonic()  # a TIMEOUT failure ejected it
            assert runtime.replicas.total_inflight() == 0
    finally:
        await good.stop()

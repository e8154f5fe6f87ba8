"""The RL pause holds gRPC calls too: queued while paused, dispatched on resume, UNAVAILABLE beyond the bound."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from rollout_router.settings import RlSettings
from tests.support import running_router, wait_for
from tests.test_grpc_proxy import backends, replicas, unary  # noqa: F401  (replicas is a fixture)


async def test_grpc_calls_wait_while_paused_and_beyond_the_queue_get_unavailable(replicas):
    settings = backends(replicas).model_copy(update={"rl": RlSettings(max_queued_requests=1)})
    async with running_router(settings, grpc=True) as (_, runtime), \
            aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
        runtime.rl.pause("wait")
        waiting = asyncio.create_task(unary(channel, "/test.Echo/Unary", b"held", "s"))
        await wait_for(lambda: runtime.rl.queued == 1)
        assert not any(r.seen for r in replicas)  # nothing reached a replica while paused
        with pytest.raises(aio.AioRpcError) as raised:
            await unary(channel, "/test.Echo/Unary", b"refused", "t")
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "rl.maxQueuedRequests=1" in raised.value.details()
        runtime.rl.resume()
        response, _ = await waiting
        assert response.startswith(b"held")
        assert dict(runtime.rl.queue) == {"queued": 1, "full": 1, "dispatched": 1}
        assert runtime.replicas.total_inflight() == 0


async def test_grpc_answers_carry_the_replicas_weight_version(replicas):
    """As HTTP's X-Weight-Version: the version the answering replica last reported, so stale samples can go."""
    async with running_router(backends(replicas), grpc=True) as (_, runtime), \
            aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
        _, before = await unary(channel, "/test.Echo/Unary", b"a", "s")
        assert "x-weight-version" not in before  # no update yet: nothing to say
        runtime.rl.versions[before["x-rolloutrouter-replica"]] = "step-7"  # what a fan-out records
        _, after = await unary(channel, "/test.Echo/Unary", b"b", "s")
        assert after["x-weight-version"] == "step-7"

"""GRPO siblings through the router: the group key from a header, a body field or gRPC metadata places new
sessions beside their group (policy/groups.py); counted in /status and /metrics."""
from __future__ import annotations

import asyncio

import pytest
from grpc import aio

from rollout_router.settings import GroupSettings, RouterSettings, SessionSettings, parse_settings
from tests.support import running_router, scripted_replicas, wait_for
from tests.test_grpc_proxy import GrpcReplica, backends

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "solve 2+2"}]}


@pytest.fixture
async def replicas():
    async with scripted_replicas(70, 3) as started:
        yield started


async def post(http, base, headers=None, body=None):
    async with http.post(f"{base}/v1/chat/completions", json=body or CHAT, headers=headers or {}) as response:
        return response.status, response.headers.get("X-RolloutRouter-Replica"), await response.json()


async def siblings(http, base, n, group=None, prefix="s"):
    """The replicas ``n`` new sessions were sent to, one after another (so loads are equal at each decision)."""
    where = []
    for i in range(n):
        headers = {"X-Session-ID": f"{prefix}{i}"} | ({"X-Group-ID": group} if group else {})
        status, replica, _ = await post(http, base, headers)
        assert status == 200
        where.append(replica)
    return where


async def test_siblings_with_a_group_header_land_on_one_replica(replicas, http):
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        assert len(set(await siblings(http, base, 8, prefix="plain"))) > 1  # without the key they spread
        assert len(set(await siblings(http, base, 8, group="prompt-1"))) == 1
        status = await (await http.get(f"{runtime.admin_url}/status")).json()
        metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
    assert (status["group_colocated"], status["group_spilled"], status["new_sessions"]) == (7, 0, 16)
    assert "rolloutrouter_group_colocated_total 7.0" in metrics
    assert "rolloutrouter_group_spilled_total 0.0" in metrics


async def test_a_sibling_beyond_the_margin_spills_and_is_counted(replicas, http):
    settings = RouterSettings(backends=[r.url for r in replicas], affinity_break_margin=0)
    async with running_router(settings) as (base, runtime):
        _, first, _ = await post(http, base, {"X-Session-ID": "a", "X-Group-ID": "g"})
        target = next(r for r in replicas if r.url == first)
        target.hold = asyncio.Event()
        held = asyncio.ensure_future(post(http, base, {"X-Session-ID": "a"}))  # a's second turn, held
        await wait_for(lambda: target.active == 1)
        _, second, _ = await post(http, base, {"X-Session-ID": "b", "X-Group-ID": "g"})
        target.hold.set()
        await held
        assert second != first
        assert (runtime.balancer.policy.counters.group_spilled, runtime.balancer.policy.counters.group_colocated) == (1, 0)


async def test_the_group_key_from_a_body_field(replicas, http):
    settings = RouterSettings(backends=[r.url for r in replicas],
                              group=GroupSettings(headers=[], body_fields=["request_group_id"]))
    async with running_router(settings) as (base, runtime):
        where = {(await post(http, base, {"X-Session-ID": f"s{i}"}, CHAT | {"request_group_id": "p7"}))[1]
                 for i in range(6)}
        ignored = await post(http, base, {"X-Session-ID": "t", "X-Group-ID": "p7"})  # the header is not configured
    assert len(where) == 1 and runtime.balancer.policy.counters.group_colocated == 5
    assert ignored[0] == 200


async def test_unkeyed_siblings_are_placed_together(replicas, http):
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        where = {(await post(http, base, {"X-Group-ID": "p"}))[1] for _ in range(5)}
    assert len(where) == 1 and runtime.balancer.policy.sessions() == 0


async def test_a_bad_group_key_is_a_400_naming_it(replicas, http):
    settings = RouterSettings(backends=[r.url for r in replicas], session=SessionSettings(max_key_bytes=8))
    async with running_router(settings) as (base, _):
        status, _, body = await post(http, base, {"X-Session-ID": "s", "X-Group-ID": "g" * 9})
    assert status == 400
    assert "group key in X-Group-ID is 9 bytes, longer than session.maxKeyBytes=8" in body["error"]["message"]


def test_group_settings_are_checked_and_reach_the_policy():
    settings = parse_settings({"group": {"headers": ["X-Prompt"], "maxGroups": 64}})
    assert settings.group.headers == ["X-Prompt"] and settings.live_config().max_groups == 64
    assert RouterSettings().group.headers == ["X-Group-ID"]
    for bad, where in (({"maxGroups": 0}, "group.maxGroups"), ({"headers": [""]}, "group.headers"),
                       ({"bodyField": ["x"]}, "group.bodyField")):
        with pytest.raises(ValueError, match=where):
            parse_settings({"group": bad})


async def test_grpc_metadata_carries_the_group_key():
    started = [await GrpcReplica(f"127.0.0.{80 + i}").start() for i in range(3)]
    try:
        async with running_router(backends(started), grpc=True) as (_, runtime):
            async with aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
                targets = set()
                for i in range(6):
                    call = channel.unary_unary("/test.Echo/Unary")(
                        b"x", metadata=(("x-session-id", f"s{i}"), ("x-group-id", "prompt-3")))
                    targets.add((await call).split(b"|")[1])
        assert len(targets) == 1 and runtime.balancer.policy.counters.group_colocated == 5
    finally:
        for replica in started:
            await replica.stop()

"""Replica health over real sockets: hung and garbage replicas ejected, probes, first-byte timeout, /readyz."""
from __future__ import annotations

import time

import pytest

from rollout_router.settings import HealthSettings, RouterSettings
from tests.support import NO_PROBES, BrokenReplica, ScriptedReplica, running_router, scripted_replicas, wait_for

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
async def good():
    async with scripted_replicas(60, 2) as started:
        yield started


async def chat(http, base, session=None):
    headers = {"X-Session-ID": session} if session else {}
    async with http.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers) as response:
        return response.status, response.headers.get("X-RolloutRouter-Replica"), await response.json()


def passive(failures: int = 2, **health) -> HealthSettings:
    """Passive health alone (no probes), with a short ejection."""
    return HealthSettings(consecutive_failures=failures, probe_interval_seconds=None, **health)


def pin(runtime, key: str, replica: str) -> None:
    runtime.balancer.policy.table.pin(key, replica, time.monotonic())


async def test_hung_replica_gets_504_after_the_first_byte_timeout_then_is_ejected_and_its_sessions_move(good, http):
    hung = await BrokenReplica("127.0.0.70", "hang").start()
    try:
        settings = RouterSettings(backends=[hung.url, *(r.url for r in good)], first_byte_timeout_seconds=0.2,
                                  health=passive(failures=2))
        async with running_router(settings) as (base, runtime):
            for key in ("a", "b"):
                pin(runtime, key, hung.url)
            for key in ("a", "b"):  # one turn each on the hung replica: 504, and a failure each
                code, where, body = await chat(http, base, key)
                assert code == 504 and where == hung.url
                assert "did not answer in time" in body["error"]["message"]
            assert hung.url not in runtime.replicas.loads()  # two in a row: ejected
            for key in ("a", "b"):  # the next turn of each pinned session is re-placed, not held again
                code, where, _ = await chat(http, base, key)
                assert code == 200 and where != hung.url
            assert runtime.balancer.repinned == {"ejected": 2}
            assert runtime.replicas.total_inflight() == 0
            status = await (await http.get(f"{runtime.admin_url}/status")).json()
            metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
    finally:
        await hung.stop()
    entry = next(b for b in status["backends"] if b["url"] == hung.url)
    assert entry["ejected_until"] > time.time() and entry["ready"] is False and status["backends_ejected"] == 1
    assert status["repinned"] == {"ejected": 2}
    assert f'rolloutrouter_replica_ejections_total{{backend="{hung.url}",reason="timeout"}} 1.0' in metrics
    assert 'rolloutrouter_repinned_total{reason="ejected"} 2.0' in metrics


async def test_a_replica_answering_500_to_everything_is_ejected_and_its_sessions_move(good, http):
    """Issue 21, finding 7: a replica that answers 500 stayed in rotation (17 of 20 requests failed)."""
    failing = await ScriptedReplica("127.0.0.72", status=500).start()
    try:
        settings = RouterSettings(backends=[failing.url, *(r.url for r in good)],
                                  health=passive(consecutive_5xx=3))
        async with running_router(settings) as (base, runtime):
            pin(runtime, "a", failing.url)
            codes = [(await chat(http, base, "a"))[:2] for _ in range(4)]
            metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
    finally:
        await failing.stop()
    assert codes[:3] == [(500, failing.url)] * 3  # the replica's own answers, relayed
    assert codes[3][0] == 200 and codes[3][1] != failing.url  # ejected: the session moved
    assert f'rolloutrouter_replica_ejections_total{{backend="{failing.url}",reason="http_5xx"}} 1.0' in metrics


async def test_garbage_replica_gets_502s_and_is_ejected_instead_of_looking_least_loaded(good, http):
    garbage = await BrokenReplica("127.0.0.71", "garbage").start()
    try:
        settings = RouterSettings(backends=[garbage.url, *(r.url for r in good)], health=passive(failures=3))
        async with running_router(settings) as (base, runtime):
            results = []
            while sum(where == garbage.url for _, where, _ in results) < 3 and len(results) < 200:
                results.append(await chat(http, base))  # unkeyed: least-loaded, ties spread over all three
            bad = [(code, body) for code, where, body in results if where == garbage.url]
            assert len(bad) == 3 and all(code == 502 and "invalid response" in body["error"]["message"]
                                         for code, body in bad)
            assert garbage.url not in runtime.replicas.loads()
            after = [await chat(http, base) for _ in range(12)]  # failing fast no longer makes it least loaded
            assert all(code == 200 for code, where, _ in results + after if where != garbage.url)
            assert garbage.url not in {where for _, where, _ in after}
            assert runtime.replicas.total_inflight() == 0 and runtime.balancer.policy.sessions() == 0
            metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
    finally:
        await garbage.stop()
    assert f'rolloutrouter_replica_ejections_total{{backend="{garbage.url}",reason="invalid_response"}} 1.0' in metrics


async def test_a_success_resets_the_failure_streak(good, http):
    flaky = good[0]
    settings = RouterSettings(backends=[flaky.url], first_byte_timeout_seconds=0.2, health=passive(failures=2))
    async with running_router(settings) as (base, runtime):
        replica = runtime.replicas.get(flaky.url)
        runtime.outliers.failure(replica, "timeout")
        assert replica.failures == 1
        assert (await chat(http, base))[0] == 200
        assert replica.failures == 0
        runtime.outliers.failure(replica, "timeout")
        assert flaky.url in runtime.replicas.loads()  # one failure since the success: still in


async def test_max_ejection_percent_keeps_the_rest_in_rotation(good, http):
    broken = [await BrokenReplica(f"127.0.0.{72 + i}", "garbage").start() for i in range(2)]
    try:
        settings = RouterSettings(backends=[b.url for b in broken] + [good[0].url],
                                  health=passive(failures=1, max_ejection_percent=50))  # 3 replicas: 1 may go
        async with running_router(settings) as (base, runtime):
            for index, replica in enumerate(broken):
                pin(runtime, f"s{index}", replica.url)
                assert (await chat(http, base, f"s{index}"))[0] == 502
            loads = runtime.replicas.loads()
            assert broken[0].url not in loads and broken[1].url in loads  # the second stays: 50% of 3 is 1
            assert runtime.replicas.ejected() == 1
    finally:
        for replica in broken:
            await replica.stop()


async def test_a_rejected_first_turn_leaves_no_pin_and_a_rejected_later_turn_keeps_it(good, http):
    settings = RouterSettings(backends=[good[0].url], health=NO_PROBES)
    async with running_router(settings) as (base, runtime):
        good[0].status = 400
        assert (await chat(http, base, "new"))[0] == 400
        assert runtime.balancer.policy.sessions() == 0  # a bad first request pins nothing
        good[0].status = 200
        assert (await chat(http, base, "new"))[0] == 200
        good[0].status = 500
        code, where, _ = await chat(http, base, "new")
        assert code == 500 and runtime.balancer.policy.table.get("new", time.monotonic()) == where  # kept
        assert runtime.balancer.policy.counters.new_sessions == 2


async def test_a_first_turn_that_times_out_leaves_no_pin(good, http):
    hung = await BrokenReplica("127.0.0.74", "hang").start()
    try:
        settings = RouterSettings(backends=[hung.url], first_byte_timeout_seconds=0.2, health=passive(failures=5))
        async with running_router(settings) as (base, runtime):
            assert (await chat(http, base, "first"))[0] == 504
            assert runtime.balancer.policy.sessions() == 0 and runtime.replicas.total_inflight() == 0
    finally:
        await hung.stop()


def probing(**health) -> HealthSettings:
    return HealthSettings(probe_interval_seconds=0.05, probe_timeout_seconds=0.5, **health)


async def test_a_replica_failing_its_probe_leaves_rotation_until_it_passes_and_its_sessions_move(good, http):
    sick = good[0]
    settings = RouterSettings(backends=[r.url for r in good], health=probing())
    async with running_router(settings) as (base, runtime):
        pin(runtime, "s", sick.url)
        sick.healthy = False
        await wait_for(lambda: sick.url not in runtime.replicas.loads())
        code, where, _ = await chat(http, base, "s")
        assert code == 200 and where == good[1].url and runtime.balancer.repinned == {"unhealthy": 1}
        status = await (await http.get(f"{runtime.admin_url}/status")).json()
        assert next(b for b in status["backends"] if b["url"] == sick.url)["healthy"] is False
        sick.healthy = True
        await wait_for(lambda: sick.url in runtime.replicas.loads())
        metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
    assert f'rolloutrouter_health_probe_failures_total{{backend="{sick.url}",reason="bad_status"}}' in metrics
    assert f'rolloutrouter_backend_healthy{{backend="{sick.url}"}} 1.0' in metrics


@pytest.mark.parametrize("mode", ["hang", "garbage", "stopped"])
async def test_probes_take_out_hung_garbage_and_dead_replicas(good, mode):
    broken = await BrokenReplica("127.0.0.75", "garbage" if mode == "garbage" else "hang").start()
    if mode == "stopped":
        await broken.stop()
    try:
        settings = RouterSettings(backends=[broken.url, good[0].url], health=probing())
        async with running_router(settings) as (_, runtime):
            await wait_for(lambda: broken.url not in runtime.replicas.loads())
            assert good[0].url in runtime.replicas.loads()
    finally:
        await broken.stop()


async def test_readyz_turns_red_when_no_replica_is_healthy_and_green_again(good, http):
    settings = RouterSettings(backends=[r.url for r in good], health=probing())
    async with running_router(settings) as (base, runtime):
        assert (await http.get(f"{base}/readyz")).status == 200
        for replica in good:
            replica.healthy = False
        await wait_for(lambda: runtime.replicas.ready_count() == 0)
        async with http.get(f"{base}/readyz") as response:
            assert response.status == 503 and "no replica" in (await response.json())["error"]["message"]
        assert (await chat(http, base, "s"))[0] == 503
        good[1].healthy = True
        await wait_for(lambda: runtime.replicas.ready_count() == 1)
        assert (await http.get(f"{base}/readyz")).status == 200


async def test_a_replica_added_unhealthy_waits_for_its_first_probe(good):
    settings = RouterSettings(backends=[good[0].url], health=probing())
    async with running_router(settings) as (_, runtime):
        runtime.replicas.add(good[1].url, healthy=False)  # e.g. a worker registered at run time
        assert good[1].url not in runtime.replicas.loads()
        runtime.prober.wake()
        await wait_for(lambda: good[1].url in runtime.replicas.loads())
        assert good[1].probes >= 1


async def test_turning_probes_off_live_returns_probe_failed_replicas(good):
    settings = RouterSettings(backends=[r.url for r in good], health=probing())
    async with running_router(settings) as (_, runtime):
        good[0].healthy = False
        await wait_for(lambda: good[0].url not in runtime.replicas.loads())
        runtime.apply(settings.model_copy(update={"health": NO_PROBES}))
        runtime.prober.wake()
        await wait_for(lambda: good[0].url in runtime.replicas.loads())

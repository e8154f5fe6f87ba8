"""The HTTP proxy over real sockets: stickiness, skew, streaming, failures, bad input."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from rollout_router.settings import RouterSettings, SessionSettings
from tests.support import NO_PROBES, running_router, scripted_replicas, wait_for

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
async def replicas():
    async with scripted_replicas(10, 3) as started:
        yield started


async def chat(http, base, session=None, body=None, **kw):
    headers = {"X-Session-ID": session} if session else {}
    async with http.post(f"{base}/v1/chat/completions", json=body or CHAT, headers=headers, **kw) as response:
        return response.status, response.headers.get("X-RolloutRouter-Replica"), await response.json()


async def test_sticky_sessions_stay_on_one_replica(replicas, http):
    settings = RouterSettings(backends=[r.url for r in replicas])
    async with running_router(settings) as (base, runtime):
        served = {s: {(await chat(http, base, s))[1] for _ in range(4)} for s in ("a", "b", "c", "d")}
        assert all(len(where) == 1 for where in served.values()), served
        status = await (await http.get(f"{runtime.admin_url}/status")).json()
    assert status["new_sessions"] == 4 and status["affinity_kept"] == 12 and status["affinity_broken"] == 0
    assert status["sessions"] == 4


async def test_concurrent_new_sessions_spread_over_replicas(replicas, http):
    settings = RouterSettings(backends=[r.url for r in replicas])
    async with running_router(settings) as (base, _):
        results = await asyncio.gather(*(chat(http, base, f"s{i}") for i in range(30)))
    assert {replica for _, replica, _ in results} == {r.url for r in replicas}


async def test_margin_rule_over_real_traffic(replicas, http):
    """skew == margin keeps the pin; skew == margin + 1 moves it to a least-loaded replica."""
    settings = RouterSettings(backends=[r.url for r in replicas], affinity_break_margin=1)
    async with running_router(settings) as (base, runtime):
        _, pinned, _ = await chat(http, base, "conv")
        target = next(r for r in replicas if r.url == pinned)
        target.hold = asyncio.Event()
        runtime.balancer.policy.table.pin("other", pinned, time.monotonic())
        held = [asyncio.ensure_future(chat(http, base, "other"))]
        await wait_for(lambda: target.active == 1)
        held.append(asyncio.ensure_future(chat(http, base, "conv")))  # skew 1 == margin: kept
        await wait_for(lambda: target.active == 2)
        _, moved_to, _ = await chat(http, base, "conv")  # skew 2 > margin: broken
        assert moved_to != pinned and runtime.replicas.loads()[moved_to] == 0
        target.hold.set()
        assert [where for _, where, _ in await asyncio.gather(*held)] == [pinned, pinned]
        assert (await chat(http, base, "conv"))[1] == moved_to  # re-pinned
        status = await (await http.get(f"{runtime.admin_url}/status")).json()
    assert status["affinity_broken"] == 1 and status["affinity_kept"] == 3
    assert status["total_inflight"] == 0


async def test_streaming_passes_through_chunk_by_chunk(replicas, http):
    for r in replicas:
        r.chunks = 5
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        async with http.post(f"{base}/v1/chat/completions", json={**CHAT, "stream": True},
                             headers={"X-Session-ID": "s"}) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            first = await response.content.readuntil(b"\n\n")
            # the first event arrived while the replica is still streaming the rest
            assert json.loads(first[len(b"data: "):])["choices"][0]["delta"]["content"] == "t0 "
            assert runtime.replicas.total_inflight() == 1
            rest = await response.content.read()
        assert rest.endswith(b"data: [DONE]\n\n") and rest.count(b"data: ") == 5
        assert runtime.replicas.total_inflight() == 0


async def test_stream_read_to_done_is_a_success_even_if_the_client_leaves_before_the_end(replicas, http):
    """OpenAI clients hang up at `data: [DONE]`; real vLLM ends its body a moment later."""
    for r in replicas:
        r.linger = 0.5
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        response = await http.post(f"{base}/v1/chat/completions", json={**CHAT, "stream": True})
        while not (await response.content.readuntil(b"\n\n")).startswith(b"data: [DONE]"):
            pass
        response.close()  # hang up before the replica's end of body
        await wait_for(lambda: runtime.replicas.total_inflight() == 0)
        metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
    codes = {line.split('code="')[1].split('"')[0] for line in metrics.splitlines()
             if line.startswith("rolloutrouter_requests_total{")}
    assert codes == {"200"}


async def test_client_disconnect_cancels_upstream_and_releases(replicas, http):
    for r in replicas:
        r.hold = asyncio.Event()
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        request = asyncio.ensure_future(chat(http, base, "gone"))
        await wait_for(lambda: sum(r.active for r in replicas) == 1)
        assert runtime.replicas.total_inflight() == 1
        request.cancel()  # the client hangs up mid-request
        await wait_for(lambda: runtime.replicas.total_inflight() == 0)
        await wait_for(lambda: sum(r.cancelled for r in replicas) == 1)
        assert runtime.balancer.policy.sessions() == 1  # the pin survives
        metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
        assert 'code="499"} 1.0' in metrics


async def test_replica_dying_mid_stream_ends_client_stream_with_error(replicas, http):
    for r in replicas:
        r.chunks, r.die_after = 5, 2
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        async with http.post(f"{base}/v1/chat/completions", json={**CHAT, "stream": True}) as response:
            events = (await response.content.read()).split(b"\n\n")
        assert events[0].startswith(b"data: ") and b"[DONE]" not in b"".join(events)
        error = json.loads(events[-2][len(b"data: "):])["error"]
        assert error["code"] == 502 and "mid-stream" in error["message"]
        assert runtime.replicas.total_inflight() == 0
        metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
    assert 'rolloutrouter_request_errors_total{reason="upstream_broke_mid_response"} 1.0' in metrics


async def test_replica_dying_mid_body_answers_502_json(replicas, http):
    for r in replicas:
        r.die_after = 0
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        code, where, body = await chat(http, base, "s")
        assert code == 502 and "broke off mid-response" in body["error"]["message"]
        assert where in {r.url for r in replicas}
        assert runtime.replicas.total_inflight() == 0 and runtime.balancer.policy.sessions() == 1


async def test_refused_connection_is_retried_elsewhere_and_marked_down(replicas, http):
    dead = replicas[0]
    await dead.stop()
    settings = RouterSettings(backends=[r.url for r in replicas], policy="round_robin", health=NO_PROBES)
    async with running_router(settings) as (base, runtime):  # without probes: the refusal alone marks it down
        results = [await chat(http, base) for _ in range(6)]
        assert all(code == 200 for code, _, _ in results)
        assert dead.url not in {where for _, where, _ in results}
        assert dead.url not in runtime.replicas.loads()  # passive health: skipped for a while
        assert runtime.replicas.total_inflight() == 0
        metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
    assert f'rolloutrouter_upstream_retries_total{{backend="{dead.url}"}} 1.0' in metrics


async def test_sticky_session_on_refusing_replica_is_repinned(replicas, http):
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        _, pinned, _ = await chat(http, base, "s")
        await next(r for r in replicas if r.url == pinned).stop()
        code, moved, _ = await chat(http, base, "s")
        assert code == 200 and moved != pinned
        assert runtime.balancer.policy.counters.repinned_replica_gone == 1


async def test_no_replica_answers_503_json(http):
    async with running_router(RouterSettings()) as (base, _):
        code, _, body = await chat(http, base, "s")
        assert code == 503 and body["error"]["code"] == 503 and "no replica" in body["error"]["message"]
        async with http.get(f"{base}/readyz") as response:
            assert response.status == 503


async def test_all_replicas_refusing_answers_503(replicas, http):
    for r in replicas:
        await r.stop()
    async with running_router(RouterSettings(backends=[r.url for r in replicas], connect_retries=5)) as (base, runtime):
        code, _, body = await chat(http, base, "s")
        assert code == 503 and runtime.replicas.total_inflight() == 0


@pytest.mark.parametrize("case", ["bad_json", "not_object", "oversize", "unknown_path"])
async def test_bad_input_gets_4xx_json_naming_the_problem(replicas, http, case):
    settings = RouterSettings(backends=[r.url for r in replicas], max_body_bytes=2048,
                              session=SessionSettings(body_fields=["session_id"]))
    async with running_router(settings) as (base, runtime):
        url, data, status, words = {
            "bad_json": ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
            "not_object": ("/v1/chat/completions", b"[1, 2]", 400, "JSON object"),
            "oversize": ("/v1/chat/completions", b"x" * 4096, 413, "maxBodyBytes=2048"),
            "unknown_path": ("/v1/nope", b"{}", 404, "/v1/nope"),
        }[case]
        async with http.post(base + url, data=data, headers={"Content-Type": "application/json"}) as response:
            assert response.status == status
            assert words in (await response.json())["error"]["message"]
        assert all(not r.seen for r in replicas) and runtime.replicas.total_inflight() == 0
        assert (await chat(http, base, "still-fine"))[0] == 200  # nothing crashed


async def test_session_key_from_body_field_and_header_precedence(replicas, http):
    settings = RouterSettings(backends=[r.url for r in replicas],
                              session=SessionSettings(headers=["X-Session-ID"], body_fields=["session_id", "user"]))
    async with running_router(settings) as (base, runtime):
        for body in ({**CHAT, "session_id": "b1"}, {**CHAT, "user": "u1"}):
            where = {(await chat(http, base, body=body))[1] for _ in range(3)}
            assert len(where) == 1
        await chat(http, base, "h1", body={**CHAT, "session_id": "ignored"})
        keys = {key for key, _ in runtime.balancer.policy.table}
    assert keys == {"b1", "u1", "h1"}


async def test_delete_session_releases_the_pin(replicas, http):
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        await chat(http, base, "done")
        async with http.delete(f"{runtime.admin_url}/v1/sessions/done") as response:
            assert response.status == 200 and (await response.json())["released"] is True
        async with http.delete(f"{runtime.admin_url}/v1/sessions/done") as response:
            assert response.status == 404 and "done" in (await response.json())["error"]["message"]
        assert runtime.balancer.policy.sessions() == 0
        assert runtime.balancer.policy.counters.released == 1


async def test_headers_query_and_replica_header_forwarded(replicas, http):
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, _):
        async with http.post(f"{base}/v1/chat/completions?trace=1", json=CHAT,
                             headers={"X-Session-ID": "q", "Authorization": "Bearer k", "Connection": "keep-alive"}) as response:
            served_by = response.headers["X-RolloutRouter-Replica"]
            assert (await response.json())["replica"] == served_by
    seen = next(r for r in replicas if r.url == served_by).seen[0]
    assert seen["query"] == "trace=1" and seen["headers"]["Authorization"] == "Bearer k"
    assert seen["headers"]["X-Session-ID"] == "q"


async def test_a_clients_hop_mark_is_never_relayed(replicas, http):
    """The fleet's hop mark is read, never forwarded: a router forwarding to an owner adds its own, so the owner
    reads that one and not one a client sent first (else a forged mark could make two routers forward a turn to
    each other while their views differ); a replica gets none."""
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, _):
        async with http.post(f"{base}/v1/chat/completions", json=CHAT, headers={
                "X-Session-ID": "q", "X-RolloutRouter-Forwarded-By": "http://127.0.0.1:1"}) as response:
            assert response.status == 200
            served_by = response.headers["X-RolloutRouter-Replica"]
    seen = next(r for r in replicas if r.url == served_by).seen[0]
    assert seen["headers"]["X-Session-ID"] == "q" and "X-RolloutRouter-Forwarded-By" not in seen["headers"]


@pytest.mark.parametrize("policy", ["affinity", "consistent_hash"])
async def test_live_session_limits_apply_under_every_session_policy(replicas, http, tmp_path, policy):
    """A reload of maxSessions / idleTimeoutSeconds reaches the pin table whatever the policy."""
    config = tmp_path / "router.yaml"
    config.write_text(json.dumps({"backends": [r.url for r in replicas], "policy": policy}))
    from rollout_router.settings import load_settings
    async with running_router(load_settings(config)) as (base, runtime):
        runtime.config_path = config
        for s in ("a", "b", "c"):
            assert (await chat(http, base, s))[0] == 200
        config.write_text(json.dumps({"backends": [r.url for r in replicas], "policy": policy,
                                      "session": {"maxSessions": 2, "idleTimeoutSeconds": 30}}))
        assert runtime.reload()
        assert runtime.balancer.policy.sessions() == 2 and runtime.balancer.policy.counters.evicted_lru == 1
        assert runtime.balancer.policy.expire(time.monotonic() + 31) == 2


async def test_models_answered_by_a_replica(replicas, http):
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, _):
        async with http.get(f"{base}/v1/models") as response:
            assert response.status == 200 and (await response.json())["data"][0]["id"] == "tiny"


async def test_live_settings_change_keeps_pins(replicas, http, tmp_path):
    config = tmp_path / "router.yaml"
    config.write_text(json.dumps({"backends": [r.url for r in replicas]}))
    from rollout_router.settings import load_settings
    async with running_router(load_settings(config)) as (base, runtime):
        runtime.config_path = config
        pins = {s: (await chat(http, base, s))[1] for s in ("a", "b", "c")}
        config.write_text(json.dumps({"backends": [r.url for r in replicas], "affinityBreakMargin": 0,
                                      "session": {"maxSessions": 50}}))
        assert runtime.reload()
        assert runtime.balancer.policy.margin == 0 and runtime.balancer.policy.table.max_sessions == 50
        assert {s: (await chat(http, base, s))[1] for s in pins} == pins  # idle fleet: every pin kept
        config.write_text(json.dumps({"affinityBreakMargin": -3}))
        assert not runtime.reload()  # rejected, the running settings stay
        config.write_bytes(b"\xff\xfe\n")  # not text at all: rejected the same way (it raised, and killed the poll)
        assert not runtime.reload()
        assert runtime.settings.affinity_break_margin == 0 and runtime.balancer.policy.sessions() == 3
        metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
    assert 'rolloutrouter_config_reloads_total{result="applied"} 1.0' in metrics
    assert 'rolloutrouter_config_reloads_total{result="rejected"} 2.0' in metrics


async def test_metrics_and_status_agree_with_traffic(replicas, http):
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        for _turn in range(3):
            for s in ("x", "y"):
                assert (await chat(http, base, s))[0] == 200
        await chat(http, base)  # unkeyed
        status = await (await http.get(f"{runtime.admin_url}/status")).json()
        metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
    assert status["new_sessions"] == 2 and status["affinity_kept"] == 4 and status["unkeyed"] == 1
    assert {b["url"] for b in status["backends"]} == {r.url for r in replicas}
    assert all(b["inflight"] == 0 for b in status["backends"])
    for line in ("rolloutrouter_affinity_kept_total 4.0", "rolloutrouter_affinity_broken_total 0.0",
                 "rolloutrouter_new_sessions_total 2.0", "rolloutrouter_sessions 2.0",
                 "rolloutrouter_backends_ready 3.0"):
        assert line in metrics, line
    served = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                 if line.startswith("rolloutrouter_requests_total{"))
    assert served == 7
    assert 'rolloutrouter_request_duration_seconds_count{backend="' in metrics
    assert f'rolloutrouter_backend_inflight_requests{{backend="{replicas[0].url}"}} 0.0' in metrics


async def test_unexpected_errors_become_json_500_and_the_router_goes_on(replicas, http, monkeypatch):
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        def broken(*args, **kwargs):
            raise RuntimeError("boom")
        monkeypatch.setattr(runtime.balancer, "take", broken)  # what every route goes through
        code, _, body = await chat(http, base, "s")
        assert code == 500 and body["error"]["code"] == 500 and "boom" not in json.dumps(body)
        monkeypatch.undo()
        assert (await chat(http, base, "s"))[0] == 200


async def test_metadata_paths_never_touch_pins(replicas, http):
    async with running_router(RouterSettings(backends=[r.url for r in replicas])) as (base, runtime):
        for _ in range(3):
            async with http.get(f"{base}/v1/models", headers={"X-Session-ID": "s"}) as response:
                assert response.status == 200
        assert runtime.balancer.policy.sessions() == 0 and runtime.balancer.policy.counters.new_sessions == 0


async def test_non_json_bodies_are_forwarded_even_when_keys_come_from_json(replicas, http):
    settings = RouterSettings(backends=[r.url for r in replicas], session=SessionSettings(body_fields=["session_id"]))
    async with running_router(settings) as (base, runtime):
        form = aiohttp.FormData()
        form.add_field("file", b"RIFF....", filename="a.wav", content_type="audio/wav")
        async with http.post(f"{base}/v1/audio/transcriptions", data=form) as response:
            assert "X-RolloutRouter-Replica" in response.headers  # forwarded, not refused by the router
        assert runtime.replicas.total_inflight() == 0


@pytest.mark.parametrize("policy, sticky", [("consistent_hash", True), ("power_of_two", False)])
async def test_baseline_policies_route_real_traffic(replicas, http, policy, sticky):
    async with running_router(RouterSettings(backends=[r.url for r in replicas], policy=policy)) as (base, runtime):
        served = [(await chat(http, base, "s"))[1] for _ in range(12)]
        assert runtime.balancer.policy.name == policy and runtime.replicas.total_inflight() == 0
    assert (len(set(served)) == 1) if sticky else (len(set(served)) > 1)

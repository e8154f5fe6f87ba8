"""vLLM's own RL routes: each replica asked once which it serves; /v1/rl/* then use them, or fall back.

A replica that serves vLLM 0.32's RL routes (the fake's default) has its engine paused and resumed with the
caller's mode, takes weights through vLLM's weight transfer, and reports its version from the start, which
every answer carries. One from before them (``--rl-routes legacy``) is driven through ``/collective_rpc``.
"""
from __future__ import annotations

import asyncio

from aiohttp import web

from rollout_router.fleet import rlengines
from rollout_router.settings import parse_settings
from tests.support import running_router, wait_for
from tests.test_fakevllm import words
from tests.test_rl import ask, call, fleet_of, scripted


async def _asked(http, admin: str, count: int) -> list[dict]:
    """The workers, once the router asked each which RL routes it serves."""
    listed: dict = {}

    async def asked() -> bool:
        nonlocal listed
        listed = (await call(http, "GET", f"{admin}/v1/rl/workers"))[1]
        return sum(w["routes"] is not None for w in listed["workers"]) == count
    for _ in range(500):
        if await asked():
            return listed["workers"]
        await asyncio.sleep(0.01)
    raise AssertionError(f"the router never asked its replicas: {listed}")


async def test_answers_carry_the_serving_replicas_version_from_the_first_one(http):
    """The version is read when the replica joins (vLLM's GET /weight_info), not only after an update."""
    async with fleet_of(2) as (base, runtime, replicas):
        workers = await _asked(http, runtime.admin_url, 2)
        assert {(w["url"], w["routes"], w["weight_version"]) for w in workers} == \
            {(url, "native", "default") for url, _ in replicas}
        for session in ("a", "b", "c", "d"):
            status, _, headers = await ask(http, base, words(5), session=session)
            assert status == 200 and headers["X-Weight-Version"] == "default"
        async with http.post(f"{base}/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": True}) as answer:
            assert answer.headers["X-Weight-Version"] == "default"
            await answer.read()
        status, document = await call(http, "GET", f"{runtime.admin_url}/status")
        assert document["rl"]["routes"] == {url: "native" for url, _ in replicas}


async def test_pause_and_resume_reach_the_engines_own_routes_and_keep_their_caches(http):
    async with fleet_of(2) as (base, runtime, replicas):
        admin = runtime.admin_url
        prompt = words(64)
        await ask(http, base, prompt, session="s")
        status, body = await call(http, "POST", f"{admin}/v1/rl/pause", {"mode": "wait"})
        assert status == 200, body
        assert {(w["url"], w["status"], w["routes"], w["engine_paused"]) for w in body["workers"]} == \
            {(url, "ok", "native", True) for url, _ in replicas}
        for url, _ in replicas:
            assert await call(http, "GET", f"{url}/is_paused") == (200, {"is_paused": True})
        status, body = await call(http, "POST", f"{admin}/v1/rl/resume")
        assert status == 200 and {w["status"] for w in body["workers"]} == {"ok"}
        for url, _ in replicas:
            assert await call(http, "GET", f"{url}/is_paused") == (200, {"is_paused": False})
        _, warm, _ = await ask(http, base, prompt, session="s")
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # a pause alone keeps the cache


async def test_the_engines_pause_gets_the_callers_mode(http):
    """What vLLM's /pause receives: the mode asked for, and clear_cache=false (the update resets, if asked)."""
    seen: list[dict] = []

    async def pause(request: web.Request) -> web.Response:
        seen.append(dict(request.query))
        return web.json_response({"status": "paused"})

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"weight_version": "v0", "status": "ok", "aborted": 0})
    app = web.Application()
    for path in ("/pause", "/resume", "/abort_requests"):
        app.router.add_post(path, pause if path == "/pause" else ok)
    app.router.add_get("/weight_info", ok)
    app.router.add_get("/health", ok)
    async with scripted(app, "127.0.0.55") as url, \
            running_router(parse_settings({"backends": [url]})) as (_, runtime):
        for mode in ("abort", "wait"):
            assert (await call(http, "POST", f"{runtime.admin_url}/v1/rl/pause", {"mode": mode}))[0] == 200
            assert (await call(http, "POST", f"{runtime.admin_url}/v1/rl/resume"))[0] == 200
    assert seen == [{"mode": "abort", "clear_cache": "false"}, {"mode": "wait", "clear_cache": "false"}]


async def test_update_info_goes_through_vllms_weight_transfer(http):
    async with fleet_of(2) as (base, runtime, replicas):
        admin = runtime.admin_url
        _, before, _ = await ask(http, base, words(30), session="s")
        update = {"update_info": {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[4]]},
                  "weight_version": "step-5"}
        status, body = await call(http, "POST", f"{admin}/v1/rl/update_weights", update)
        assert status == 502 and "Weight transfer not configured" in body["error"]["message"]
        assert body["paused"] is True and runtime.rl.paused
        status, body = await call(http, "POST", f"{admin}/v1/rl/engine/init_weight_transfer_engine",
                                  {"init_info": {"master_port": 1}})
        assert status == 200, body
        status, body = await call(http, "POST", f"{admin}/v1/rl/update_weights", update)
        assert status == 200, body
        assert {(w["url"], w["status"], w["routes"], w["weight_version"]) for w in body["workers"]} == \
            {(url, "ok", "native", "step-5") for url, _ in replicas}
        assert (await call(http, "POST", f"{admin}/v1/rl/resume"))[0] == 200  # the caller's pause (the 502's)
        _, after, headers = await ask(http, base, words(30), session="s")
        assert headers["X-Weight-Version"] == "step-5"
        assert after["choices"][0]["message"]["content"] != before["choices"][0]["message"]["content"]


async def test_a_vllm_without_its_rl_routes_is_driven_through_collective_rpc(http):
    async with fleet_of(2, rl_routes="legacy") as (base, runtime, replicas):
        admin = runtime.admin_url
        workers = await _asked(http, admin, 2)
        assert {(w["routes"], w["weight_version"]) for w in workers} == {("legacy", None)}
        _, before, headers = await ask(http, base, words(30), session="s")
        assert "X-Weight-Version" not in headers  # the replica cannot say
        status, body = await call(http, "POST", f"{admin}/v1/rl/pause")
        assert status == 200 and {(w["routes"], w["engine_paused"]) for w in body["workers"]} == {("legacy", False)}
        status, body = await call(http, "POST", f"{admin}/v1/rl/update_weights",
                                  {"model_path": "/ckpt/step-2", "weight_version": "step-2"})
        assert status == 200, body
        assert {(w["routes"], w["weight_version"], w["prefix_cache_reset"]) for w in body["workers"]} == \
            {("legacy", "step-2", True)}
        assert (await call(http, "POST", f"{admin}/v1/rl/resume"))[0] == 200
        _, after, headers = await ask(http, base, words(30), session="s")
        assert headers["X-Weight-Version"] == "step-2"  # the router's word for it
        assert after["choices"][0]["message"]["content"] != before["choices"][0]["message"]["content"]
        status, body = await call(http, "POST", f"{admin}/v1/rl/update_weights", {"update_info": {"names": []}})
        assert status == 502 and sorted(body["failed"]) == sorted(url for url, _ in replicas)
        assert "serves no /update_weights" in body["error"]["message"] and "model_path" in body["error"]["message"]


async def test_bad_update_info_is_a_400_naming_it(http):
    async with fleet_of(1) as (_, runtime, _):
        for document in ({"update_info": "w"}, {"update_info": []}, {"update_info": [3]},
                         {"update_info": {}, "model_path": "/c"}):
            status, body = await call(http, "POST", f"{runtime.admin_url}/v1/rl/update_weights", document)
            assert (status, body["error"]["param"]) == (400, "update_info"), document
        assert not runtime.rl.paused


async def test_a_replica_that_leaves_is_forgotten_and_asked_again_when_it_returns(http):
    async with fleet_of(2) as (_, runtime, replicas):
        await _asked(http, runtime.admin_url, 2)
        gone = replicas[0][0]
        runtime.replicas.remove(gone)
        await wait_for(lambda: gone not in runtime.rl.routes.kinds and gone not in runtime.rl.versions, 5)
        runtime.replicas.add(gone)
        await wait_for(lambda: runtime.rl.versions.get(gone) == "default", 5)


async def test_with_active_probes_off_a_replica_is_asked_only_by_the_first_fan_out(http, monkeypatch):
    """probeIntervalSeconds: null sends a replica nothing in the background; the first RL call asks it."""
    monkeypatch.setattr(rlengines, "WATCH_INTERVAL_SECONDS", 0.01)
    seen: list[str] = []

    @web.middleware
    async def record(request: web.Request, handler):  # type: ignore[no-untyped-def]
        seen.append(request.path)
        return await handler(request)

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"weight_version": "v7"})

    async def pause(request: web.Request) -> web.Response:
        return web.json_response({"status": "paused"})
    quiet = web.Application(middlewares=[record])
    quiet.router.add_get("/weight_info", info)
    quiet.router.add_post("/pause", pause)
    async with scripted(quiet, "127.0.0.56") as target, running_router(parse_settings(
            {"backends": [target], "health": {"probeIntervalSeconds": None}})) as (_, runtime):
        await asyncio.sleep(0.3)  # an absence is watched for a while: about 30 passes of the background asking
        assert seen == [] and runtime.rl.versions == {}
        assert (await call(http, "POST", f"{runtime.admin_url}/v1/rl/pause"))[0] == 200
        assert seen == ["/weight_info", "/pause"] and runtime.rl.versions == {target: "v7"}


async def test_pause_keep_freezes_the_requests_in_flight_and_resume_finishes_them(http):
    """vLLM's keep mode: the pause answers at once with the request in flight still counted (frozen in the engine,
    not drained, not aborted); while paused it makes no progress; after resume it ends normally."""
    async with fleet_of(1, step_base_ms=20.0) as (base, runtime, replicas):
        admin, (url, _) = runtime.admin_url, replicas[0]
        await _asked(http, admin, 1)
        async with http.post(f"{base}/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 40,
                "stream": True}) as answer:
            first = await answer.content.readline()  # the stream runs: one chunk is out
            assert first.startswith(b"data: ")
            status, body = await call(http, "POST", f"{admin}/v1/rl/pause?mode=keep")
            assert status == 200 and (body["mode"], body["inflight"]) == ("keep", 1), body
            assert [(w["routes"], w["engine_paused"]) for w in body["workers"]] == [("native", True)]
            assert await call(http, "GET", f"{url}/is_paused") == (200, {"is_paused": True})
            assert runtime.replicas.total_inflight() == 1
            # frozen: over 15 of its 20 ms steps, only what was sent or under way when the pause came arrives
            during = await _chunks_within(answer, 0.3)
            assert len(during) <= 2, during
            status, _ = await call(http, "POST", f"{admin}/v1/rl/resume")
            assert status == 200
            rest = (first + b"".join(during) + await answer.content.read()).decode()
        assert '"finish_reason":"length"' in rest.replace(" ", "") and "data: [DONE]" in rest, rest[-300:]
        await wait_for(lambda: runtime.replicas.total_inflight() == 0)


async def test_pause_keep_names_each_replica_that_cannot_freeze_its_requests(http):
    """A vLLM from before its RL routes has no /pause: keep fails there, named, and dispatch stays paused."""
    async with fleet_of(1, rl_routes="legacy") as (base, runtime, replicas):
        await _asked(http, runtime.admin_url, 1)
        status, body = await call(http, "POST", f"{runtime.admin_url}/v1/rl/pause", {"mode": "keep"})
        assert status == 502 and runtime.rl.paused, body
        assert f"{replicas[0][0]} serves no /pause" in body["error"]["message"]
        status, body = await call(http, "POST", f"{runtime.admin_url}/v1/rl/pause", {"mode": "freeze"})
        assert status == 400 and "wait" in body["error"]["message"] and "keep" in body["error"]["message"]


async def _chunks_within(answer, seconds: float) -> list[bytes]:
    """The lines a stream delivers within ``seconds`` (a frozen one: only those already on their way)."""
    lines: list[bytes] = []
    deadline = asyncio.get_running_loop().time() + seconds
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        try:
            line = await asyncio.wait_for(answer.content.readline(), left)
        except TimeoutError:
            break
        if line.strip():
            lines.append(line)
    return lines

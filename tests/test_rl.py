"""The RL step's fleet operations (/v1/rl/*) against fake vLLM replicas over real sockets."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web

from rollout_router.fakevllm.api import ENGINE
from rollout_router.proxy.http.admin_listener import TokenFile
from rollout_router.settings import RouterSettings, parse_settings
from tests.support import running_router, wait_for
from tests.test_fakevllm import samples, serving, words


def chat(content: str, max_tokens: int = 8) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}


async def call(http: aiohttp.ClientSession, method: str, url: str, body: object = None,
               **kw: object) -> tuple[int, dict]:
    async with http.request(method, url, json=body, **kw) as answer:
        return answer.status, await answer.json()


async def ask(http: aiohttp.ClientSession, base: str, content: str, max_tokens: int = 8,
              session: str | None = None) -> tuple[int, dict, aiohttp.typedefs.LooseHeaders]:
    headers = {"X-Session-ID": session} if session else {}
    async with http.post(f"{base}/v1/chat/completions", json=chat(content, max_tokens), headers=headers) as answer:
        return answer.status, await answer.json(), answer.headers


@contextlib.asynccontextmanager
async def scripted(app: web.Application, host: str) -> AsyncIterator[str]:
    """A scripted replica (an aiohttp app) served on ``host``: its URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    try:
        yield f"http://{host}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def fleet_of(count: int, rl: dict | None = None, **knobs: object) -> AsyncIterator[tuple[str, object, list]]:
    """``count`` fake vLLM replicas behind one router: (traffic URL, runtime, [(replica URL, app)])."""
    async with contextlib.AsyncExitStack() as stack:
        replicas = [await stack.enter_async_context(serving(f"127.0.0.{40 + i}", **knobs)) for i in range(count)]
        settings = parse_settings({"backends": [url for url, _ in replicas], "rl": rl or {}})
        base, runtime = await stack.enter_async_context(running_router(settings))
        yield base, runtime, replicas


async def test_rl_routes_want_the_admin_token(tmp_path: Path, http):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    async with running_router(RouterSettings(), admin_token=TokenFile(token)) as (_, runtime):
        for method, path in (("POST", "/v1/rl/pause"), ("POST", "/v1/rl/resume"),
                             ("POST", "/v1/rl/update_weights"), ("GET", "/v1/rl/workers")):
            status, body = await call(http, method, f"{runtime.admin_url}{path}")
            assert status == 401, path
        assert not runtime.rl.paused
        status, body = await call(http, "POST", f"{runtime.admin_url}/v1/rl/pause",
                                  headers={"Authorization": "Bearer s3cret"})
        assert (status, body["status"]) == (200, "paused")


async def test_pause_wait_answers_once_in_flight_requests_finished_and_resume_dispatches_the_queued(http):
    async with fleet_of(2, step_base_ms=10.0) as (base, runtime, replicas):
        admin = runtime.admin_url
        running = asyncio.create_task(ask(http, base, words(10), max_tokens=40))
        await wait_for(lambda: runtime.replicas.total_inflight() == 1)
        status, body = await call(http, "POST", f"{admin}/v1/rl/pause", {"mode": "wait"})
        assert (status, body["status"], body["mode"], body["inflight"]) == (200, "paused", "wait", 0)
        assert running.done() and running.result()[0] == 200  # it finished before the pause answered
        assert running.result()[1]["choices"][0]["finish_reason"] == "length"
        queued = asyncio.create_task(ask(http, base, words(12)))
        await wait_for(lambda: runtime.rl.queued == 1)
        assert not any(app[ENGINE]._streams for _, app in replicas)  # held in the router, not sent
        status, body = await call(http, "POST", f"{admin}/v1/rl/resume")
        assert (status, body["status"], body["released"]) == (200, "resumed", 1)
        assert (await queued)[0] == 200
        status, document = await call(http, "GET", f"{admin}/status")
        assert document["rl"]["queue"] == {"queued": 1, "dispatched": 1}
        assert document["rl"]["last"]["pause"]["outcome"] == "ok"
        async with http.get(f"{admin}/metrics") as answer:
            text = await answer.text()
        assert 'rolloutrouter_rl_queue_requests_total{outcome="dispatched"} 1.0' in text
        assert "rolloutrouter_rl_paused 0.0" in text
        assert 'rolloutrouter_rl_operations_total{operation="pause",outcome="ok"} 1.0' in text


async def test_beyond_the_queue_or_the_pause_bound_requests_get_503_with_retry_after(http):
    async with fleet_of(1, rl={"maxQueuedRequests": 1, "maxPauseSeconds": 0.5}) as (base, runtime, _):
        assert (await call(http, "POST", f"{runtime.admin_url}/v1/rl/pause"))[0] == 200
        first = asyncio.create_task(ask(http, base, words(5)))
        await wait_for(lambda: runtime.rl.queued == 1)
        status, body, headers = await ask(http, base, words(6))
        assert status == 503 and headers["Retry-After"] == "1"
        assert "rl.maxQueuedRequests=1" in body["error"]["message"]
        status, body, headers = await first
        assert status == 503 and headers["Retry-After"] == "1"
        assert "rl.maxPauseSeconds=0.5" in body["error"]["message"]
        assert dict(runtime.rl.queue) == {"full": 1, "queued": 1, "timeout": 1}
        assert runtime.replicas.total_inflight() == 0


async def test_pause_abort_uses_the_replicas_abort_and_leaks_no_in_flight_count(http):
    async with fleet_of(2, step_base_ms=20.0) as (base, runtime, replicas):
        running = [asyncio.create_task(ask(http, base, words(10 + i), max_tokens=2000)) for i in range(3)]
        await wait_for(lambda: runtime.replicas.total_inflight() == 3)
        status, body = await call(http, "POST", f"{runtime.admin_url}/v1/rl/pause?mode=abort")
        assert (status, body["mode"], body["inflight"]) == (200, "abort", 0)
        assert sorted(w["url"] for w in body["workers"]) == sorted(url for url, _ in replicas)
        assert {w["status"] for w in body["workers"]} == {"ok"}
        for task in running:
            status, answer, _ = await task
            assert status == 200 and answer["choices"][0]["finish_reason"] == "abort"
        assert runtime.replicas.total_inflight() == 0
        assert all(replica.inflight == 0 for replica in runtime.replicas.replicas())


async def test_update_weights_fans_out_and_answers_per_replica_with_the_new_versions(http):
    async with fleet_of(2) as (base, runtime, replicas):
        admin = runtime.admin_url
        prompt = words(40)
        _, before, _ = await ask(http, base, prompt, session="s1")
        _, warm, _ = await ask(http, base, prompt, session="s1")
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        status, body = await call(http, "POST", f"{admin}/v1/rl/update_weights",
                                  {"model_path": "/ckpt/step-2", "weight_version": "step-2"})
        assert status == 200, body
        assert (body["success"], body["weight_version"], body["paused"], body["failed"]) == (True, "step-2", False, [])
        assert body["epoch"]["start"] == body["epoch"]["end"]
        assert {(w["url"], w["status"], w["weight_version"], w["prefix_cache_reset"]) for w in body["workers"]} == \
            {(url, "ok", "step-2", True) for url, _ in replicas}
        status, after, headers = await ask(http, base, prompt, session="s1")
        assert headers["X-Weight-Version"] == "step-2"
        assert after["choices"][0]["message"]["content"] != before["choices"][0]["message"]["content"]
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the caches were reset
        status, listed = await call(http, "GET", f"{admin}/v1/rl/workers")
        assert {(w["url"], w["weight_version"]) for w in listed["workers"]} == {(url, "step-2") for url, _ in replicas}
        assert (listed["paused"], listed["weight_version"]) == (False, "step-2")
        assert runtime.balancer.pinned("s1") is not None  # rl.onWeightUpdate: keep (the default)
        status, document = await call(http, "GET", f"{admin}/status")
        assert document["rl"]["last"]["update"]["outcome"] == "ok"
        assert document["rl"]["weightVersion"] == "step-2"


async def test_an_sglang_fleet_is_updated_through_its_own_update_weights_from_disk(http):
    """engine: sglang calls SGLang's one route (weights, version, cache flush) and reads get_model_info back."""
    async with fleet_of(2) as (base, runtime, replicas):
        prompt = words(40)
        _, before, _ = await ask(http, base, prompt, session="s1")
        status, body = await call(http, "POST", f"{runtime.admin_url}/v1/rl/update_weights",
                                  {"model_path": "/ckpt/step-3", "weight_version": "step-3", "engine": "sglang"})
        assert status == 200, body
        assert {(w["url"], w["status"], w["weight_version"]) for w in body["workers"]} == \
            {(url, "ok", "step-3") for url, _ in replicas}
        _, after, headers = await ask(http, base, prompt, session="s1")
        assert headers["X-Weight-Version"] == "step-3"
        assert after["choices"][0]["message"]["content"] != before["choices"][0]["message"]["content"]
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # flush_cache, SGLang's default
        for document, param in (({"weight_version": "v", "engine": "sglang"}, "model_path"),
                                ({"model_path": "/c", "engine": "trtllm"}, "engine")):
            status, refused = await call(http, "POST", f"{runtime.admin_url}/v1/rl/update_weights", document)
            assert status == 400 and refused["error"]["param"] == param, refused


async def test_on_weight_update_clear_drops_the_pins_and_counts_them(http):
    async with fleet_of(2, rl={"onWeightUpdate": "clear"}) as (base, runtime, _):
        for session in ("a", "b", "c"):
            await ask(http, base, words(5), session=session)
        status, _ = await call(http, "POST", f"{runtime.admin_url}/v1/rl/update_weights", {"weight_version": "v2"})
        assert status == 200
        assert [runtime.balancer.pinned(key) for key in ("a", "b", "c")] == [None, None, None]
        assert runtime.rl.pins_cleared == 3
        async with http.get(f"{runtime.admin_url}/metrics") as answer:
            assert samples(await answer.text())[("rolloutrouter_rl_pins_cleared_total", "")] == 3


async def test_a_failed_replica_is_named_in_a_502_and_dispatch_stays_paused(http):
    async with serving("127.0.0.50") as (good, _):
        settings = parse_settings({"backends": [good, "http://127.0.0.51:9"]})  # nothing listens on the second
        async with running_router(settings) as (base, runtime):
            status, body = await call(http, "POST", f"{runtime.admin_url}/v1/rl/update_weights",
                                      {"model_path": "/ckpt/2"})
            assert status == 502
            assert body["failed"] == ["http://127.0.0.51:9"]
            assert "http://127.0.0.51:9" in body["error"]["message"] and "stays paused" in body["error"]["message"]
            assert {w["url"]: w["status"] for w in body["workers"]} == {good: "ok", "http://127.0.0.51:9": "failed"}
            assert runtime.rl.paused and body["paused"] is True
            assert runtime.rl.last["update"]["outcome"] == "failed"


async def test_a_replica_that_joins_during_the_fan_out_is_reported(http):
    """A replica whose weight reload blocks; another joins meanwhile: the membership epoch moved, it is named."""
    reloading, release = asyncio.Event(), asyncio.Event()

    async def reload(request: web.Request) -> web.Response:
        reloading.set()
        await release.wait()
        return web.json_response({"results": [None]})

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"weight_version": "default"})
    app = web.Application()
    app.router.add_post("/collective_rpc", reload)
    app.router.add_get("/weight_info", version)
    app.router.add_get("/health", version)
    async with scripted(app, "127.0.0.52") as slow, \
            running_router(parse_settings({"backends": [slow]})) as (_, runtime):
        update = asyncio.create_task(call(http, "POST", f"{runtime.admin_url}/v1/rl/update_weights",
                                          {"model_path": "/ckpt/2", "reset_prefix_cache": False}))
        await reloading.wait()
        runtime.replicas.add("http://127.0.0.53:9", None, "api")
        release.set()
        status, body = await update
        assert status == 502
        assert {w["url"]: w["status"] for w in body["workers"]} == {slow: "ok", "http://127.0.0.53:9": "joined"}
        assert body["epoch"]["end"] == body["epoch"]["start"] + 1
        assert "joined" in body["error"]["message"]


async def test_bad_input_is_a_4xx_naming_the_problem(http):
    async with fleet_of(1) as (_, runtime, _):
        admin = runtime.admin_url
        cases = [
            ("/v1/rl/pause", {"mode": "later"}, 400, "mode"),
            ("/v1/rl/pause", {"timeout": -1}, 400, "timeout"),
            ("/v1/rl/update_weights", {}, 400, "model_path"),
            ("/v1/rl/update_weights", {"model_path": 3}, 400, "model_path"),
            ("/v1/rl/update_weights", {"weight_version": "v", "reset_prefix_cache": "yes"}, 400, "reset_prefix_cache"),
            ("/v1/rl/update_weights", {"weight_version": "v", "colour": "red"}, 400, "colour"),
            ("/v1/rl/update_weights", {"weight_version": "v1\r\nX-Forged: yes"}, 400, "weight_version"),
            ("/v1/rl/update_weights", {"weight_version": "v" * 257}, 400, "weight_version"),
            ("/v1/rl/engine/a.b", {}, 400, "path"),
            ("/v1/rl/engine/reset_prefix_cache%0A", {}, 400, "path"),  # match() with $ took the newline
            ("/v1/rl/pause", {"Mode": "abort"}, 400, "Mode"),  # misspelt: it paused in wait mode
            ("/v1/rl/pause?mode=abort", {"mode": "wait"}, 400, "mode"),
            ("/v1/rl/resume", {"mode": "abort"}, 400, "mode"),
            ("/fleet/v1/rl", {"paused": True}, 400, "epoch"),
            ("/fleet/v1/rl", {"epoch": [], "paused": True}, 400, "epoch"),  # answered 200, adopted nothing
            ("/fleet/v1/rl", {"epoch": ["x", 5], "paused": True}, 400, "epoch"),
            ("/fleet/v1/rl", {"epoch": [100, "x"], "paused": True, "mode": "bogus"}, 400, "mode"),  # was adopted
        ]
        for path, body, code, param in cases:
            status, answer = await call(http, "POST", f"{admin}{path}", body)
            assert (status, answer["error"]["param"]) == (code, param), (path, body, answer)
        async with http.post(f"{admin}/v1/rl/update_weights", data=b"{not json") as answer:
            assert answer.status == 400 and "not valid JSON" in (await answer.json())["error"]["message"]
        assert not runtime.rl.paused


async def test_engine_route_fans_any_engine_call_out(http):
    async with fleet_of(2) as (_, runtime, replicas):
        status, body = await call(http, "POST", f"{runtime.admin_url}/v1/rl/engine/update_weight_version",
                                  {"new_version": "v9"})
        assert status == 200 and body["path"] == "/update_weight_version"
        assert [w["answer"] for w in body["workers"]] == [{"success": True, "new_version": "v9"}] * 2
        assert {app[ENGINE].weight_version for _, app in replicas} == {"v9"}


async def test_abort_is_repeated_for_a_request_the_engine_had_not_admitted_yet(http):
    """vLLM aborts only admitted requests: the first round misses one still being read; the next round ends it."""
    aborts: list[int] = []
    admitted = asyncio.Event()

    async def chat_held(request: web.Request) -> web.Response:
        await admitted.wait()
        return web.json_response({"choices": [{"index": 0, "finish_reason": "abort",
                                               "message": {"role": "assistant", "content": ""}}]})

    async def abort(request: web.Request) -> web.Response:
        aborts.append(len(aborts))
        if len(aborts) == 1:
            return web.json_response({"status": "aborted", "aborted": 0})  # not admitted yet
        admitted.set()
        return web.json_response({"status": "aborted", "aborted": 1})

    async def health(request: web.Request) -> web.Response:
        return web.Response()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat_held)
    app.router.add_post("/abort_requests", abort)
    app.router.add_get("/health", health)
    async with scripted(app, "127.0.0.54") as url, \
            running_router(parse_settings({"backends": [url]})) as (base, runtime):
        held = asyncio.create_task(ask(http, base, "x"))
        await wait_for(lambda: runtime.replicas.total_inflight() == 1)
        status, body = await call(http, "POST", f"{runtime.admin_url}/v1/rl/pause", {"mode": "abort"})
        assert (status, body["inflight"], [w["aborted"] for w in body["workers"]]) == (200, 0, [1])
        assert len(aborts) == 2
        assert (await held)[1]["choices"][0]["finish_reason"] == "abort"


async def test_the_traffic_port_names_the_admin_listener_for_rl_routes(http):
    async with fleet_of(1) as (base, runtime, _):
        status, body = await call(http, "POST", f"{base}/v1/rl/pause")
        assert status == 404 and "admin listener" in body["error"]["message"]
        assert not runtime.rl.paused

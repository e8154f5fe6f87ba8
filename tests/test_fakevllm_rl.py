"""The fake replica's RL engine routes: the shapes of the pinned vLLM's dev-mode routes, and what they do."""
from __future__ import annotations

import asyncio

import aiohttp

from rollout_router.fakevllm.api import ENGINE
from tests.support import wait_for
from tests.test_fakevllm import samples, serving, words


async def chat(session: aiohttp.ClientSession, url: str, content: str, max_tokens: int = 8) -> dict:
    async with session.post(f"{url}/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}) as answer:
        assert answer.status == 200, await answer.text()
        return await answer.json()


async def call(session: aiohttp.ClientSession, method: str, url: str, body: object = None) -> tuple[int, dict]:
    async with session.request(method, url, json=body) as answer:
        return answer.status, await answer.json()


async def test_weight_reload_changes_the_answers_and_the_version_is_set_apart():
    async with serving() as (url, app), aiohttp.ClientSession() as session:
        before = (await chat(session, url, words(20)))["choices"][0]["message"]["content"]
        assert await call(session, "GET", f"{url}/weight_info") == (200, {"weight_version": "default"})
        assert await call(session, "POST", f"{url}/collective_rpc", {
            "method": "reload_weights", "kwargs": {"weights_path": "/models/step-2"}}) == (200, {"results": [None]})
        after = (await chat(session, url, words(20)))["choices"][0]["message"]["content"]
        assert after != before
        assert await call(session, "GET", f"{url}/weight_info") == (200, {"weight_version": "default"})
        assert await call(session, "POST", f"{url}/update_weight_version", {"new_version": "step-2"}) == (
            200, {"success": True, "new_version": "step-2"})
        assert await call(session, "GET", f"{url}/weight_info") == (200, {"weight_version": "step-2"})


async def test_reset_prefix_cache_empties_the_cache_and_counts():
    async with serving() as (url, app), aiohttp.ClientSession() as session:
        prompt = words(64)
        await chat(session, url, prompt)
        warm = await chat(session, url, prompt)
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert await call(session, "POST", f"{url}/reset_prefix_cache") == (200, {"success": True})
        cold = await chat(session, url, prompt)
        assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        async with session.get(f"{url}/metrics") as answer:
            assert samples(await answer.text())[("fakevllm:prefix_cache_resets_total", "")] == 1


async def test_pause_holds_new_requests_until_resume():
    async with serving() as (url, app), aiohttp.ClientSession() as session:
        assert await call(session, "POST", f"{url}/pause?mode=wait") == (200, {"status": "paused"})
        assert await call(session, "GET", f"{url}/is_paused") == (200, {"is_paused": True})
        held = asyncio.create_task(chat(session, url, words(10)))
        await asyncio.sleep(0)  # the request is sent; it cannot finish while paused
        assert not held.done()
        assert await call(session, "POST", f"{url}/resume") == (200, {"status": "resumed"})
        assert (await held)["choices"][0]["finish_reason"] == "length"
        assert await call(session, "GET", f"{url}/is_paused") == (200, {"is_paused": False})


async def test_abort_ends_requests_in_flight_with_finish_reason_abort():
    async with serving(step_base_ms=20.0) as (url, app), aiohttp.ClientSession() as session:
        engine = app[ENGINE]
        running = asyncio.create_task(chat(session, url, words(10), max_tokens=2000))
        await wait_for(lambda: engine.scheduler.running)
        assert await call(session, "POST", f"{url}/abort_requests", {}) == (200, {"status": "aborted", "aborted": 1})
        answer = await running
        assert answer["choices"][0]["finish_reason"] == "abort"
        assert answer["usage"]["completion_tokens"] < 2000
        assert not engine.scheduler.running and engine.pool.num_used == 0


async def test_bad_engine_calls_are_4xx_or_5xx_with_json():
    async with serving() as (url, app), aiohttp.ClientSession() as session:
        status, body = await call(session, "POST", f"{url}/pause?mode=later")
        assert status == 400 and "mode" in body["error"]["message"]
        status, body = await call(session, "POST", f"{url}/collective_rpc", {"kwargs": {}})
        assert status == 400 and "method" in body["error"]["message"]
        status, body = await call(session, "POST", f"{url}/update_weight_version", {})
        assert status == 422 and body["error"]["param"] == "new_version"


async def test_weight_transfer_session_in_vllms_order_sets_weights_and_version():
    async with serving() as (url, app), aiohttp.ClientSession() as session:
        before = (await chat(session, url, words(20)))["choices"][0]["message"]["content"]
        status, body = await call(session, "POST", f"{url}/start_weight_update")
        assert status == 500 and "Weight transfer not configured" in body["error"]["message"]
        assert await call(session, "POST", f"{url}/init_weight_transfer_engine", {"init_info": {"port": 1}}) == (
            200, {"message": "Weight transfer initialized"})
        status, body = await call(session, "POST", f"{url}/update_weights", {"update_info": {"names": ["w"]}})
        assert status == 500 and "start_weight_update must be called" in body["error"]["message"]
        assert await call(session, "POST", f"{url}/start_weight_update") == (200, {"message": "Weight update started"})
        assert await call(session, "POST", f"{url}/update_weights", {"update_info": {"names": ["w"]}}) == (
            200, {"message": "Weights updated"})
        assert await call(session, "POST", f"{url}/finish_weight_update", {"weight_version": "step-4"}) == (
            200, {"message": "Weight update finished"})
        assert await call(session, "GET", f"{url}/weight_info") == (200, {"weight_version": "step-4"})
        assert (await chat(session, url, words(20)))["choices"][0]["message"]["content"] != before


async def test_pause_wait_answers_once_the_requests_in_flight_finished_and_may_keep_the_cache():
    async with serving(step_base_ms=5.0) as (url, app), aiohttp.ClientSession() as session:
        prompt = words(64)
        await chat(session, url, prompt)
        running = asyncio.create_task(chat(session, url, words(10), max_tokens=30))
        await wait_for(lambda: app[ENGINE].running() == 1)
        assert await call(session, "POST", f"{url}/pause?mode=wait&clear_cache=false") == (200, {"status": "paused"})
        assert app[ENGINE].running() == 0  # the engine finished it (its answer may still be on its way)
        assert (await running)["choices"][0]["finish_reason"] == "length"
        assert await call(session, "POST", f"{url}/resume") == (200, {"status": "resumed"})
        warm = await chat(session, url, prompt)
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # clear_cache=false kept it
        await call(session, "POST", f"{url}/pause?mode=wait")  # vLLM's default clears it
        await call(session, "POST", f"{url}/resume")
        assert (await chat(session, url, prompt))["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_legacy_rl_routes_serve_only_the_dev_routes():
    """--rl-routes legacy: a vLLM from before its RL routes (404 for each), its dev routes still there."""
    async with serving(rl_routes="legacy") as (url, app), aiohttp.ClientSession() as session:
        for method, path in (("GET", "/weight_info"), ("POST", "/pause"), ("POST", "/resume"),
                             ("GET", "/is_paused"), ("POST", "/update_weights"), ("POST", "/abort_requests")):
            async with session.request(method, f"{url}{path}", json={}) as answer:
                assert answer.status == 404, path
        assert await call(session, "POST", f"{url}/collective_rpc", {
            "method": "reload_weights", "kwargs": {"weights_path": "/m"}}) == (200, {"results": [None]})
        assert await call(session, "POST", f"{url}/reset_prefix_cache") == (200, {"success": True})

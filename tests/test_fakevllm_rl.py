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

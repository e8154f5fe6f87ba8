"""Three routers, one RL state: a call to any router pauses, updates and resumes the whole fleet's dispatch,
and a router that missed a call learns the state from the peers' loads exchange."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp

from rollout_router.settings import FleetSettings, RouterSettings, parse_settings
from tests.support import running_router, wait_for
from tests.test_fakevllm import serving, words
from tests.test_rl import ask, call


def with_peers(settings: RouterSettings, peers: list[str]) -> RouterSettings:
    return settings.model_copy(update={"fleet": FleetSettings(peers=peers, peer_timeout_seconds=0.5)})


def connect(runtimes: list, settings: RouterSettings, groups: list[list[int]]) -> None:
    """Each router's peers: the others of its group (a router alone in its group hears from no one)."""
    for group in groups:
        for index in group:
            peers = [runtimes[other].admin_url for other in group if other != index]
            runtimes[index].apply(with_peers(settings, peers))


async def members(runtimes: list, wanted: dict[int, int]) -> None:
    await wait_for(lambda: all(len(runtimes[i].fleet.members()) == n for i, n in wanted.items()), timeout=10)


@contextlib.asynccontextmanager
async def three_routers() -> AsyncIterator[tuple[list[str], list, list, RouterSettings]]:
    async with contextlib.AsyncExitStack() as stack:
        replicas = [await stack.enter_async_context(serving(f"127.0.0.{60 + i}")) for i in range(2)]
        settings = with_peers(parse_settings({"backends": [url for url, _ in replicas]}), [])
        started = [await stack.enter_async_context(running_router(settings)) for _ in range(3)]
        bases, runtimes = [base for base, _ in started], [runtime for _, runtime in started]
        connect(runtimes, settings, [[0, 1, 2]])
        await members(runtimes, {0: 3, 1: 3, 2: 3})
        yield bases, runtimes, replicas, settings


async def test_one_call_to_any_router_pauses_updates_and_resumes_the_fleet(http: aiohttp.ClientSession):
    async with three_routers() as (bases, runtimes, replicas, settings):
        a, b, c = runtimes
        status, body = await call(http, "POST", f"{b.admin_url}/v1/rl/pause")
        assert status == 200 and body["peers"] == {a.admin_url: "ok", c.admin_url: "ok"}
        assert all(runtime.rl.paused for runtime in runtimes)
        held_at_c = asyncio.create_task(ask(http, bases[2], words(8)))
        await wait_for(lambda: c.rl.queued == 1)

        status, body = await call(http, "POST", f"{c.admin_url}/v1/rl/update_weights",
                                  {"model_path": "/ckpt/3", "weight_version": "v3"})
        assert status == 200 and body["paused"] is True  # paused before: it stays paused until resume
        await wait_for(lambda: a.rl.weight_version == "v3")  # pushed with the update's new epoch
        assert a.rl.versions == {url: "v3" for url, _ in replicas}
        status, listed = await call(http, "GET", f"{a.admin_url}/v1/rl/workers")
        assert {w["weight_version"] for w in listed["workers"]} == {"v3"}

        connect(runtimes, settings, [[0], [1, 2]])  # a hears from no one: it misses the resume
        await members(runtimes, {0: 1, 1: 2, 2: 2})
        held_at_a = asyncio.create_task(ask(http, bases[0], words(9)))
        await wait_for(lambda: a.rl.queued == 1)
        status, body = await call(http, "POST", f"{b.admin_url}/v1/rl/resume")
        assert status == 200 and body["peers"] == {c.admin_url: "ok"}
        status, answer, headers = await held_at_c
        assert status == 200 and headers["X-Weight-Version"] == "v3"
        assert a.rl.paused and not held_at_a.done()

        connect(runtimes, settings, [[0, 1, 2]])  # back: a's first poll of a peer carries the newer state
        status, answer, headers = await held_at_a
        assert status == 200 and not a.rl.paused
        assert a.rl.epoch == b.rl.epoch == c.rl.epoch
        assert a.rl.queue["dispatched"] == c.rl.queue["dispatched"] == 1

"""What a peer's messages may make a router hold: anyone holding the admin token (everyone, with the token off) can
send them, so an id or a key is kept only when it could be a real member's or a real session's."""
from __future__ import annotations

import aiohttp

from rollout_router.settings import FleetSettings, RouterSettings, SessionSettings
from tests.support import running_router

SETTINGS = RouterSettings(backends=["http://127.0.0.1:9"], fleet=FleetSettings(),
                          session=SessionSettings(max_key_bytes=64))


async def test_a_leave_naming_a_router_that_was_never_a_member_is_not_remembered():
    async with running_router(SETTINGS) as (_, runtime), aiohttp.ClientSession() as http:
        for index in range(50):
            body = {"id": f"http://never-a-member-{index}:8081", "done": True}
            async with http.post(f"{runtime.admin_url}/fleet/v1/leave", json=body) as answer:
                assert answer.status == 200
        assert runtime.fleet.handoff.departed == set()


async def test_a_pushed_pin_with_a_key_no_client_could_send_is_refused_naming_it():
    async with running_router(SETTINGS) as (_, runtime), aiohttp.ClientSession() as http:
        pins = [{"key": "fits", "replica": "http://127.0.0.1:9", "idleSeconds": 0},
                {"key": "k" * 65, "replica": "http://127.0.0.1:9", "idleSeconds": 0}]
        async with http.post(f"{runtime.admin_url}/fleet/v1/adopt", json={"pins": pins}) as answer:
            error = (await answer.json())["error"]
            assert answer.status == 400 and error["param"] == "pins[1]" and "session.maxKeyBytes" in error["message"]
        assert runtime.balancer.pins() == []  # nothing of a refused push is taken
        async with http.post(f"{runtime.admin_url}/fleet/v1/adopt", json={"pins": pins[:1]}) as answer:
            assert answer.status == 200 and (await answer.json())["adopted"] == 1
        assert runtime.balancer.pinned("fits") == "http://127.0.0.1:9"


async def test_a_pushed_pin_naming_an_overlong_replica_is_refused():
    async with running_router(SETTINGS) as (_, runtime), aiohttp.ClientSession() as http:
        pins = [{"key": "k", "replica": "http://r/" + "a" * 5000, "idleSeconds": 0}]
        async with http.post(f"{runtime.admin_url}/fleet/v1/adopt", json={"pins": pins}) as answer:
            assert answer.status == 400 and (await answer.json())["error"]["param"] == "pins[0]"

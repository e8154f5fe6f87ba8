"""File descriptors are the router's own: the soft limit is raised at start, maxConnections is cut to what the
limit allows (said once), and a router short of descriptors never blames a replica (docs/security.md)."""
from __future__ import annotations

import asyncio
import errno
import logging
import resource
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import web

from rollout_router import descriptors
from rollout_router.localfleet import spawn
from rollout_router.proxy.attempts import OutOfDescriptors, Refused, refused_or_short
from tests.support import wait_for

LIMIT = 600  # the router process's RLIMIT_NOFILE, soft and hard, in the end-to-end test
CLIENTS = 700  # idle clients, more than the limit


def test_the_soft_limit_is_raised_to_the_hard_limit():
    def lowered() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 2048))
    out = subprocess.run([sys.executable, "-c", "import resource; from rollout_router import descriptors; "
                          "print(descriptors.raise_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"],
                         preexec_fn=lowered, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["2048", "2048"]


def test_max_connections_is_cut_to_what_the_limit_allows(caplog):
    cut = descriptors.connection_cap(10_000, 1024, listeners=2)
    assert cut == (1024 - descriptors.RESERVE) // 2 and descriptors.connection_cap(100, 1 << 20, listeners=2) == 100
    with caplog.at_level(logging.WARNING, "rollout_router.descriptors"):
        descriptors.say_cut(10_000, cut, 1024)
        descriptors.say_cut(100, 100, 1 << 20)  # not cut: nothing said
    assert len(caplog.records) == 1 and "maxConnections 10000 per listener cut to 256" in caplog.text


def test_emfile_is_the_routers_shortage_and_a_refusal_is_the_replicas():
    assert isinstance(refused_or_short(OSError(errno.EMFILE, "Too many open files"), "x"), OutOfDescriptors)
    assert isinstance(refused_or_short(OSError(errno.ENFILE, "File table overflow"), "x"), OutOfDescriptors)
    assert isinstance(refused_or_short(ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "x"), Refused)


@pytest.fixture
async def counted_replica():
    """A replica that counts its health probes and answers chat completions."""
    probes = [0]

    async def health(request: web.Request) -> web.Response:
        probes[0] += 1
        return web.Response(text="ok")

    async def chat(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "ok"}}]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.81", 0)
    await site.start()
    yield f"http://127.0.0.81:{site._server.sockets[0].getsockname()[1]}", probes
    await runner.cleanup()


async def test_idle_clients_beyond_the_limit_never_take_the_replicas_out(counted_replica, tmp_path):
    url, probes = counted_replica
    config = tmp_path / "router.json"
    config.write_text('{"backends": ["%s"], "health": {"probeIntervalSeconds": 0.2}}' % url)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
    with (tmp_path / "router.log").open("w") as log:
        starting = spawn(["serve", "--log-level", "warning", "--config", str(config)], "127.0.0.1", log, limited)
    router = await asyncio.to_thread(starting.bound)
    host, port = router.url.removeprefix("http://").rsplit(":", 1)
    idle: list[asyncio.StreamWriter] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as kept:  # there before the flood
            assert (await kept.post(f"{router.url}/v1/chat/completions", json={"messages": []})).status == 200
            for _ in range(CLIENTS):
                idle.append((await asyncio.open_connection(host, int(port)))[1])
            before = probes[0]
            await wait_for(lambda: probes[0] >= before + 3, timeout=20)  # the replica is still probed...
            answer = await kept.post(f"{router.url}/v1/chat/completions", json={"messages": []})
            assert answer.status == 200, await answer.text()  # ...and still serves
    finally:
        for writer in idle:
            writer.close()
        router.stop()
    cap = LIMIT - descriptors.RESERVE
    assert f"maxConnections 10000 per listener cut to {cap}" in (tmp_path / "router.log").read_text()

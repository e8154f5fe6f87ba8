"""The admin listener: its own port, the traffic port keeps only the probes, an optional bearer token."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import aiohttp
import pytest
import yarl

from rollout_router.proxy import admin
from rollout_router.proxy.http.admin_listener import LIMITS, PER_PEER, TokenFile
from rollout_router.serve import add_arguments
from rollout_router.settings import FleetSettings, RouterSettings
from tests.support import ScriptedReplica, running_router
from tests.test_http_wire import exchange, post


@pytest.fixture
async def replica():
    started = await ScriptedReplica("127.0.0.10").start()
    yield started
    await started.stop()


async def test_status_metrics_and_sessions_are_on_the_admin_port_only(replica):
    async with running_router(RouterSettings(backends=[replica.url])) as (base, runtime), \
            aiohttp.ClientSession() as http:
        assert runtime.admin_url != base
        [(code, _, _)] = await exchange(base, post())  # pins session "s"
        assert code == 200
        for method, path in (("GET", "/status"), ("GET", "/metrics"), ("DELETE", "/v1/sessions/s")):
            async with http.request(method, base + path) as response:
                error = (await response.json())["error"]
                assert response.status == 404 and "admin listener" in error["message"], (path, error)
        for path in ("/healthz", "/readyz"):  # probes answer on both
            for url in (base, runtime.admin_url):
                async with http.get(url + path) as response:
                    assert response.status == 200, (url, path)
        async with http.get(f"{runtime.admin_url}/status") as response:
            assert response.status == 200 and (await response.json())["sessions"] == 1
        async with http.get(f"{runtime.admin_url}/metrics") as response:
            assert response.status == 200 and "rolloutrouter_client_connections" in await response.text()
        async with http.delete(f"{runtime.admin_url}/v1/sessions/s") as response:
            assert response.status == 200
        async with http.post(f"{runtime.admin_url}/v1/chat/completions", json={}) as response:
            assert response.status == 404  # nothing is forwarded from the admin port
        assert not runtime.balancer.policy.sessions() and len(replica.seen) == 1


async def test_get_a_session_says_where_it_is_pinned_and_since_when(replica):
    """GET /v1/sessions/KEY: its replica, how long pinned and idle; a key with no pin is a JSON 404 naming it."""
    async with running_router(RouterSettings(backends=[replica.url])) as (base, runtime), \
            aiohttp.ClientSession() as http:
        [(code, _, _)] = await exchange(base, post())  # pins session "s"
        assert code == 200
        async with http.get(f"{runtime.admin_url}/v1/sessions/s") as response:
            document = await response.json()
        assert response.status == 200 and document["session"] == "s" and document["replica"] == replica.url
        assert 0 <= document["idleSeconds"] < 30 and 0 <= document["pinnedSeconds"] < 30
        async with http.get(f"{runtime.admin_url}/v1/sessions/other") as response:
            error = (await response.json())["error"]
        assert response.status == 404 and error["param"] == "key" and "'other' is not pinned" in error["message"]
        async with http.get(f"{base}/v1/sessions/s") as response:
            assert response.status == 404  # the traffic port names the admin listener


async def test_a_session_key_that_is_not_percent_encoded_utf8_is_refused_not_taken_literally(replica):
    async with running_router(RouterSettings(backends=[replica.url])) as (base, runtime), \
            aiohttp.ClientSession() as http:
        [(code, _, _)] = await exchange(base, post())  # pins session "s"
        assert code == 200
        for segment in ("%zz", "%ff", "s%"):
            async with http.delete(yarl.URL(f"{runtime.admin_url}/v1/sessions/{segment}", encoded=True)) as response:
                error = (await response.json())["error"]
                assert response.status == 400 and error["param"] == "key", (segment, error)
                assert "percent-encoded UTF-8" in error["message"], error
        assert runtime.balancer.policy.sessions() == 1
        async with http.delete(yarl.URL(f"{runtime.admin_url}/v1/sessions/%73", encoded=True)) as response:
            assert response.status == 200 and (await response.json())["session"] == "s"
        assert not runtime.balancer.policy.sessions()


async def test_the_admin_listener_makes_room_for_each_fleet_peer(replica):
    """Every other router may hold a watch of the loads and its calls here: a fleet (pods x workers) bigger than
    the scrapers' 128 connections must find room, and the limit still holds beyond that room."""
    peers = [f"http://127.0.3.{i}:9" for i in range(1, 41)]  # candidates that refuse: nothing else connects here
    room = LIMITS.max_connections + PER_PEER * len(peers)
    async with running_router(RouterSettings(backends=[replica.url], fleet=FleetSettings(peers=peers))) as (_, runtime):
        opened = [await asyncio.open_connection("127.0.0.1", runtime.admin_port) for _ in range(room + 1)]
        try:
            for _, writer in opened:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
            heads = [await reader.readuntil(b"\r\n\r\n") for reader, _ in opened]
        finally:
            for _, writer in opened:
                writer.close()
    assert [head.split(b" ")[1] for head in heads] == [b"200"] * room + [b"503"], heads[-1]


async def test_admin_token_guards_everything_but_the_probes_and_is_reread(replica, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("first-secret\n")
    async with running_router(RouterSettings(backends=[replica.url]), admin_token=TokenFile(token_file)) as (_, runtime), \
            aiohttp.ClientSession() as http:
        url = runtime.admin_url

        async def status(token: str | None) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with http.get(f"{url}/status", headers=headers) as response:
                if response.status == 401:
                    assert response.headers["WWW-Authenticate"].startswith("Bearer")
                    assert (await response.json())["error"]["code"] == 401
                return response.status

        assert await status(None) == 401 and await status("wrong") == 401
        assert await status("first-secret") == 200
        async with http.delete(f"{url}/v1/sessions/nope") as response:
            assert response.status == 401  # refused before it is looked up
        async with http.get(f"{url}/metrics", headers={"Authorization": "Basic first-secret"}) as response:
            assert response.status == 401
        for path in ("/healthz", "/readyz"):
            async with http.get(url + path) as response:
                assert response.status == 200  # kubelet sends no token
        replacement = tmp_path / "token.new"  # a Secret volume swaps the file whole
        replacement.write_text("second-secret")
        os.replace(replacement, token_file)
        assert await status("first-secret") == 401 and await status("second-secret") == 200


def test_admin_listener_defaults_to_loopback_8081():
    import argparse
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert (args.admin_host, args.admin_port, args.admin_token_file) == ("127.0.0.1", 8081, None)


def test_a_missing_token_file_is_one_line_at_start(tmp_path):
    result = subprocess.run([sys.executable, "-m", "rollout_router.cli", "serve", "--port", "0", "--admin-port", "0",
                             "--admin-token-file", str(tmp_path / "absent")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"rollout-router serve: --admin-token-file {tmp_path / 'absent'}: No such file or directory"]


def test_the_route_table_takes_new_routes():
    """Another admin endpoint is one more Route: matched with its parameters, 405 on the wrong method."""
    seen = []

    def workers(context, request):
        seen.append((request.params, request.query, request.body))
        return admin.AdminAnswer(200, json.dumps({"ok": True}).encode())

    admin.ROUTES.append(admin.Route("/workers/{url}", ("POST",), workers))
    try:
        answer = admin.admin_answer(None, "POST", "/workers/http%3A%2F%2Fw%3A8000", "x=1", b"{}")  # type: ignore[arg-type]
        assert answer is not None and answer.status == 200
        assert seen == [({"url": "http://w:8000"}, "x=1", b"{}")]
        wrong = admin.admin_answer(None, "GET", "/workers/a")  # type: ignore[arg-type]
        assert wrong is not None and wrong.status == 405
        assert admin.admin_answer(None, "POST", "/workers/") is None  # type: ignore[arg-type]
    finally:
        admin.ROUTES.pop()


def test_an_emptied_or_deleted_token_file_is_said_once_and_the_last_token_kept(tmp_path, caplog):
    token_file = tmp_path / "token"
    token_file.write_text("first-secret\n")
    token = TokenFile(token_file)
    token_file.write_text("")  # a half-written save
    with caplog.at_level("ERROR"):
        assert all(token.current() == b"first-secret" for _ in range(5))
        token_file.unlink()
        assert all(token.current() == b"first-secret" for _ in range(5))
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 2 and "is empty" in errors[0].getMessage() and "gone" in errors[1].getMessage()
    token_file.write_text("second-secret")
    assert token.current() == b"second-secret"


async def test_status_says_no_grpc_verdict_for_a_replica_that_serves_no_grpc(replica):
    async with running_router(RouterSettings(backends=[replica.url])) as (_, runtime), aiohttp.ClientSession() as http:
        async with http.get(f"{runtime.admin_url}/status") as response:
            [backend] = (await response.json())["backends"]
    assert backend["protocols"] == ["http"] and backend["grpc_healthy"] is None and backend["healthy"] is True

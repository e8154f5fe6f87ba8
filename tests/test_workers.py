"""The worker API (SGLang's router, vllm-router) over real sockets: register, list, remove, drain, sources, token."""
from __future__ import annotations

import asyncio
import re
import socket
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

from rollout_router.app import Runtime
from rollout_router.proxy.http.admin_listener import TokenFile
from rollout_router.settings import HealthSettings, RouterSettings
from tests.support import NO_PROBES, running_router, scripted_replicas, wait_for

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
async def replicas():
    async with scripted_replicas(20, 3) as started:
        yield started


async def call(http, method, url, **kw) -> tuple[int, object]:
    async with http.request(method, url, **kw) as response:
        is_json = response.content_type == "application/json"
        return response.status, await (response.json() if is_json else response.text())


async def served_by(http, base, session="s") -> str:
    async with http.post(f"{base}/v1/chat/completions", json=CHAT, headers={"X-Session-ID": session}) as response:
        assert response.status == 200
        return response.headers["X-RolloutRouter-Replica"]


async def test_legacy_routes_add_route_to_list_and_remove(replicas, http):
    """POST /add_worker?url=, GET /list_workers, POST /remove_worker?url= as SGLang's router 0.2.1 and vllm-router."""
    worker = replicas[0].url
    async with running_router(RouterSettings()) as (base, runtime):
        admin = runtime.admin_url  # the worker API is served on the admin listener
        assert await call(http, "GET", f"{admin}/list_workers") == (200, {"urls": []})
        assert await call(http, "POST", f"{admin}/add_worker?url={worker}") == \
            (200, f"Worker {worker} added successfully; probed now, it takes traffic while {worker}/health answers 200")
        assert await call(http, "GET", f"{admin}/list_workers") == (200, {"urls": [worker]})
        await wait_for(lambda: worker in runtime.replicas.loads())  # its first probe passed
        assert await served_by(http, base) == worker
        status, body = await call(http, "POST", f"{admin}/add_worker?url={worker}")
        assert (status, body["error"]["message"]) == (400, f"Worker {worker} already exists")
        assert await call(http, "POST", f"{admin}/remove_worker?url={worker}") == \
            (200, f"Worker {worker} removed successfully")
        assert await call(http, "GET", f"{admin}/list_workers") == (200, {"urls": []})
        status, body = await call(http, "POST", f"{admin}/remove_worker?url={worker}")
        assert (status, body["error"]["message"]) == (400, f"Worker {worker} not found")


async def test_a_dead_worker_is_probed_at_once_and_out_of_rotation(http):
    """Nothing listens at the URL: the answer says traffic waits for the probe, which runs now (not in 5 s)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        dead = f"http://127.0.0.1:{held.getsockname()[1]}"
        async with running_router(RouterSettings()) as (_, runtime):
            status, text = await call(http, "POST", f"{runtime.admin_url}/add_worker?url={dead}")
            assert status == 200 and text.endswith(f"it takes traffic while {dead}/health answers 200")
            await wait_for(lambda: runtime.replicas.why_unroutable(dead) == "unhealthy", timeout=2.0)
            _, workers = await call(http, "GET", f"{runtime.admin_url}/workers")
            assert [w["is_healthy"] for w in workers["workers"]] == [False]


async def test_rest_routes_register_by_json_and_remove_by_id_or_url(replicas, http):
    """POST /workers {url}, GET /workers[/{id}], DELETE /workers/{id} as SGLang's router 0.2.2+ (slime's calls)."""
    worker = replicas[0].url
    ident = str(uuid.uuid5(uuid.NAMESPACE_URL, worker))
    async with running_router(RouterSettings()) as (base, runtime):
        admin = runtime.admin_url  # the worker API is served on the admin listener
        status, body = await call(http, "POST", f"{admin}/workers", json={"url": worker, "worker_type": "regular"})
        assert status == 202 and body["worker_id"] == ident and body["status"] == "accepted" and body["success"]
        assert (await call(http, "POST", f"{admin}/workers", json={"url": worker + "/"}))[0] == 202  # idempotent
        await wait_for(lambda: worker in runtime.replicas.loads())  # its first probe passed
        status, listing = await call(http, "GET", f"{admin}/workers")
        assert status == 200 and listing["total"] == 1 and listing["stats"]["regular_count"] == 1
        [entry] = listing["workers"]
        assert (entry["id"], entry["url"], entry["sources"], entry["is_healthy"]) == (ident, worker, ["api"], True)
        one = {**entry, "job_status": None}
        assert await call(http, "GET", f"{admin}/workers/{ident}") == (200, one)
        assert await call(http, "GET", f"{admin}/workers/{quote(worker, safe='')}") == (200, one)
        status, body = await call(http, "DELETE", f"{admin}/workers/{quote(worker, safe='')}")  # SGLang 0.2.x: by URL
        assert status == 202 and body["worker_id"] == ident
        assert (await call(http, "GET", f"{admin}/workers"))[1]["workers"] == []
        assert (await call(http, "DELETE", f"{admin}/workers/{ident}"))[0] == 404
        assert (await call(http, "GET", f"{admin}/workers/{ident}"))[0] == 404


@pytest.mark.parametrize(("method", "path", "kw", "status", "param"), [
    ("POST", "/add_worker", {}, 400, "url"),
    ("POST", "/add_worker?url=ftp://host:1", {}, 400, "url"),
    ("POST", "/workers", {"data": b"not json"}, 400, None),
    ("POST", "/workers", {"json": ["http://x:1"]}, 400, None),
    ("POST", "/workers", {"json": {"worker_type": "regular"}}, 400, "url"),
    ("POST", "/workers", {"json": {"url": "http://x:1", "worker_type": "prefill"}}, 400, "worker_type"),
    # each was "the worker URL is required", taken as regular, or the first of two URLs used
    ("POST", "/add_worker", {"data": b"{bad json"}, 400, None),
    ("POST", "/add_worker", {"json": {"url": 5}}, 400, "url"),
    ("POST", "/add_worker?url=http://x:1&url=http://y:1", {}, 400, "url"),
    ("POST", "/workers", {"json": {"url": "http://x:1", "worker_type": False}}, 400, "worker_type"),
    ("PUT", "/workers", {}, 405, None),
    ("GET", "/add_worker?url=http://x:1", {}, 405, None),
])
async def test_bad_calls_get_a_json_error_and_change_nothing(http, method, path, kw, status, param):
    async with running_router(RouterSettings()) as (base, runtime):
        admin = runtime.admin_url  # the worker API is served on the admin listener
        code, body = await call(http, method, admin + path, **kw)
        assert code == status and body["error"]["code"] == status and body["error"]["param"] == param
        assert body["error"]["message"]
        assert len(runtime.replicas) == 0


async def test_sources_keep_their_own_replicas(replicas, http):
    """A static reload never drops an API worker; the API never drops a static one; a URL in both stays till both go."""
    static, both, api_only = (r.url for r in replicas)
    async with running_router(RouterSettings(backends=[static, both])) as (base, runtime):
        admin = runtime.admin_url  # the worker API is served on the admin listener
        for url in (both, api_only):
            assert (await call(http, "POST", f"{admin}/add_worker?url={url}"))[0] == 200
        status, body = await call(http, "POST", f"{admin}/remove_worker?url={static}")
        assert status == 409 and "static" in body["error"]["message"]
        assert (await call(http, "DELETE", f"{admin}/workers/{quote(static, safe='')}"))[0] == 409
        runtime.apply(RouterSettings(backends=[]))  # the static list empties (a config reload)
        assert sorted((await call(http, "GET", f"{admin}/list_workers"))[1]["urls"]) == sorted([both, api_only])
        runtime.apply(RouterSettings(backends=[both]))
        assert (await call(http, "POST", f"{admin}/remove_worker?url={both}"))[0] == 200
        assert sorted((await call(http, "GET", f"{admin}/list_workers"))[1]["urls"]) == sorted([both, api_only])
        entry = (await call(http, "GET", f"{admin}/workers/{quote(both, safe='')}"))[1]
        assert entry["sources"] == ["static"]


async def test_removal_answers_at_once_and_drains_requests_in_flight(replicas, http):
    held, other = replicas[0], replicas[1]
    held.hold = asyncio.Event()
    async with running_router(RouterSettings()) as (base, runtime):
        admin = runtime.admin_url  # the worker API is served on the admin listener
        await call(http, "POST", f"{admin}/add_worker?url={held.url}")
        await wait_for(lambda: held.url in runtime.replicas.loads())  # its first probe passed
        in_flight = asyncio.ensure_future(served_by(http, base, "pinned"))
        await wait_for(lambda: held.active == 1)
        await call(http, "POST", f"{admin}/add_worker?url={other.url}")
        await wait_for(lambda: other.url in runtime.replicas.loads())
        status, body = await call(http, "DELETE", f"{admin}/workers/{quote(held.url, safe='')}")
        assert status == 202 and "1 requests in flight drain" in body["message"]
        assert runtime.replicas.total_inflight() == 1  # still counted while it drains
        assert await inflight_gauge(http, admin) == {held.url: 1.0, other.url: 0.0}  # the removed one's too
        assert await served_by(http, base, "pinned") == other.url  # the pin moves: no new request goes there
        held.hold.set()
        assert await in_flight == held.url  # the request in flight finished where it was
        await wait_for(lambda: runtime.replicas.total_inflight() == 0)
        assert await inflight_gauge(http, admin) == {other.url: 0.0}  # drained: its series is gone


async def inflight_gauge(http, admin: str) -> dict[str, float]:
    """``rolloutrouter_backend_inflight_requests`` by backend, as /metrics says it."""
    _, text = await call(http, "GET", f"{admin}/metrics")
    found = re.findall(r'^rolloutrouter_backend_inflight_requests\{backend="([^"]+)"\} (\S+)$', text, re.MULTILINE)
    return {backend: float(value) for backend, value in found}


async def test_a_new_worker_takes_no_traffic_before_its_first_probe_passes(replicas, http):
    """Issue 21, finding 7: a worker was routable before any probe (SGLang's router polls /health first).

    One whose /health says 503 (an engine still loading) is listed, unhealthy, and gets no request; once its
    probe passes it takes traffic.
    """
    loading = replicas[1]
    loading.healthy = False
    async with running_router(RouterSettings(backends=[replicas[0].url])) as (base, runtime):
        admin = runtime.admin_url
        await call(http, "POST", f"{admin}/workers", json={"url": loading.url})
        entry = f"{admin}/workers/{quote(loading.url, safe='')}"
        assert (await call(http, "GET", entry))[1]["is_healthy"] is False  # before any probe
        await wait_for(lambda: loading.probes > 0)
        assert {await served_by(http, base, f"s{n}") for n in range(16)} == {replicas[0].url}
        assert not loading.seen
        loading.healthy = True
        runtime.prober.wake()
        await wait_for(lambda: loading.url in runtime.replicas.loads())
        assert loading.url in {await served_by(http, base, f"t{n}") for n in range(16)}


async def test_an_api_worker_is_health_checked_like_any_replica(replicas, http):
    """Probes off, a registered worker is routable at once; refusing connections, it is marked down and unhealthy."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"  # bound, never listening: connections are refused
        async with running_router(RouterSettings(backends=[replicas[0].url], health=NO_PROBES)) as (base, runtime):
            admin = runtime.admin_url  # the worker API is served on the admin listener
            await call(http, "POST", f"{admin}/workers", json={"url": dead})
            entry = f"{admin}/workers/{quote(dead, safe='')}"
            assert (await call(http, "GET", entry))[1]["is_healthy"] is True
            for session in range(64):  # new sessions spread over both: one lands on the dead worker first
                assert await served_by(http, base, f"s{session}") == replicas[0].url  # retried elsewhere
                if not (await call(http, "GET", entry))[1]["is_healthy"]:
                    break
            assert (await call(http, "GET", entry))[1]["is_healthy"] is False


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("first-token\n")
    return path


async def test_routes_that_change_routing_need_the_token(replicas, http, token_file):
    runtime = Runtime(RouterSettings(backends=[replicas[0].url]), admin_address=("127.0.0.1", 0),
                      admin_token=TokenFile(token_file))
    base = f"http://127.0.0.1:{await runtime.start('127.0.0.1', 0)}"
    admin = runtime.admin_url
    try:
        add = f"{admin}/add_worker?url={replicas[1].url}"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic first-token"}):
            async with http.post(add, headers=headers) as response:
                assert response.status == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")
                assert "--admin-token-file" in (await response.json())["error"]["message"]
        for method, path in (("GET", "/workers"), ("GET", "/list_workers"), ("DELETE", "/v1/sessions/s")):
            assert (await call(http, method, admin + path))[0] == 401
        assert len(runtime.replicas) == 1
        assert await served_by(http, base) == replicas[0].url  # traffic needs no token
        assert (await call(http, "GET", f"{admin}/healthz"))[0] == 200  # probes need no token
        good = {"Authorization": "Bearer first-token"}
        assert (await call(http, "POST", add, headers=good))[0] == 200
        assert (await call(http, "DELETE", f"{admin}/v1/sessions/s", headers=good))[0] == 200
        token_file.write_text("second-token")  # a rotated Secret applies without a restart
        assert (await call(http, "GET", f"{admin}/workers", headers=good))[0] == 401
        assert (await call(http, "GET", f"{admin}/workers", headers={"Authorization": "Bearer second-token"}))[0] == 200
    finally:
        await runtime.stop()


def test_an_empty_or_missing_token_file_is_refused_at_start(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        TokenFile(tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        TokenFile(tmp_path / "empty")


def test_a_token_file_that_turns_empty_keeps_the_last_token(token_file: Path):
    token = TokenFile(token_file)
    token_file.write_text("")
    assert token.allows(b"Bearer first-token") and not token.allows(b"Bearer ")


@pytest.mark.parametrize(("url", "allowed", "says"), [
    ("http://169.254.169.254:80", [], "link-local"),  # the metadata service of AWS, GCP, Azure
    ("http://[fe80::1]:8000", [], "link-local"),
    ("http://[::ffff:169.254.169.254]:80", [], "link-local"),  # IPv4-mapped: the same address
    ("http://metadata.google.internal:80", [], "cloud metadata service"),
    ("http://[fd00:ec2::254]:80", [], "cloud metadata service"),
    ("http://0.0.0.0:8000", [], "unspecified"),
    ("http://127.0.0.20:8000", ["10.0.0.0/8"], "not in workerApi.allowedNetworks"),
    ("http://vllm-0:8000", ["10.0.0.0/8"], "is a name"),
])
async def test_worker_addresses_outside_the_policy_are_refused_without_a_connection(http, url, allowed, says):
    """Issue 21, finding 7: link-local and metadata addresses were accepted. Nothing is connected to: the
    refusal is decided from the URL alone (addresses.refusal), so these addresses are never contacted."""
    settings = RouterSettings(worker_api={"allowed_networks": allowed})
    async with running_router(settings) as (base, runtime):
        for route, kw in (("/add_worker?url=" + quote(url, safe=""), {}), ("/workers", {"json": {"url": url}})):
            status, body = await call(http, "POST", runtime.admin_url + route, **kw)
            assert status == 400 and body["error"]["param"] == "url" and says in body["error"]["message"], body
        assert len(runtime.replicas) == 0


async def test_an_allowed_network_lets_its_workers_in(replicas, http):
    settings = RouterSettings(worker_api={"allowed_networks": ["127.0.0.0/24", "169.254.0.0/16"]})
    async with running_router(settings) as (base, runtime):
        assert (await call(http, "POST", f"{runtime.admin_url}/workers", json={"url": replicas[0].url}))[0] == 202
        assert runtime.replicas.get(replicas[0].url) is not None


async def test_a_routers_own_traffic_port_registered_as_a_worker_never_takes_traffic(replicas, http):
    """Issue 21, finding 7: registering the router's own port sent each request round ~6,700 hops. The probe
    sees the router's relay header on the answer and keeps it out of rotation, even on a probe path the router
    forwards (on /health its traffic port answers 404, a failed probe too)."""
    health = HealthSettings(probe_path="/v1/models")
    async with running_router(RouterSettings(backends=[replicas[0].url], health=health)) as (base, runtime):
        await call(http, "POST", f"{runtime.admin_url}/workers", json={"url": base})
        registry = runtime.metrics.registry
        await wait_for(lambda: registry.get_sample_value("rolloutrouter_health_probe_failures_total",
                                                         {"backend": base, "reason": "router"}), timeout=20)
        assert base not in runtime.replicas.loads()
        assert {await served_by(http, base, f"s{n}") for n in range(8)} == {replicas[0].url}

"""The RL step on REAL vLLM (CPU build): pause with requests in flight, weights replaced, resume.

Two vLLM OpenAI servers with ``VLLM_SERVER_DEV_MODE=1`` (the pinned vLLM serves its RL and cache
routes only then) on 127.0.0.26-27, behind ``rollout-router serve``. The "next step" checkpoint is
the tiny model with other random weights (``build_tiny_model.py --reweight``): after the update the
same greedy prompt gets another answer, and vLLM's own prefix-cache counters show the reset (the
prompt that hit before the update misses after it). Opt-in: ``ROLLOUT_ROUTER_REAL_VLLM=1``.
"""
from __future__ import annotations

import json
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_router.localfleet import Service, free_port

from .conftest import LOG_DIR, TINY_MODEL_DIR, VLLM_PYTHON, enabled
from .test_real_vllm import STARTUP_TIMEOUT, get_json, prompt_words, scrape, start_router, total, wait_until
from .vllm_process import SERVED_MODEL, VllmServer, vllm_environment

if not enabled():
    pytest.skip("the real-vLLM tier is opt-in: set ROLLOUT_ROUTER_REAL_VLLM=1 (make test-vllm)",
                allow_module_level=True)

pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(600)]

HOSTS = ("127.0.0.26", "127.0.0.27")  # 127.0.0.24 is test_differential.py's
BUILDER = Path(__file__).with_name("build_tiny_model.py")


def post(url: str, body: object = None, timeout: float = 300) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def complete(router: Service, prompt: str, max_tokens: int, session: str | None = None) -> tuple[dict, dict]:
    """A greedy chat completion through the router: (body, headers)."""
    body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(f"{router.url}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"X-Session-ID": session} if session else {})})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.load(answer), dict(answer.headers)


def in_background(work) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = work()
        except Exception as error:  # noqa: BLE001  (the test asserts on it)
            result["error"] = error
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


@pytest.fixture(scope="module")
def next_checkpoint(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("checkpoints") / "step-1"
    subprocess.run([str(VLLM_PYTHON), str(BUILDER), "--reweight", str(TINY_MODEL_DIR), str(target), "1"],
                   check=True, env=vllm_environment(None), capture_output=True, timeout=300)
    return target


@pytest.fixture(scope="module")
def rl_fleet() -> Iterator[tuple[Service, list[VllmServer]]]:
    servers = []
    try:
        for index, host in enumerate(HOSTS):
            servers.append(VllmServer(VLLM_PYTHON, TINY_MODEL_DIR, host, free_port(host),
                                      LOG_DIR / f"vllm-rl-{index}.log", cpu=str(index),
                                      extra_env={"VLLM_SERVER_DEV_MODE": "1"}).start())
        for server in servers:
            server.wait_ready(STARTUP_TIMEOUT)
        router = start_router("router-rl", [s.url for s in servers], ["--affinity-break-margin", "2"])
        try:
            yield router, servers
        finally:
            router.stop()
    finally:
        for server in servers:
            server.stop()


def test_vllms_own_rl_routes_are_used_and_answers_carry_each_replicas_version(rl_fleet):
    """vLLM 0.32 serves its RL routes: the router finds them (each replica asked once, GET /weight_info), so
    every answer carries the serving replica's version from the first one; pause and resume reach the engines'
    own /pause (the caller's mode; the cache kept) and /resume. (Not update_info: on a vLLM started without
    --weight-transfer-config, as these are, vLLM 0.32's engine dies on start_weight_update; docs/rl.md says so.)"""
    router, servers = rl_fleet
    admin = router.admin_url
    workers = wait_until(lambda: (lambda listed: listed if all(w["routes"] for w in listed) else None)(
        get_json(f"{admin}/v1/rl/workers")["workers"]), 30, "every replica asked")
    engines = {s.url: get_json(f"{s.url}/weight_info")["weight_version"] for s in servers}
    assert {(w["url"], w["routes"], w["weight_version"]) for w in workers} == \
        {(url, "native", version) for url, version in engines.items()}
    prompt = prompt_words("native", 150)
    for _ in range(2):
        _, headers = complete(router, prompt, 4, session="native")
        assert headers["X-Weight-Version"] == engines[headers["X-RolloutRouter-Replica"]]

    status, body = post(f"{admin}/v1/rl/pause", {"mode": "wait"})
    assert status == 200 and {(w["routes"], w["engine_paused"]) for w in body["workers"]} == {("native", True)}
    assert all(get_json(f"{s.url}/is_paused") == {"is_paused": True} for s in servers)
    status, body = post(f"{admin}/v1/rl/resume")
    assert status == 200 and {w["status"] for w in body["workers"]} == {"ok"}, body
    assert all(get_json(f"{s.url}/is_paused") == {"is_paused": False} for s in servers)
    answer, headers = complete(router, prompt, 4, session="native")
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the pause kept vLLM's prefix cache
    assert headers["X-Weight-Version"] == engines[headers["X-RolloutRouter-Replica"]]


def test_pause_in_flight_update_weights_resume(rl_fleet, next_checkpoint):
    router, servers = rl_fleet
    admin = router.admin_url
    prompt = prompt_words("rl", 120)
    before, headers = complete(router, prompt, 12, session="probe")
    replica = headers["X-RolloutRouter-Replica"]
    warm, _ = complete(router, prompt, 12, session="probe")
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the prefix cache is warm

    in_flight = [in_background(lambda i=i: complete(router, prompt_words(f"f{i}", 40), 400)) for i in range(4)]
    wait_until(lambda: get_json(f"{admin}/status")["total_inflight"] == 4, 60, "4 requests in flight")
    pausing = in_background(lambda: post(f"{admin}/v1/rl/pause", {"mode": "wait"}))
    wait_until(lambda: get_json(f"{admin}/status")["rl"]["paused"], 30, "dispatch paused")
    queued = in_background(lambda: complete(router, prompt_words("queued", 30), 8))
    wait_until(lambda: get_json(f"{admin}/status")["rl"]["queued"] == 1, 30, "a request queued")
    pausing[0].join(300)
    status, body = pausing[1]["value"]
    assert (status, body["inflight"]) == (200, 0), body
    for thread, result in in_flight:  # the pause answered only once they had finished
        assert not thread.is_alive() and result["value"][0]["choices"][0]["finish_reason"] == "length"

    hits_before = {s.url: total(scrape(s.url), "vllm:prefix_cache_hits_total") for s in servers}
    status, body = post(f"{admin}/v1/rl/update_weights", {"model_path": str(next_checkpoint),
                                                          "weight_version": "step-1"})
    assert status == 200, body
    assert {(w["url"], w["status"], w["weight_version"], w["prefix_cache_reset"]) for w in body["workers"]} == \
        {(s.url, "ok", "step-1", True) for s in servers}
    assert queued[0].is_alive()  # still paused: the update was made inside the caller's pause

    status, body = post(f"{admin}/v1/rl/resume")
    assert (status, body["released"]) == (200, 1)
    queued[0].join(120)
    assert queued[1]["value"][1]["X-Weight-Version"] == "step-1"

    after, headers = complete(router, prompt, 12, session="probe")
    assert headers["X-RolloutRouter-Replica"] == replica and headers["X-Weight-Version"] == "step-1"
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the reset emptied the cache
    assert total(scrape(replica), "vllm:prefix_cache_hits_total") == hits_before[replica]  # vLLM's own counter
    assert after["choices"][0]["message"]["content"] != before["choices"][0]["message"]["content"]
    workers = get_json(f"{admin}/v1/rl/workers")
    assert {w["weight_version"] for w in workers["workers"]} == {"step-1"} and workers["paused"] is False


def test_pause_abort_ends_requests_in_flight_through_vllms_abort(rl_fleet):
    router, servers = rl_fleet
    admin = router.admin_url
    in_flight = [in_background(lambda i=i: complete(router, prompt_words(f"a{i}", 40), 1500)) for i in range(3)]
    wait_until(lambda: get_json(f"{admin}/status")["total_inflight"] == 3, 60, "3 requests in flight")
    status, body = post(f"{admin}/v1/rl/pause", {"mode": "abort"})
    assert (status, body["inflight"]) == (200, 0), body
    assert sum(w["aborted"] for w in body["workers"]) == 3
    for thread, result in in_flight:
        thread.join(60)
        answer = result.get("value")
        assert answer is not None, result.get("error")
        choice = answer[0]["choices"][0]
        assert choice["finish_reason"] == "abort" and answer[0]["usage"]["completion_tokens"] < 1500
    assert get_json(f"{admin}/status")["total_inflight"] == 0
    assert post(f"{admin}/v1/rl/resume")[0] == 200


def test_pause_keep_freezes_requests_in_vllm_and_resume_finishes_them(rl_fleet):
    """vLLM's own keep mode through the router: the pause answers at once with the requests still in flight;
    vLLM generates no token while paused (its own counter stands still); after resume every request ends whole."""
    router, servers = rl_fleet
    admin = router.admin_url
    in_flight = [in_background(lambda i=i: complete(router, prompt_words(f"k{i}", 40), 600)) for i in range(2)]
    wait_until(lambda: get_json(f"{admin}/status")["total_inflight"] == 2, 60, "2 requests in flight")
    status, body = post(f"{admin}/v1/rl/pause", {"mode": "keep"})
    assert (status, body["mode"], body["inflight"]) == (200, "keep", 2), body
    assert all(get_json(f"{s.url}/is_paused") == {"is_paused": True} for s in servers)
    generated = [total(scrape(s.url), "vllm:generation_tokens_total") for s in servers]
    wait_until(lambda: all(t.is_alive() for t, _ in in_flight), 1, "the frozen requests are still open")
    threading.Event().wait(1.0)  # a second of a paused engine (the tiny model makes hundreds of tokens a second)
    assert [total(scrape(s.url), "vllm:generation_tokens_total") for s in servers] == generated
    assert all(thread.is_alive() for thread, _ in in_flight)
    assert post(f"{admin}/v1/rl/resume")[0] == 200
    for thread, result in in_flight:
        thread.join(120)
        answer = result.get("value")
        assert answer is not None, result.get("error")
        assert answer[0]["choices"][0]["finish_reason"] == "length" and answer[0]["usage"]["completion_tokens"] == 600
    assert get_json(f"{admin}/status")["total_inflight"] == 0

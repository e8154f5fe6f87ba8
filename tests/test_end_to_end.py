"""Real processes: `rollout-router serve` in front of `rollout-router fake-vllm` replicas.

The official openai client talks to the router, streaming and not, with the
session passed as a header; the settings file is changed and SIGHUP'd live.
"""
from __future__ import annotations

import json
import signal
import urllib.request

import openai
import pytest

from rollout_router.localfleet import local_fleet, spawn, spawn_replica, wait_healthy
from tests.support import wait_until


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def fleet():
    with local_fleet(3, ["--affinity-break-margin", "2"]) as (router, replicas):
        yield router, replicas


def test_openai_client_non_streaming_sticks_to_one_replica(fleet):
    router, replicas = fleet
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    served = set()
    messages = [{"role": "user", "content": "solve x + 1 = 2"}]
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, max_tokens=8, extra_headers={"X-Session-ID": "openai-1"})
        completion = raw.parse()
        served.add(raw.headers["x-rolloutrouter-replica"])
        assert completion.choices[0].message.content and completion.usage.completion_tokens == 8
        messages += [{"role": "assistant", "content": completion.choices[0].message.content},
                     {"role": "user", "content": "and then?"}]
    assert len(served) == 1 and served <= {r.url for r in replicas}
    status = get_json(f"{router.admin_url}/status")
    assert status["new_sessions"] >= 1 and status["affinity_kept"] >= 2


def test_openai_client_streaming_through_the_router(fleet):
    router, _ = fleet
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "count"}], max_tokens=12, stream=True,
        stream_options={"include_usage": True}, extra_headers={"X-Session-ID": "openai-stream"})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # arrived in pieces
    assert text and chunks[-1].usage.completion_tokens == 12
    completion = openai.OpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0).completions.create(
        model="tiny", prompt="once upon", max_tokens=4, extra_headers={"X-Session-ID": "openai-stream"})
    assert completion.choices[0].text
    assert get_json(f"{router.admin_url}/status")["total_inflight"] == 0


def test_openai_client_sees_router_errors_as_api_errors(fleet):
    router, _ = fleet
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.post("/nope", cast_to=object, body={})


def test_serve_reloads_config_on_sighup_keeping_pins(tmp_path):
    replica = spawn_replica(0).bound()
    config = tmp_path / "router.yaml"
    try:
        wait_healthy(replica, "/health")
        config.write_text(f"backends: [{replica.url}]\naffinityBreakMargin: null\n")
        router = spawn(["serve", "--config", str(config)], "127.0.0.1").bound()
        try:
            wait_healthy(router, "/readyz")
            client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0)
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                           extra_headers={"X-Session-ID": "keep-me"})
            config.write_text(f"backends: [{replica.url}]\naffinityBreakMargin: 3\n")
            router.process.send_signal(signal.SIGHUP)
            wait_until(lambda: get_json(f"{router.admin_url}/status")["affinity_break_margin"] == 3, "SIGHUP to apply the margin")
            status = get_json(f"{router.admin_url}/status")
            assert status["sessions"] == 1 and status["new_sessions"] == 1
            config.write_text("affinityBreakMargin: -1\n")  # invalid: logged, not applied, no crash
            router.process.send_signal(signal.SIGHUP)
            wait_until(lambda: get_json(f"{router.admin_url}/status")["config_reloads"]["rejected"] >= 1,
                       "SIGHUP to re-read (and reject) the config")
            assert router.process.poll() is None
            status = get_json(f"{router.admin_url}/status")
            assert status["affinity_break_margin"] == 3 and status["sessions"] == 1
        finally:
            router.stop()
    finally:
        replica.stop()


def test_serve_rejects_invalid_flags_naming_the_field(tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "bad.yaml"
    bad.write_text("session:\n  maxSessions: 0\n")
    result = subprocess.run([sys.executable, "-m", "rollout_router.cli", "serve", "--config", str(bad)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "session.maxSessions" in result.stderr

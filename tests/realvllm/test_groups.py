"""GRPO siblings on REAL vLLM: n samples of one prompt, with and without the group key, by vLLM's own counters.

Opt-in (``ROLLOUT_ROUTER_REAL_VLLM=1``): two vLLM OpenAI servers (CPU build, the tiny local model) behind
``rollout-router serve`` with its defaults (margin null, group key header ``X-Group-ID``). Each arm sends n
siblings, each its own session (as verl gives every sample its own request id), one after another, with a
prompt of its own (so neither arm hits the other's cache); the prefix-cache hits and queries are read from each
replica's ``vllm:prefix_cache_{hits,queries}_total`` before and after.
"""
from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from rollout_router.localfleet import Service, free_port

from .conftest import ENV, LOG_DIR, TINY_MODEL_DIR, VLLM_PYTHON, enabled
from .test_real_vllm import (
    NO_EOS,
    STARTUP_TIMEOUT,
    client_for,
    get_json,
    prompt_words,
    scrape,
    start_router,
    total,
    wait_until,
)
from .vllm_process import SERVED_MODEL, VllmServer

if not enabled():  # only reached when this file is named on the command line without the variable
    pytest.skip(f"the real-vLLM tier is opt-in: set {ENV}=1 (make test-vllm)", allow_module_level=True)

pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(600)]

HOSTS = ("127.0.0.31", "127.0.0.32")
N = 8  # siblings per prompt (GRPO n)
MEASURED: dict[str, object] = {}  # written to LOG_DIR/groups.json


@pytest.fixture(scope="module")
def group_fleet() -> Iterator[tuple[Service, list[VllmServer]]]:
    servers = []
    try:
        for i, host in enumerate(HOSTS):
            servers.append(VllmServer(VLLM_PYTHON, TINY_MODEL_DIR, host, free_port(host),
                                      LOG_DIR / f"vllm-group-{i}.log", cpu=str(i)).start())
        for server in servers:
            server.wait_ready(STARTUP_TIMEOUT)
        router = start_router("router-groups", [s.url for s in servers], [])
        try:
            yield router, servers
        finally:
            router.stop()
    finally:
        for server in servers:
            server.stop()
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        (LOG_DIR / "groups.json").write_text(json.dumps(MEASURED, indent=2) + "\n")


def counters(servers: list[VllmServer]) -> dict[str, tuple[float, float]]:
    """(prefix-cache hit tokens, query tokens) per replica, from its /metrics."""
    out = {}
    for server in servers:
        samples = scrape(server.url)
        out[server.url] = (total(samples, "vllm:prefix_cache_hits_total"),
                           total(samples, "vllm:prefix_cache_queries_total"))
    return out


def send_siblings(router: Service, servers: list[VllmServer], tag: str, group: bool) -> dict:
    """N siblings of one prompt, one after another; where each went and what vLLM counted."""
    client = client_for(router)
    messages = [{"role": "system", "content": prompt_words(tag, 150)}, {"role": "user", "content": "solve it"}]
    before = counters(servers)
    served, prompt_tokens = [], 0
    for i in range(N):
        headers = {"X-Session-ID": f"{tag}-sample-{i}"} | ({"X-Group-ID": f"{tag}-prompt"} if group else {})
        raw = client.chat.completions.with_raw_response.create(
            model=SERVED_MODEL, messages=messages, max_tokens=4, extra_body=NO_EOS, extra_headers=headers)
        prompt_tokens += raw.parse().usage.prompt_tokens
        served.append(raw.headers["x-rolloutrouter-replica"])

    def settled():
        now = counters(servers)
        queries = sum(now[url][1] - before[url][1] for url in now)
        return now if queries >= prompt_tokens else None

    after = wait_until(settled, what="vLLM's prefix-cache query counters to count every sibling")
    delta = {url: (after[url][0] - before[url][0], after[url][1] - before[url][1]) for url in after}
    hits, queries = sum(h for h, _ in delta.values()), sum(q for _, q in delta.values())
    return {"served": served, "per_replica": delta, "hits": hits, "queries": queries, "hit_rate": hits / queries}


def test_siblings_with_the_group_key_share_one_replica_and_its_prefix_cache(group_fleet):
    router, servers = group_fleet
    plain = send_siblings(router, servers, "plain", group=False)
    status_between = get_json(f"{router.admin_url}/status")
    grouped = send_siblings(router, servers, "grouped", group=True)
    status = get_json(f"{router.admin_url}/status")
    MEASURED.update({"n": N, "without group key": plain, "with group key": grouped})
    assert len(set(plain["served"])) == 2  # without the key the siblings spread (least-loaded, hash ties)
    assert len(set(grouped["served"])) == 1  # with it, all on one replica
    home = grouped["served"][0]
    assert all(q == 0 for url, (_, q) in grouped["per_replica"].items() if url != home)  # the other saw none
    # on one replica the prompt is prefilled once: every later sibling hits, so one miss of the prompt in n
    # instead of one per replica used
    assert grouped["hits"] > plain["hits"] and grouped["hit_rate"] > plain["hit_rate"]
    per_sibling = grouped["per_replica"][home][0] / (N - 1)
    assert per_sibling >= 128  # whole KV blocks of the shared prompt
    assert plain["hits"] <= per_sibling * (N - 2)  # two replicas: at least two prefills of the prompt
    assert (status["group_colocated"], status["group_spilled"]) == (N - 1, 0)
    assert status_between["group_colocated"] == 0 and status["new_sessions"] == 2 * N
    assert status["total_inflight"] == 0

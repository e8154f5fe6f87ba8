"""cost_affinity against sticky and margin 2 on real vLLM CPU servers, by vLLM's own counters.

Opt-in with the rest of the real-vLLM tier (``make test-vllm``; docs/simulator.md, "A rule for every
point"). Two vLLM servers (CPU build, tiny model) with small KV pools, so that sessions evict and
preempt each other, sit behind one router per arm. Each arm runs the same multi-turn workload (its
own token ids, so no arm hits another's cache): sessions of unequal output lengths all at once, each
turn's prompt the previous prompt plus vLLM's answer and new tokens, keyed by ``X-Session-ID``. Per
arm the test reads vLLM's ``prefix_cache_hits``/``queries`` and ``num_preemptions`` (deltas over the
arm) and the arm's wall time, and writes them to ``out/realvllm/rule.json``.

What is asserted is only what must hold: every turn answered, the counters read and moving, every
decision counted, in-flight counts back to 0. The numbers are reported, not asserted: a tiny model
on 2 shared cores says little about which rule is faster.
"""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Iterator

import aiohttp
import pytest

from rollout_router.localfleet import free_port

from .conftest import ENV, LOG_DIR, TINY_MODEL_DIR, VLLM_PYTHON, enabled
from .test_real_vllm import STARTUP_TIMEOUT, get_json, scrape, start_router, total, wait_until
from .vllm_process import SERVED_MODEL, VllmServer

if not enabled():
    pytest.skip(f"the real-vLLM tier is opt-in: set {ENV}=1 (make test-vllm)", allow_module_level=True)

pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(900)]

HOSTS = ("127.0.0.25", "127.0.0.26")
SESSIONS, TURNS, PROMPT, USER = 12, 4, 96, 24
OUTPUTS = (16, 24, 32, 48, 64, 96)  # tokens per turn, by session: unequal, so replicas drift apart
VLLM_FLAGS = ["--block-size", "32", "--num-gpu-blocks-override", "49",  # 48 usable blocks of 32 tokens
              "--max-num-seqs", "8", "--max-num-batched-tokens", "256"]
ARMS = {  # router flags per arm
    "sticky": ["--policy", "affinity"],
    "margin2": ["--policy", "affinity", "--affinity-break-margin", "2"],
    # minTurnSeconds scaled to this workload: its turns take about 0.3-3 s here (the default, 40 s, is
    # for GPU rollouts, where it would keep every pin of this workload)
    "cost_affinity": ["--policy", "cost_affinity", "--affinity-break-margin", "2", "--config", "COST_CONFIG"],
}
COST_SETTINGS = {"costAffinity": {"relative": 0.01, "minTurnSeconds": 1.0}}
COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:num_preemptions_total")
REPORT = LOG_DIR / "rule.json"
ROUNDS = 3


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[VllmServer]]:
    started = []
    try:
        for host, cpu in zip(HOSTS, ("0", "1")):
            started.append(VllmServer(VLLM_PYTHON, TINY_MODEL_DIR, host, free_port(host),
                                      LOG_DIR / f"vllm-rule-{host}.log", cpu=cpu, max_model_len=1024,
                                      extra_args=VLLM_FLAGS).start())
        for server in started:
            server.wait_ready(STARTUP_TIMEOUT)
        yield started
    finally:
        for server in started:
            server.stop()


def counters(servers: list[VllmServer]) -> dict[str, dict[str, float]]:
    samples = {s.url: scrape(s.url) for s in servers}
    return {url: {name: total(s, name) for name in COUNTERS} for url, s in samples.items()}


async def workload(router_url: str, arm: int) -> dict[str, str]:
    """Every session's turns at once; returns the replica of every turn by "session/turn"."""
    served: dict[str, str] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        async def session(s: int) -> None:
            rng = random.Random(7919 * arm + s)
            prompt = [rng.randrange(3, 500) for _ in range(PROMPT)]
            for turn in range(TURNS):
                body = {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": OUTPUTS[s % len(OUTPUTS)],
                        "ignore_eos": True, "temperature": 0, "return_token_ids": True}
                async with http.post(f"{router_url}/v1/completions", json=body,
                                     headers={"X-Session-ID": f"arm{arm}-s{s}"}) as response:
                    assert response.status == 200, await response.text()
                    served[f"{s}/{turn}"] = response.headers["x-rolloutrouter-replica"]
                    answer = (await response.json())["choices"][0]["token_ids"]
                prompt = prompt + answer + [rng.randrange(3, 500) for _ in range(USER)]
        await asyncio.gather(*(session(s) for s in range(SESSIONS)))
    return served


def run_arm(replicas: list[VllmServer], arm: str, flags: list[str], seed: int) -> dict:
    """One arm, one round: the workload through a router of its own; what vLLM and the router counted."""
    config = LOG_DIR / "router-rule-cost.json"
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(COST_SETTINGS))
    flags = [str(config) if flag == "COST_CONFIG" else flag for flag in flags]
    router = start_router(f"router-rule-{arm}", [s.url for s in replicas], flags)
    try:
        before = counters(replicas)
        started = time.monotonic()
        served = asyncio.run(workload(router.url, seed))
        seconds = time.monotonic() - started
        wait_until(lambda: get_json(f"{router.admin_url}/status")["total_inflight"] == 0,
                   what=f"{arm}: in-flight back to 0")
        status = get_json(f"{router.admin_url}/status")
        after = counters(replicas)
    finally:
        router.stop()
    delta = {name: sum(after[url][name] - before[url][name] for url in after) for name in COUNTERS}
    decisions = status["affinity_kept"] + status["affinity_broken"] + status["new_sessions"]
    assert len(served) == SESSIONS * TURNS and decisions == SESSIONS * TURNS, (arm, status)
    assert status["new_sessions"] == SESSIONS
    assert delta["vllm:prefix_cache_queries_total"] > 0, (arm, delta)  # counters read and moving
    moves = sum(served[f"{s}/{t}"] != served[f"{s}/{t - 1}"] for s in range(SESSIONS) for t in range(1, TURNS))
    return {"seconds": round(seconds, 2), "prefix_cache_hits": delta["vllm:prefix_cache_hits_total"],
            "prefix_cache_queries": delta["vllm:prefix_cache_queries_total"],
            "preemptions": delta["vllm:num_preemptions_total"], "moved_turns": moves,
            "affinity_broken": status["affinity_broken"]}


def test_cost_affinity_sticky_and_margin2_by_vllms_counters(replicas):
    rounds: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for r in range(ROUNDS):  # arms interleaved, so that a slow spell of the shared machine hits them alike
        for index, (arm, flags) in enumerate(ARMS.items()):
            rounds[arm].append(run_arm(replicas, arm, flags, 100 * r + index))
    report = {arm: {"rounds": runs, "median_seconds": statistics.median(x["seconds"] for x in runs),
                    "hit_rate": round(sum(x["prefix_cache_hits"] for x in runs)
                                      / sum(x["prefix_cache_queries"] for x in runs), 4),
                    "preemptions": sum(x["preemptions"] for x in runs),
                    "moved_turns": sum(x["moved_turns"] for x in runs)}
              for arm, runs in rounds.items()}
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({arm: {k: v for k, v in row.items() if k != "rounds"} for arm, row in report.items()}, indent=2))
    assert report["sticky"]["moved_turns"] == 0

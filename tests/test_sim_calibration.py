"""The replica model and fake-vllm schedule alike, and follow vLLM's rules the differential test found.

The real-vLLM tier (tests/realvllm/test_differential.py) compares both with vLLM itself; this quick
tier keeps them equal to each other on workloads of many shapes, and pins each rule that differed.
"""
from __future__ import annotations

import pytest

from rollout_router.fakevllm.prefix_cache import BlockPool as FakePool
from rollout_router.fakevllm.scheduler import Request as FakeRequest
from rollout_router.fakevllm.scheduler import Scheduler as FakeScheduler
from rollout_router.sim.calibration import Arrivals, EngineShape, Workload, replay_fake, replay_replica


def _closed(workload: Workload, first: int, gap: int) -> Arrivals:
    return Arrivals({s: first * (s % 3) for s in range(workload.sessions)},
                    {(s, k): gap + s % 2 for s in range(workload.sessions) for k in range(1, workload.turns)})


@pytest.mark.parametrize("sessions,blocks,turns,budget", [
    (8, 31, 3, 256), (8, 40, 4, 256), (6, 31, 3, 256), (10, 40, 3, 256), (8, 44, 4, 96), (4, 64, 3, 512)])
@pytest.mark.parametrize("gap", [1, 5, 20])
def test_replica_model_and_fake_make_the_same_decisions(sessions, blocks, turns, budget, gap):
    workload = Workload(sessions, turns, prompt=100, output=40, user=20)
    shape = EngineShape(blocks, 32, max_num_seqs=8, max_num_batched_tokens=budget)
    arrivals = _closed(workload, 1, gap)
    sim, fake = replay_replica(workload, shape, arrivals), replay_fake(workload, shape, arrivals)
    assert sim.admissions == fake.admissions
    assert sim.preemptions == fake.preemptions
    assert sim.finishes == fake.finishes
    assert sim.counters() == fake.counters()


def test_the_differential_workload_preempts_and_hits_the_cache():
    workload = Workload(8, 4, prompt=100, output=40, user=20)
    run = replay_replica(workload, EngineShape(40, 32, 8, 256), _closed(workload, 0, 3))
    counters = run.counters()
    assert counters["preemptions"] > 0 and counters["hits"] > 0 and counters["preempted_hits"] > 0


def test_a_prompt_is_admitted_only_when_all_of_it_fits():
    # 3 x 100-token prompts in blocks of 32 need 12 blocks; 10 blocks hold two. The first chunk of the
    # third (56 tokens, 2 blocks) would fit, but vLLM waits until the whole prompt does: step 5,
    # after the first two finish (prefill at step 1, three decode steps).
    workload = Workload(3, 1, prompt=100, output=4, user=0)
    for replay in (replay_replica, replay_fake):
        run = replay(workload, EngineShape(10, 32, 8, 256), Arrivals({0: 0, 1: 0, 2: 0}, {}))
        assert [(step, key) for step, key, *_ in run.admissions] == [(1, (0, 0)), (1, (1, 0)), (5, (2, 0))]
        assert run.preemptions == []


def test_turns_due_together_queue_in_the_order_vllm_received_them():
    """Same as above, but session 2's prompt reached vLLM first: it is admitted first and session 1 waits.

    The order comes from vLLM's trace (its add events), not from session numbers; a replay that broke
    ties by session admitted another request than vLLM did in a loaded real-tier run.
    """
    workload = Workload(3, 1, prompt=100, output=4, user=0)
    order = {(2, 0): 0, (0, 0): 1, (1, 0): 2}
    for replay in (replay_replica, replay_fake):
        run = replay(workload, EngineShape(10, 32, 8, 256), Arrivals({0: 0, 1: 0, 2: 0}, {}, order))
        assert [(step, key) for step, key, *_ in run.admissions] == [(1, (2, 0)), (1, (0, 0)), (5, (1, 0))]


def test_a_readmitted_request_is_not_counted_as_a_prefix_cache_query():
    workload = Workload(8, 3, prompt=100, output=40, user=20)
    arrivals = _closed(workload, 0, 1)
    run = replay_replica(workload, EngineShape(31, 32, 8, 256), arrivals)
    counters = run.counters()
    assert counters["preemptions"] > 0 and counters["preempted_hits"] > 0
    # every turn's first admission is queried once, whatever happens to it after
    assert counters["queries"] == sum(workload.sessions * workload.context(k) for k in range(workload.turns))


def test_fake_counts_prefix_queries_like_vllm_and_reuses_uncached_blocks_first():
    pool = FakePool(num_blocks=8, block_size=4)
    sched = FakeScheduler(pool, max_num_seqs=4, max_num_batched_tokens=64)
    a = FakeRequest(id="a", tokens=list(range(10)), num_prompt_tokens=10, max_tokens=1)
    sched.add(a)
    step = sched.schedule()
    assert (step.cache_queries, step.cache_hits) == (10, 0)
    sched.complete(step)  # a finishes: 2 cached blocks and a partial one (never cached)
    partial = [b.id for b in pool.blocks if b.ref_cnt == 0 and b.hash is None and b.id < 3]
    assert pool.free_order()[0] == partial[0]  # reused first, as vLLM's BlockPool.free_blocks does
    b = FakeRequest(id="b", tokens=list(range(10)) + [99], num_prompt_tokens=11, max_tokens=1)
    b.num_preemptions = 1  # a re-admission: vLLM keeps it out of prefix_cache_queries/hits
    sched.add(b)
    step = sched.schedule()
    assert (step.cache_queries, step.cache_hits) == (0, 0) and b.num_computed == 8

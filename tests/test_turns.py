"""The pieces behind "is the margin paying?": usage read from an answer's tail, the last gRPC message, a
pin's age, the gap at a break, and backend labels bounded."""
from __future__ import annotations

import json

from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from rollout_router.balancer import Balancer
from rollout_router.core.pins import SessionTable
from rollout_router.observability import OTHER, Metrics
from rollout_router.policy import LiveConfig, Outcome
from rollout_router.policy.base import Counters
from rollout_router.proxy.grpc.usage import LastMessage
from rollout_router.proxy.turns import TAIL_BYTES, prefill_of
from rollout_router.replicas import ReplicaSet
from rollout_router.settings import RouterSettings

USAGE = {"prompt_tokens": 120, "completion_tokens": 4, "total_tokens": 124,
         "prompt_tokens_details": {"cached_tokens": 96}}


def test_the_prefill_of_a_json_answer_is_its_uncached_prompt_tokens():
    body = json.dumps({"id": "x", "choices": [{"message": {"content": 'says "usage": {"prompt_tokens": 9}'}}],
                       "usage": USAGE}).encode()
    assert prefill_of(body) == 24
    assert prefill_of(body[-TAIL_BYTES:]) == 24


def test_the_prefill_of_a_stream_is_read_from_its_last_usage_chunk():
    chunk = {"id": "x", "choices": [], "usage": USAGE}
    stream = b"data: {\"choices\": [{\"delta\": {\"content\": \"hi\"}}]}\n\n" * 200
    stream += b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"
    assert prefill_of(stream[-TAIL_BYTES:]) == 24


def test_a_usage_nested_deeper_than_the_parser_goes_is_no_usage():
    """A replica's bytes: a ``"usage":`` followed by thousands of ``[`` must be unknown, not a RecursionError raised
    while its exchange ends (issue: the lease and the client connection were held for good)."""
    assert prefill_of(b'{"id": "x", "usage": ' + b"[" * 100_000 + b"]" * 100_000 + b"}") is None


def test_without_cached_tokens_the_prefill_is_unknown_not_zero():
    """vLLM without --enable-prompt-tokens-details answers prompt_tokens_details: null."""
    assert prefill_of(json.dumps({"usage": {**USAGE, "prompt_tokens_details": None}}).encode()) is None
    assert prefill_of(json.dumps({"usage": {"prompt_tokens": 5}}).encode()) is None
    assert prefill_of(b'{"choices": []}') is None
    assert prefill_of(b'{"usage": {"prompt_tokens": 5, "prompt_tok') is None  # cut short
    assert prefill_of(json.dumps({"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}})
                      .encode()) is None  # more cached than asked: not a count to trust


def frame(message: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(message).to_bytes(4, "big") + message


def test_the_last_grpc_message_is_kept_across_frames_of_any_size():
    chunk = pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[1, 2], prompt_tokens=50, cached_tokens=10))
    complete = pb.GenerateResponse(complete=pb.GenerateComplete(output_ids=[3], prompt_tokens=50, cached_tokens=16))
    data = frame(chunk.SerializeToString()) * 3 + frame(complete.SerializeToString())
    for size in (1, 3, 7, len(data)):
        last = LastMessage()
        for start in range(0, len(data), size):
            last.feed(data[start:start + size])
        assert last.prefill() == 34


def test_a_compressed_or_garbled_last_message_is_not_measured():
    for data in (frame(b"\x1f\x8b...", flag=1), frame(b"\xff\xff\xff")):
        last = LastMessage()
        last.feed(data)
        assert last.prefill() is None


def test_a_pin_keeps_its_age_while_kept_and_starts_again_when_moved():
    table = SessionTable(Counters())
    table.pin("k", "a", 100.0)
    table.pin("k", "a", 130.5)
    assert table.age("k", 160.0) == 60
    table.pin("k", "b", 170.0)
    assert table.age("k", 175.0) == 5
    assert table.age("unknown", 175.0) is None


def test_a_break_reports_the_gap_the_margin_saw_and_the_pin_age():
    clock = [1000.0]
    replicas = ReplicaSet(clock=lambda: clock[0])
    replicas.replace([("a", None), ("b", None)])
    balancer = Balancer(replicas, "affinity", LiveConfig(margin=2), clock=lambda: clock[0])
    seen = []
    balancer.on_break = lambda gap, age: seen.append((gap, age))
    decision, lease = balancer.acquire("s")
    lease.release()
    clock[0] += 42
    replicas.set_external(decision.replica, 4)
    moved, lease = balancer.acquire("s")
    lease.release()
    assert moved.outcome is Outcome.BROKEN and balancer.why_moved(moved) == "margin"
    assert seen == [(4, 42)]


def three_labels(urls: list[str]) -> tuple[ReplicaSet, Metrics]:
    """A replica set of ``urls`` and its metrics with ``maxBackendLabels: 3``."""
    replicas = ReplicaSet()
    replicas.replace([(url, None) for url in urls])
    settings = RouterSettings(metrics={"maxBackendLabels": 3})
    return replicas, Metrics(Balancer(replicas, "affinity", LiveConfig()), replicas, lambda: settings, lambda: None,
                             clock=lambda: 0.0)


def counted(metrics: Metrics) -> dict[str, float]:
    """rolloutrouter_requests_total by backend label."""
    return {s.labels["backend"]: s.value for family in metrics.registry.collect() for s in family.samples
            if s.name == "rolloutrouter_requests_total"}


def test_backend_labels_beyond_the_cap_share_one_overflow_label():
    replicas, metrics = three_labels([f"http://10.0.0.{i}:8000" for i in range(5)])
    for replica in replicas.replicas():
        metrics.observe(replica.id, 200, 0.1)
    labels = {s.labels["backend"] for family in metrics.registry.collect() for s in family.samples
              if "backend" in s.labels}
    assert len(labels) == 4 and OTHER in labels
    assert metrics.per_backend(lambda r: 1)[OTHER] == 2


def test_a_fleet_above_the_label_cap_looks_for_freed_labels_only_after_a_replica_left(monkeypatch):
    """Every request to a replica counted under ``other`` asks for a label; the labels are looked over again only
    once a replica has left the set (or finished draining), not on every such request."""
    urls = [f"http://10.0.0.{i}:8000" for i in range(5)]
    replicas, metrics = three_labels(urls)
    looked: list[str] = []
    known = replicas.known
    monkeypatch.setattr(replicas, "known", lambda replica_id: looked.append(replica_id) or known(replica_id))
    for url in urls[:3]:
        metrics.observe(url, 200, 0.1)
    looked.clear()
    for _ in range(10):
        metrics.observe(urls[3], 200, 0.1)
    assert metrics.backend_label(urls[3]) == OTHER
    assert sorted(looked) == sorted(urls[:3])  # one look over the three labels, not one per request
    looked.clear()
    lease = replicas.acquire(urls[0])
    replicas.remove(urls[0])  # draining: still known, and its label stays
    metrics.observe(urls[3], 200, 0.1)
    assert looked == [] and metrics.backend_label(urls[3]) == OTHER
    lease.release()  # drained: its label is free for the next replica that asks
    metrics.observe(urls[3], 200, 0.1)
    assert metrics.backend_label(urls[3]) == urls[3]


def test_every_replica_under_other_may_take_a_label_freed_by_replicas_that_left():
    urls = [f"http://10.0.0.{i}:8000" for i in range(6)]
    replicas, metrics = three_labels(urls)
    for url in urls:
        metrics.observe(url, 200, 0.1)
    replicas.remove(urls[0])
    replicas.remove(urls[1])
    for url in urls[3:]:
        metrics.observe(url, 200, 0.1)
    assert counted(metrics) == {urls[2]: 1, urls[3]: 1, urls[4]: 1, OTHER: 4}  # urls[5] is the one still under other


def test_replicas_under_other_get_labels_of_their_own_when_the_cap_is_raised():
    urls = [f"http://10.0.0.{i}:8000" for i in range(5)]
    replicas, metrics = three_labels(urls)
    for url in urls:
        metrics.observe(url, 200, 0.1)
    raised = RouterSettings(metrics={"maxBackendLabels": 5})
    metrics.settings = lambda: raised  # a reload, as Runtime.apply makes it: the new settings, then configure
    metrics.configure(raised.metrics)
    metrics.observe(urls[4], 200, 0.1)
    assert counted(metrics) == {urls[0]: 1, urls[1]: 1, urls[2]: 1, OTHER: 2, urls[4]: 1}


def test_the_labels_of_replicas_that_left_go_to_new_replicas_once_all_are_taken():
    """Pods that come back on new addresses: a drained replica's label (and its series) goes to a new replica when
    the cap is reached; a replica still draining, or still in the set, keeps its own."""
    old = [f"http://10.0.0.{i}:8000" for i in range(3)]
    replicas, metrics = three_labels(old)
    for url in old:
        metrics.observe(url, 200, 0.1)
        metrics.retried(url)
        metrics.ejected(url, "timeout")
    lease = replicas.acquire(old[1])  # in flight while it is removed: draining
    replicas.replace([(old[2], None), ("http://10.0.0.7:8000", None), ("http://10.0.0.8:8000", None)])
    metrics.observe("http://10.0.0.7:8000", 200, 0.1)  # old[0] drained: its label is the new replica's

    def backends() -> set[str]:
        return {s.labels["backend"] for family in metrics.registry.collect() for s in family.samples
                if "backend" in s.labels and not s.name.startswith("rolloutrouter_backend_")}  # not the live gauges
    assert backends() == {old[1], old[2], "http://10.0.0.7:8000"}
    metrics.observe("http://10.0.0.8:8000", 200, 0.1)  # old[1] still draining: no label to give
    assert backends() == {old[1], old[2], "http://10.0.0.7:8000", OTHER}
    lease.release()
    metrics.observe("http://10.0.0.8:8000", 200, 0.1)
    assert backends() == {old[2], "http://10.0.0.7:8000", "http://10.0.0.8:8000", OTHER}

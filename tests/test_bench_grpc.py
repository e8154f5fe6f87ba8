"""benchmarks/grpc_cost.py's pieces work: the raw-frame replica answers vLLM's Generate (paced and burst) and
HealthCheck, our arm relays and stays sticky as the replicas' record shows, and with Go on PATH one tiny round of
the load generator fills the table. A function test: no cost is judged here."""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import grpc_cost

MESSAGES = 4


@pytest.fixture(scope="module")
def bench():
    args = argparse.Namespace(messages=MESSAGES, interval_ms=2.0, conns=2, request=grpc_cost.request_hex(MESSAGES))
    replicas: list[grpc_cost.Endpoint] = []
    router = None
    try:
        replicas += [grpc_cost.replica(f"127.0.0.{30 + i}", args) for i in range(2)]
        router = grpc_cost.ours()([r.target for r in replicas])
        yield args, replicas, grpc_cost.Arm("ours (sticky)", router)
    finally:
        for endpoint in ([router] if router else []) + replicas:
            endpoint.stop()


def generate(target: str, session: str, interval: str | None) -> list[pb.GenerateResponse]:
    metadata = (("x-session-id", session),) + ((("x-bench-interval-ms", interval),) if interval else ())
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        assert stub.HealthCheck(pb.HealthCheckRequest(), timeout=5).healthy
        request = pb.GenerateRequest.FromString(bytes.fromhex(grpc_cost.request_hex(MESSAGES)))
        return list(stub.Generate(request, metadata=metadata, timeout=5))


def test_the_replica_streams_generate_and_our_arm_relays_it_sticky(bench):
    _, replicas, arm = bench
    for turn in range(2):
        for index in range(6):
            answer = generate(arm.endpoint.target, f"{arm.prefix}{index}", "0" if turn else None)
            assert [m.WhichOneof("response") for m in answer] == ["chunk"] * (MESSAGES - 1) + ["complete"]
            assert answer[-1].complete.prompt_tokens == grpc_cost.PROMPT_TOKENS
    assert generate(replicas[0].target, "direct-0", "0")[-1].complete.completion_tokens == MESSAGES
    sets = grpc_cost.seen(replicas)
    assert "direct-0" in sets[0]
    assert grpc_cost.spread(arm, sets) == "6/256, 0 split"  # every session answered, each by one replica


@pytest.mark.skipif(shutil.which("go") is None, reason="the load generator is a Go program")
def test_one_tiny_round_of_the_load_generator_fills_the_table(bench):
    args, replicas, arm = bench
    grpc_cost.build_grpcload()
    direct = grpc_cost.Arm(grpc_cost.DIRECT, replicas[0])
    for each in (direct, arm):
        for name, interval in grpc_cost.LOADS.items():
            sample = grpc_cost.load(each, replicas, args, interval, 0.5, 40)
            assert sample["ok"] == sample["sent"] == 20 and sample["messages"] == 20 * MESSAGES, sample
            each.samples[name].append(sample)
    table = grpc_cost.report([direct, arm], grpc_cost.seen(replicas), "ours (sticky)").splitlines()
    assert len(table) == 4 and table[3].startswith("| ours (sticky) |") and "| 1.00x |" in table[3], table
    assert table[3].endswith("| 0, late 0 | 20/256, 0 split |"), table


async def test_grpc_calls_drives_generate_calls_through_the_listener() -> None:
    """benchmarks/grpc_calls.py's in-process calls are relayed whole, each replica put back (it exits otherwise)."""
    import grpc_calls

    out = await grpc_calls.drive(40, MESSAGES)
    assert set(out) == {*grpc_calls.PHASES, "total", grpc_calls.TURNS} and out["total"] > out[grpc_calls.TURNS] > 0

"""gRPC end to end with real processes: vLLM's own stubs -> `rollout-router serve --grpc-port`
-> `rollout-router fake-vllm --grpc-port` replicas, HTTP and gRPC sharing one account per replica."""
from __future__ import annotations

import json
import urllib.request

import grpc
import openai
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from rollout_router.localfleet import local_fleet

PROMPT = " ".join(f"w{i}" for i in range(200))  # long enough to fill whole KV blocks


@pytest.fixture(scope="module")
def fleet():
    with local_fleet(3, ["--affinity-break-margin", "2"], grpc=True) as (router, replicas):
        with grpc.insecure_channel(router.grpc_target) as channel:
            yield router, replicas, pb_grpc.VllmEngineStub(channel)


def generate(stub, text: str, session: str, max_tokens: int = 6):
    request = pb.GenerateRequest(text=text, stream=True, sampling_params=pb.SamplingParams(max_tokens=max_tokens))
    call = stub.Generate(request, metadata=(("x-session-id", session),))
    messages = list(call)
    replica = dict(call.initial_metadata())["x-rolloutrouter-replica"]
    return messages, replica


def status(router) -> dict:
    with urllib.request.urlopen(f"{router.admin_url}/status", timeout=5) as response:
        return json.load(response)


def test_generate_streams_through_and_sticks_with_prefix_reuse(fleet):
    router, replicas, stub = fleet
    first, replica = generate(stub, PROMPT, "grpc-traj")
    assert [m.WhichOneof("response") for m in first][-1] == "complete"
    assert sum(m.chunk.completion_tokens for m in first if m.HasField("chunk")) == 6
    second, again = generate(stub, PROMPT + " tool said ok", "grpc-traj")
    assert again == replica and replica in {r.url for r in replicas}
    assert second[-1].complete.cached_tokens > 0  # the next turn reused the replica's prefix cache


def test_http_and_grpc_turns_of_one_session_share_its_pin(fleet):
    router, _, stub = fleet
    before = status(router)  # the fleet is shared by the module: count this test's decisions only
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0)
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt=PROMPT, max_tokens=3, extra_headers={"X-Session-ID": "mixed"})
    _, over_grpc = generate(stub, PROMPT, "mixed")
    assert over_grpc == raw.headers["x-rolloutrouter-replica"]
    counts = status(router)
    assert counts["total_inflight"] == 0
    assert counts["new_sessions"] - before["new_sessions"] == 1  # the HTTP turn placed the session
    assert counts["affinity_kept"] - before["affinity_kept"] == 1  # the gRPC turn kept its pin


def test_router_metadata_unary_calls_and_errors(fleet):
    router, _, stub = fleet
    loads = stub.GetLoads(pb.GetLoadsRequest(), metadata=(("x-session-id", "ops"),))
    assert loads is not None
    assert stub.HealthCheck(pb.HealthCheckRequest()).healthy
    with pytest.raises(grpc.RpcError) as raised:
        list(stub.Generate(pb.GenerateRequest(text="", stream=True), metadata=(("x-session-id", "bad"),)))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "empty" in raised.value.details()
    metrics = urllib.request.urlopen(f"{router.admin_url}/metrics", timeout=5).read().decode()
    assert 'code="INVALID_ARGUMENT"' in metrics and 'code="OK"' in metrics
    assert status(router)["total_inflight"] == 0

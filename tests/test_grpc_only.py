"""Replicas given by their gRPC address alone (vLLM's gRPC frontend serves no HTTP): parsed from every source,
routed gRPC calls only, probed over gRPC (ejected when dead, back when restarted), their load read from
GetLoads, and /status and /readyz saying which listener each can serve. Real fake-vllm processes; the router
is never told their HTTP port."""
from __future__ import annotations

import time

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from rollout_router.discovery.kubernetes import pod_endpoint
from rollout_router.fleet import loadview
from rollout_router.health.grpc_probe import grpc_load, grpc_probe
from rollout_router.localfleet import Service, spawn, spawn_replica, stop
from rollout_router.policy.hashing import least_loaded
from rollout_router.replicas import API, ReplicaSet
from rollout_router.settings import (
    Backend,
    DiscoverySettings,
    HealthSettings,
    RouterSettings,
    SettingsError,
    parse_settings,
)
from tests.support import keys_spread, running_router, wait_for

PROMPT = " ".join(f"w{i}" for i in range(120))


@pytest.fixture
def replicas():
    processes: list = []  # each recorded as it starts, so one that fails to bind does not leave the other running
    try:
        yield [spawn_replica(index, grpc=True, into=processes).bound() for index in (60, 61)]
    finally:
        for process in processes:
            stop(process)


def only(replica: Service) -> str:
    return f"grpc://{replica.grpc_target}"


def settings(backends: list[str], **health) -> RouterSettings:
    return RouterSettings(backends=backends, health=HealthSettings(probe_interval_seconds=0.1,
                                                                   probe_timeout_seconds=1.0, **health))


async def generate(target: str, session: str) -> str:
    """One streamed Generate through the router; the replica it reached (the router's own metadata)."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = pb_grpc.VllmEngineStub(channel).Generate(
            pb.GenerateRequest(text=PROMPT, stream=True, sampling_params=pb.SamplingParams(max_tokens=3)),
            metadata=(("x-session-id", session),))
        messages = [message async for message in call]
        assert messages[-1].WhichOneof("response") == "complete"
        return dict(await call.initial_metadata())["x-rolloutrouter-replica"]


@pytest.mark.parametrize("given, url, grpc_target", [
    ({"url": "grpc://10.0.0.7:50051"}, "grpc://10.0.0.7:50051", None),
    ({"grpc": "vllm-0:50051"}, "grpc://vllm-0:50051", None),
    ({"url": "grpc://[fd00::7]:50051/"}, "grpc://[fd00::7]:50051", None),
    ({"url": "http://vllm-0:8000", "grpc": "vllm-0:50051"}, "http://vllm-0:8000", "vllm-0:50051"),
])
def test_a_backend_may_be_its_grpc_address_alone(given, url, grpc_target):
    backend = parse_settings(given, Backend)
    assert (backend.url, backend.grpc) == (url, grpc_target)


@pytest.mark.parametrize("given, words", [
    ({"url": "grpc://vllm-0"}, "host:port"),
    ({"url": "grpc://vllm-0:50051", "grpc": "vllm-0:50051"}, "once"),
    ({"url": "ftp://vllm-0:1"}, "grpc://"),
])
def test_bad_grpc_backends_are_refused_by_name(given, words):
    with pytest.raises(SettingsError, match=words):
        parse_settings(given, Backend)


def test_discovery_of_pods_that_expose_only_a_grpc_port():
    pod = {"metadata": {"name": "vllm-0", "labels": {"app": "vllm"}},
           "spec": {"containers": [{"ports": [{"name": "grpc", "containerPort": 50051}]}]},
           "status": {"podIP": "10.1.2.3", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    found = pod_endpoint(pod, parse_settings({"selector": {"matchLabels": {"app": "vllm"}}, "port": None,
                                              "grpcPort": "grpc"}, DiscoverySettings))
    assert found is not None and (found.url, found.grpc_target) == ("grpc://10.1.2.3:50051", None)
    with pytest.raises(SettingsError, match="grpcPort"):
        parse_settings({"selector": {"matchLabels": {"app": "vllm"}}, "port": None}, DiscoverySettings)


def test_a_grpc_only_replica_is_in_the_grpc_index_only_and_each_protocol_has_its_own_verdict():
    replicas = ReplicaSet()
    replicas.add("grpc://g:1")
    replicas.add("http://m:2", "m:3")
    assert set(replicas.loads()) == {"http://m:2"} and set(replicas.loads(grpc=True)) == {"grpc://g:1", "http://m:2"}
    assert replicas.why_unroutable("grpc://g:1") == "grpc_only" and replicas.ready_count() == 2
    replicas.set_healthy("http://m:2", False, grpc=True)  # its gRPC server fails, its HTTP one does not
    assert "http://m:2" in replicas.loads() and "http://m:2" not in replicas.loads(grpc=True)
    assert replicas.why_unroutable("http://m:2", grpc=True) == "unhealthy"
    replicas.acquire("grpc://g:1")
    assert replicas.loads(grpc=True)["grpc://g:1"] == 1  # in-flight counts move in the gRPC index too


async def test_grpc_only_replicas_serve_calls_and_never_http(replicas, http):
    async with running_router(settings([only(r) for r in replicas]), grpc=True) as (base, runtime):
        target = f"127.0.0.1:{runtime.grpc_port}"
        await wait_for(lambda: len(runtime.replicas.loads(grpc=True)) == 2)
        ids = [only(r) for r in replicas]
        keys = keys_spread(lambda key: least_loaded(dict.fromkeys(ids, 0), key), ids, "g", 1)
        assert {await generate(target, key) for key in keys} == set(ids)
        answer = await http.post(f"{base}/v1/chat/completions", json={"model": "tiny", "messages": []})
        assert answer.status == 503 and runtime.replicas.total_inflight() == 0
        ready = await (await http.get(f"{runtime.admin_url}/readyz")).json()
        assert (ready["backends_ready"], ready["backends_ready_http"], ready["backends_ready_grpc"]) == (2, 0, 2)
        status = await (await http.get(f"{runtime.admin_url}/status")).json()
        for backend in status["backends"]:
            assert backend["protocols"] == ["grpc"] and backend["ready"] is False and backend["ready_grpc"] is True


async def test_a_dead_grpc_only_replica_is_ejected_by_its_probe_and_comes_back(replicas, http):
    dead, alive = replicas
    async with running_router(settings([only(r) for r in replicas]), grpc=True) as (_, runtime):
        target = f"127.0.0.1:{runtime.grpc_port}"
        await wait_for(lambda: len(runtime.replicas.loads(grpc=True)) == 2)
        runtime.balancer.policy.table.pin("s", only(dead), time.monotonic())  # on the replica about to die
        assert await generate(target, "s") == only(dead)
        dead.stop()
        await wait_for(lambda: only(dead) not in runtime.replicas.loads(grpc=True), timeout=10)
        assert await generate(target, "s") == only(alive)  # re-placed on its next turn
        assert runtime.balancer.repinned.get("unhealthy") == 1
        metrics = await (await http.get(f"{runtime.admin_url}/metrics")).text()
        assert f'rolloutrouter_backend_healthy{{backend="{only(dead)}"}} 0.0' in metrics
        assert 'reason="connection_failed"' in metrics
        host, port = dead.grpc_target.rsplit(":", 1)
        again = spawn(["fake-vllm", "--grpc-port", port], host).bound()  # restarted on its address
        try:
            await wait_for(lambda: only(dead) in runtime.replicas.loads(grpc=True), timeout=10)
        finally:
            again.stop()


async def test_the_worker_api_registers_a_grpc_worker(replicas, http):
    async with running_router(settings([]), grpc=True) as (_, runtime):
        answer = await http.post(f"{runtime.admin_url}/workers", json={"url": only(replicas[0])})
        assert answer.status == 202
        await wait_for(lambda: only(replicas[0]) in runtime.replicas.loads(grpc=True))
        listed = (await (await http.get(f"{runtime.admin_url}/workers")).json())["workers"]
        assert [(w["url"], w["connection_mode"], w["is_healthy"]) for w in listed] == [
            (only(replicas[0]), "gRPC", True)]
        assert API in runtime.replicas.get(only(replicas[0])).sources


async def test_grpc_probes_and_loads_read_the_engine(replicas):
    target = replicas[0].grpc_target
    assert await grpc_probe(target, "vllm", 2.0) is None
    assert await grpc_load(target, 2.0) == 0
    failure = await grpc_probe(target, "grpc_health", 2.0)  # fake-vllm offers no grpc.health.v1 service
    assert failure is not None and failure[0] == "bad_status" and "UNIMPLEMENTED" in failure[1]
    replicas[1].stop()
    assert (await grpc_probe(replicas[1].grpc_target, "vllm", 2.0))[0] == "connection_failed"
    set_ = ReplicaSet()
    replica = set_.add(only(replicas[0]))
    assert await loadview._scrape(None, replica, 0.1) == 0  # type: ignore[arg-type]  (no HTTP client needed)

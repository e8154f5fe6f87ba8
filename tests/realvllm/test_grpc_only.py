"""Two real vLLM gRPC frontends (`python -m vllm.entrypoints.grpc_server`, which serves no HTTP at all) behind
the router, given by their gRPC addresses alone, with the default health settings: both serve; one killed is
ejected by its gRPC probe within the probe interval and its sessions are re-placed; restarted on its address,
it is probed back into rotation. vLLM's own stubs talk to the router."""
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from rollout_router.localfleet import Service, free_port, spawn
from rollout_router.policy.hashing import least_loaded
from rollout_router.settings import HealthSettings
from tests.support import keys_spread

from .conftest import ENV, LOG_DIR, TINY_MODEL_DIR, VLLM_PYTHON, enabled
from .vllm_process import VllmServer

if not enabled():
    pytest.skip(f"the real-vLLM tier is opt-in: set {ENV}=1 (make test-vllm)", allow_module_level=True)

pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(600)]

HOSTS = ("127.0.0.26", "127.0.0.27")
STARTUP_TIMEOUT = 300.0
DEFAULTS = HealthSettings()  # the router runs with these: nothing about health is configured
PROMPT = [(i * 37) % 500 + 7 for i in range(200)]


def status(router: Service) -> dict:
    with urllib.request.urlopen(f"{router.admin_url}/status", timeout=5) as answer:
        return json.load(answer)


def ready_grpc(router: Service) -> set[str]:
    return {b["url"] for b in status(router)["backends"] if b["ready_grpc"]}


def wait_until(check, timeout: float, what: str) -> float:
    """Seconds until ``check()`` held; fails naming ``what`` after ``timeout``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - started


def generate(router: Service, session: str) -> str:
    with grpc.insecure_channel(router.grpc_target) as channel:
        call = pb_grpc.VllmEngineStub(channel).Generate(
            pb.GenerateRequest(request_id=f"rr-{time.monotonic_ns()}", tokenized=pb.TokenizedInput(input_ids=PROMPT),
                               stream=True, sampling_params=pb.SamplingParams(max_tokens=4, ignore_eos=True)),
            metadata=(("x-session-id", session),), timeout=120)
        messages = list(call)
        assert messages[-1].WhichOneof("response") == "complete"
        return dict(call.initial_metadata())["x-rolloutrouter-replica"]


def server(host: str, port: int, cpu: str) -> VllmServer:
    return VllmServer(VLLM_PYTHON, TINY_MODEL_DIR, host, port, LOG_DIR / f"vllm-grpc-only-{host}.log",
                      grpc=True, cpu=cpu)


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Service, list[VllmServer]]]:
    servers = [server(host, free_port(host), str(cpu)).start() for cpu, host in enumerate(HOSTS)]
    router = None
    try:
        for started in servers:
            started.wait_ready(STARTUP_TIMEOUT)
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        with open(LOG_DIR / "router-grpc-only.log", "w") as log:
            starting = spawn(["serve", "--log-level", "info", "--grpc-port", "0",
                              *[a for s in servers for a in ("--backend", f"grpc://{s.target}")]], "127.0.0.1", log)
        router = starting.bound()
        wait_until(lambda: len(ready_grpc(router)) == 2, 30, "both gRPC-only replicas probed into rotation")
        yield router, servers
    finally:
        if router is not None:
            router.stop()
        for started in servers:
            started.stop()


def test_both_grpc_only_frontends_serve_with_the_default_health_settings(fleet):
    router, servers = fleet
    ids = [f"grpc://{s.target}" for s in servers]
    keys = keys_spread(lambda key: least_loaded(dict.fromkeys(ids, 0), key), ids, "real", 1)
    assert {generate(router, key) for key in keys} == set(ids)
    backends = status(router)["backends"]
    assert [b["protocols"] for b in backends] == [["grpc"], ["grpc"]]
    assert all(b["grpc_healthy"] and not b["ready"] for b in backends)  # never an HTTP target


def test_a_killed_frontend_is_ejected_within_the_probe_interval_and_comes_back(fleet):
    router, servers = fleet
    victim, survivor = servers
    victim_id, survivor_id = f"grpc://{victim.target}", f"grpc://{survivor.target}"
    session = next(k for k in (f"kill-{n}" for n in range(1000))
                   if least_loaded({victim_id: 0, survivor_id: 0}, k) == victim_id)
    assert generate(router, session) == victim_id
    victim.kill()
    limit = DEFAULTS.probe_interval_seconds + DEFAULTS.probe_timeout_seconds + 2  # one round, its timeout, slack
    took = wait_until(lambda: victim_id not in ready_grpc(router), limit, "the killed frontend ejected")
    assert generate(router, session) == survivor_id  # its session re-placed on its next turn
    assert status(router)["repinned"].get("unhealthy", 0) >= 1
    again = server(victim.host, victim.port, "0").start()  # restarted on its address
    try:
        again.wait_ready(STARTUP_TIMEOUT)
        wait_until(lambda: victim_id in ready_grpc(router), limit, "the restarted frontend back in rotation")
        assert generate(router, "after-restart") in {victim_id, survivor_id}
    finally:
        again.stop()
    (LOG_DIR / "grpc-only-timings.json").write_text(json.dumps({"ejected after (s)": round(took, 2)}) + "\n")

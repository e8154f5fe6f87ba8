"""Run by tests/test_dual_stack.py inside a network namespace of its own (loopback only, IPv4 and IPv6).

A simulated replica on ``::1`` (an IPv6 backend, HTTP and gRPC) behind a router started as the operator starts
it in a pod (``--host :: --admin-host ::``), and the operator's metrics endpoint as the chart starts it with
``operator.bindAddress: "::"``; every listener is then called over IPv4 and over IPv6. Prints one JSON line: what
each call answered.
"""
from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp
import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from rollout_router.localfleet import spawn, wait_healthy
from rollout_router_operator import metrics, status
from rollout_router_operator.render import ROUTER_ADMIN_PORT

FAMILIES = {"ipv4": "127.0.0.1", "ipv6": "[::1]"}


def http_turn(url: str) -> tuple[int, str | None]:
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}).encode()
    request = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json",
                                                                      "X-Session-ID": "dual-stack"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()
        return answer.status, answer.headers.get("x-rolloutrouter-replica")


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.status


def grpc_call(target: str) -> str:
    with grpc.insecure_channel(target) as channel:
        request = pb.GenerateRequest(text="hello", stream=True, sampling_params=pb.SamplingParams(max_tokens=2))
        call = pb_grpc.VllmEngineStub(channel).Generate(request, metadata=(("x-session-id", "dual-stack"),))
        last = list(call)[-1].WhichOneof("response")
        return f"{last} {dict(call.initial_metadata())['x-rolloutrouter-replica']}"


async def operator_polls(pod_ip: str) -> int:
    """What the operator's status poller read from the router pod at ``pod_ip``: its new-sessions counter."""
    async with aiohttp.ClientSession() as session:
        return (await status._poll(session, {"status": {"podIP": pod_ip}}))["new_sessions"]


def main() -> None:
    replica = wait_healthy(spawn(["fake-vllm", "--grpc-port", "0"], "::1").bound(), "/health")
    try:
        router = spawn(["serve", "--log-level", "warning", "--backend", replica.backend, "--grpc-port", "0",
                        "--admin-host", "::", "--admin-port", str(ROUTER_ADMIN_PORT)], "::").bound()
    except BaseException:
        replica.stop()
        raise
    operator_port = metrics.serve("::", 0)
    try:
        ports = {"http": int(router.url.rsplit(":", 1)[1]), "grpc": int((router.grpc_target or "").rsplit(":", 1)[1]),
                 "admin": int((router.admin_url or "").rsplit(":", 1)[1])}
        print(json.dumps({
            "replica": replica.backend,
            "http": {name: http_turn(f"http://{host}:{ports['http']}") for name, host in FAMILIES.items()},
            "admin": {name: get(f"http://{host}:{ports['admin']}/healthz") for name, host in FAMILIES.items()},
            "grpc": {name: grpc_call(f"{host}:{ports['grpc']}") for name, host in FAMILIES.items()},
            "operatorMetrics": {name: get(f"http://{host}:{operator_port}/metrics") for name, host in FAMILIES.items()},
            "operatorPoll": {name: asyncio.run(operator_polls(ip)) for name, ip in (("ipv4", "127.0.0.1"),
                                                                                     ("ipv6", "::1"))},
        }), flush=True)
    finally:
        router.stop()
        replica.stop()


if __name__ == "__main__":
    main()

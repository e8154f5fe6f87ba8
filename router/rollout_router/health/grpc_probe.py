"""Active health and load over gRPC, for replicas that serve no HTTP (vLLM's gRPC frontend).

A probe is one unary call on a fresh channel, as an HTTP probe is one request on a fresh connection:
vLLM's ``VllmEngine/HealthCheck`` (passes on ``healthy: true``) or the standard
``grpc.health.v1.Health/Check`` (passes on ``SERVING``), chosen by ``health.grpcProbe``. Any other
answer, a status other than OK, or no answer within ``probeTimeoutSeconds`` fails it.
``grpc_load`` reads ``VllmEngine/GetLoads`` (running + waiting requests over the ranks), the gRPC
twin of the ``vllm:num_requests_*`` gauges the ``vllm`` load view scrapes from ``/metrics``.
"""
from __future__ import annotations

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

Failure = tuple[str, str]  # (reason for metrics, detail for the log), as probes.Failure

VLLM_HEALTH = "/vllm.grpc.engine.VllmEngine/HealthCheck"
GRPC_HEALTH = "/grpc.health.v1.Health/Check"
GET_LOADS = "/vllm.grpc.engine.VllmEngine/GetLoads"
SERVING = b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}, its whole encoding


async def unary(target: str, method: str, request: bytes, timeout: float) -> bytes:
    """One call on a channel of its own, closed after; grpc.aio.AioRpcError when it fails."""
    async with grpc.aio.insecure_channel(target, options=[("grpc.enable_retries", 0)]) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        return await call(request, timeout=timeout, wait_for_ready=False)


async def grpc_probe(target: str, kind: str, timeout: float) -> Failure | None:
    """Probe ``target`` once: None when it says it is healthy, else (reason, detail)."""
    method = VLLM_HEALTH if kind == "vllm" else GRPC_HEALTH
    try:
        answer = await unary(target, method, b"", timeout)
    except grpc.aio.AioRpcError as error:
        code = error.code()
        reason = "timeout" if code is grpc.StatusCode.DEADLINE_EXCEEDED else (
            "connection_failed" if code is grpc.StatusCode.UNAVAILABLE else "bad_status")
        return reason, f"gRPC {method}: {code.name} {error.details() or ''}".rstrip()
    if kind == "vllm":
        health = pb.HealthCheckResponse.FromString(answer)
        return None if health.healthy else ("bad_status", f"gRPC {method}: healthy=false {health.message}".rstrip())
    return None if answer == SERVING else ("bad_status", f"gRPC {method}: not SERVING ({answer!r})")


async def grpc_load(target: str, timeout: float) -> int | None:
    """Requests running and waiting in the engine at ``target`` over all its ranks; None if unreadable."""
    try:
        answer = pb.GetLoadsResponse.FromString(await unary(target, GET_LOADS, b"", timeout))
    except grpc.aio.AioRpcError:
        return None
    return sum(load.num_running_reqs + load.num_waiting_reqs for load in answer.loads)

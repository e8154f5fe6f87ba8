"""The gRPC face of the fake replica: vLLM's ``vllm.grpc.engine.VllmEngine`` service.

Real vLLM serves it with ``python -m vllm.entrypoints.grpc_server`` (the
servicer comes from ``smg-grpc-servicer``, the messages from
``smg-grpc-proto``). Here it runs beside the HTTP side on the *same*
``Engine``: one prefix cache, one batch, one set of ``/metrics`` counters.
Token ids are the fake tokenizer's (``tokens.word_id``), so the ids that
``/tokenize`` returns for a prompt, sent as ``tokenized.input_ids``, hit the
blocks an HTTP request for that prompt left in the cache.

The answers are shaped like vLLM's servicer:

* ``Generate`` with ``stream=True`` sends one ``chunk`` per engine output
  (the new token ids; tokens that piled up while the client was slow come
  together, as vLLM's output queue merges them), then a ``complete`` that,
  like vLLM's, repeats the *last* delta and its count: a streaming client
  accumulates from the chunks. With ``stream=False`` there is one
  ``complete`` with every output id. Counts are ``prompt_tokens``,
  ``completion_tokens`` and ``cached_tokens`` (the prefix-cache hit).
* An out-of-band ``Abort`` ends the stream as vLLM does: an empty chunk and a
  ``complete`` with ``finish_reason="abort"``. A client that cancels the call
  aborts the request in the engine (blocks freed, gauges down), like an HTTP
  disconnect.
* Rejected input (no input, empty, too long, ``max_tokens=0``, ``n>1``,
  multimodal parts) is ``INVALID_ARGUMENT`` with vLLM's message where it has one.
* ``Embed``, ``FlushCache``, the profiler, ``GetTokenizer`` and
  ``SubscribeKvEvents`` answer ``UNIMPLEMENTED``.

The engine loop is not started here: with an aiohttp app from ``create_app``
it runs while the app's runner is set up; a bare ``Engine`` needs its
``run()`` driven by the caller.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import grpc
from aiohttp import web
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from ..listening import address
from .api import ENGINE, check_length
from .engine import Engine, Stream
from .protocol import ApiError
from .scheduler import Status
from .tokens import tokenize

logger = logging.getLogger(__name__)

SERVER_TYPE = "vllm-grpc"
VERSION = "fake-vllm"
# Every id the fake tokenizer makes is below 2**31 (see ``tokens.word_id``).
VOCAB_SIZE = 1 << 31

_UNIMPLEMENTED = ("Embed", "FlushCache", "StartProfile", "StopProfile", "GetTokenizer", "SubscribeKvEvents")


class BadRequest(Exception):
    """A request vLLM would refuse before it reaches the engine (INVALID_ARGUMENT)."""


class VllmEngineServicer(pb_grpc.VllmEngineServicer):
    """``VllmEngine`` over a fake ``Engine``; ``Abort`` sees the requests sent here by id."""

    def __init__(self, engine: Engine, start_time: float | None = None):
        self.engine = engine
        self.start_time = time.time() if start_time is None else start_time
        self.last_receive_timestamp = 0.0
        # request_id -> its live streams; vLLM lets a client reuse an id, and Abort takes them all.
        self._requests: dict[str, set[Stream]] = {}

    # ------------------------------------------------------------------ Generate

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        self.last_receive_timestamp = time.time()
        request_id = request.request_id or uuid.uuid4().hex
        try:
            prompt, max_tokens = self._validate(request)
            stream = self.engine.submit(prompt, max_tokens)
        except (BadRequest, ApiError, ValueError) as exc:  # ValueError: more KV blocks than the pool has
            message = exc.message if isinstance(exc, ApiError) else str(exc)
            logger.debug("Generate %s rejected: %s", request_id, message)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
            raise AssertionError("unreachable: context.abort raises") from None
        logger.debug("Generate %s: %d prompt tokens, stream=%s, session=%s", request_id, len(prompt),
                     request.stream, _metadata(context).get("x-session-id"))
        self._requests.setdefault(request_id, set()).add(stream)
        # A coroutine writing with context.write (not an async generator), so a
        # cancelled call raises right here and the ``finally`` aborts at once.
        try:
            await self._respond(request.stream, stream, context)
        finally:
            self.engine.abort(stream)  # a no-op unless the client left (or Abort) before the end
            streams = self._requests.get(request_id)
            if streams is not None:
                streams.discard(stream)
                if not streams:
                    del self._requests[request_id]

    def _validate(self, request: pb.GenerateRequest) -> tuple[list[int], int | None]:
        kind = request.WhichOneof("input")
        if kind == "tokenized":
            prompt = list(request.tokenized.input_ids)
        elif kind == "text":
            prompt = tokenize(request.text)
        else:
            raise BadRequest("GenerateRequest has no input: set tokenized.input_ids or text")
        if (request.HasField("mm_inputs") or request.HasField("media_refs")
                or len(request.extra_mm_inputs)):
            raise BadRequest(f"{self.engine.config.served_model_name} is a text-only model: "
                             "multimodal inputs are not supported")
        params = request.sampling_params
        max_tokens = params.max_tokens if params.HasField("max_tokens") else None
        if max_tokens is not None and max_tokens < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
        if params.n > 1:
            raise BadRequest(f"n={params.n} is not supported: this replica makes one output per request")
        check_length(self.engine.config, len(prompt), max_tokens)
        return prompt, max_tokens

    async def _respond(self, streaming: bool, stream: Stream, context: grpc.aio.ServicerContext) -> None:
        request = stream.request
        output: list[int] = []
        while True:
            delta, ended = await _next_delta(stream.queue)
            output += delta
            if streaming and (delta or ended):
                await context.write(pb.GenerateResponse(chunk=pb.GenerateStreamChunk(
                    token_ids=delta, prompt_tokens=request.num_prompt_tokens,
                    completion_tokens=len(delta), cached_tokens=request.num_cached_tokens or 0, index=0)))
            if ended:
                break
        ids = delta if streaming else output
        finish_reason = "abort" if request.status is Status.ABORTED else stream.finish_reason
        await context.write(pb.GenerateResponse(complete=pb.GenerateComplete(
            output_ids=ids, finish_reason=finish_reason, prompt_tokens=request.num_prompt_tokens,
            completion_tokens=len(ids), cached_tokens=request.num_cached_tokens or 0, index=0)))

    # ------------------------------------------------------------------ unary rpcs

    async def HealthCheck(self, request: pb.HealthCheckRequest,
                          context: grpc.aio.ServicerContext) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(healthy=True, message="Health")

    async def Abort(self, request: pb.AbortRequest, context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        """Abort every live request with one of these ids; unknown or finished ids are ignored."""
        for request_id in request.request_ids:
            for stream in list(self._requests.get(request_id, ())):
                self.engine.abort(stream)
        return pb.AbortResponse()

    async def GetModelInfo(self, request: pb.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> pb.GetModelInfoResponse:
        config = self.engine.config
        return pb.GetModelInfoResponse(
            model_path=config.served_model_name, served_model_name=config.served_model_name,
            tokenizer_path=config.served_model_name, is_generation=True,
            max_context_length=config.max_model_len, max_req_input_len=config.max_model_len,
            vocab_size=VOCAB_SIZE, supports_vision=False, model_type="fake",
            architectures=["FakeVllmForCausalLM"])

    async def GetServerInfo(self, request: pb.GetServerInfoRequest,
                            context: grpc.aio.ServicerContext) -> pb.GetServerInfoResponse:
        scheduler, config = self.engine.scheduler, self.engine.config
        return pb.GetServerInfoResponse(
            active_requests=len(scheduler.running) + len(scheduler.waiting), is_paused=False,
            last_receive_timestamp=self.last_receive_timestamp,
            uptime_seconds=time.time() - self.start_time, server_type=SERVER_TYPE,
            data_parallel_size=1, kv_cache_dtype="auto", block_size=config.block_size,
            max_num_seqs=config.max_num_seqs)

    async def GetLoads(self, request: pb.GetLoadsRequest,
                       context: grpc.aio.ServicerContext) -> pb.GetLoadsResponse:
        """One rank's load, read live from the engine (vLLM reads its last scheduler stats)."""
        scheduler, pool = self.engine.scheduler, self.engine.pool
        running, waiting = len(scheduler.running), len(scheduler.waiting)
        load = pb.SchedulerLoad(
            dp_rank=0, num_running_reqs=running, num_waiting_reqs=waiting,
            num_total_reqs=running + waiting, token_usage=pool.usage,
            num_used_tokens=pool.num_used * pool.block_size,
            max_total_num_tokens=pool.num_blocks * pool.block_size,
            max_running_requests=scheduler.max_num_seqs)
        return pb.GetLoadsResponse(timestamp=datetime.now(UTC).isoformat(), version=VERSION,
                                   dp_rank_count=1, loads=[load])


def _unimplemented(name: str):
    async def method(self: VllmEngineServicer, request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"fake-vllm does not implement {name}")

    method.__name__ = method.__qualname__ = name
    return method


for _name in _UNIMPLEMENTED:
    setattr(VllmEngineServicer, _name, _unimplemented(_name))


async def _next_delta(queue: asyncio.Queue[int | None]) -> tuple[list[int], bool]:
    """The tokens sampled since the last read (waiting for one), and whether the stream ended."""
    item = await queue.get()
    delta: list[int] = []
    while item is not None:
        delta.append(item)
        if queue.empty():
            return delta, False
        item = queue.get_nowait()
    return delta, True


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str | bytes]:
    return {key: value for key, value in (context.invocation_metadata() or ())}


async def start_grpc(target: web.Application | Engine, host: str = "127.0.0.1", port: int = 0,
                     options: Sequence[tuple[str, object]] = ()) -> tuple[grpc.aio.Server, int]:
    """Serve ``VllmEngine`` for an app's engine (or a bare ``Engine``); returns the server and its port.

    ``port=0`` picks a free port. Stop with ``await server.stop(grace)``: calls
    still running after the grace are cancelled and their requests aborted.
    Stop it before the app's runner is cleaned up (that stops the engine loop).
    """
    engine = target[ENGINE] if isinstance(target, web.Application) else target
    server = grpc.aio.server(options=[
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", -1),
        ("grpc.so_reuseport", 0),  # a port in use is an error, as for the HTTP side
        *options,
    ])
    pb_grpc.add_VllmEngineServicer_to_server(VllmEngineServicer(engine), server)
    where = address(host, port)
    try:
        bound = server.add_insecure_port(where)
    except RuntimeError as exc:
        raise OSError(f"cannot bind the gRPC server to {where}: {exc}") from None
    if not bound:
        raise OSError(f"cannot bind the gRPC server to {where}")
    await server.start()
    return server, bound

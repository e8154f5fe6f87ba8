"""The gRPC listener: every method passed through as raw bytes to the chosen replica.

No (de)serialization happens here. Methods whose client sends one message (all
of vLLM's ``VllmEngine``, known from its protos) are relayed as unary-request
calls; any other method as a bidirectional stream, which carries every shape
on the wire. The session key comes from request metadata (the HTTP header
names, lower-cased), routing goes through the same ``Balancer`` as HTTP, and
so a replica's in-flight count is one number across both protocols.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio
from multidict import CIMultiDict

from ..context import RouterContext
from ..health import TIMEOUT
from ..policy import NoReplicaError
from ..replicas import Lease
from .attempts import AllRefused, Refused, forward
from .errors import RouterError
from .session_key import session_key

log = logging.getLogger(__name__)

REPLICA_METADATA = "x-rolloutrouter-replica"
HOP_METADATA = "x-rolloutrouter-forwarded-by"  # set on calls forwarded to the session's owner router (fleet)
# On the router's own UNAVAILABLE answers, so a forwarding router tells them from an owner it cannot reach.
ROUTER_ANSWER = (("x-rolloutrouter-answered", "router"),)
# Set by the gRPC library on every call; forwarding them would clash with the upstream call's own.
_RESERVED = ("user-agent", "te", "content-type", "host", "grpc-")

Metadata = tuple[tuple[str, str | bytes], ...]
# Codes the transport or the router produce; any other code is the replica answering (passive health).
_TRANSPORT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL"})


def unary_request_methods() -> frozenset[str]:
    """Paths of the methods whose client sends exactly one message, from vLLM's protos."""
    try:
        from smg_grpc_proto.generated import vllm_engine_pb2
    except ImportError:  # without the protos every method is relayed as a stream, which also works
        return frozenset()
    return frozenset(f"/{service.full_name}/{method.name}"
                     for service in vllm_engine_pb2.DESCRIPTOR.services_by_name.values()
                     for method in service.methods if not method.client_streaming)


class _Single:
    """A one-message request: replayable on any retry."""

    replayable = True

    def __init__(self, message: bytes):
        self.message = message

    async def settle(self) -> None:
        return None


class _Replay:
    """A streamed request, remembered so a refused attempt can be retried.

    A retry replays what was read; it is allowed only while no read of the
    client's stream is pending (two readers of one stream would clash) and the
    buffer is small.
    """

    LIMIT = 64

    def __init__(self, source: AsyncIterator[bytes]):
        self._source, self._seen = source, list[bytes]()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def replayable(self) -> bool:
        return self._idle.is_set() and len(self._seen) <= self.LIMIT

    async def settle(self, timeout: float = 1.0) -> None:
        """Let a pending read of the client's stream finish before the call ends."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)

    async def messages(self) -> AsyncIterator[bytes]:
        for message in list(self._seen):
            yield message
        while True:
            self._idle.clear()
            try:
                message = await self._source.__anext__()
            except StopAsyncIteration:
                return
            finally:
                self._idle.set()
            self._seen.append(message)
            yield message


class GrpcProxy(grpc.GenericRpcHandler):
    def __init__(self, context: RouterContext):
        self._context = context
        self._channels: dict[str, aio.Channel] = {}
        self._unary = unary_request_methods()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        if method in self._unary:
            async def unary(request: bytes, context: aio.ServicerContext) -> None:
                await self._forward(method, _Single(request), context)
            return grpc.unary_stream_rpc_method_handler(unary)

        async def streamed(requests: AsyncIterator[bytes], context: aio.ServicerContext) -> None:
            await self._forward(method, _Replay(requests), context)
        return grpc.stream_stream_rpc_method_handler(streamed)

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels.values()))
        self._channels.clear()

    def prune(self) -> None:
        """Close channels to targets that no replica (live or still draining) or peer router has any more."""
        live = self._context.replicas.grpc_targets()
        if self._context.fleet is not None:  # and the owner routers calls are forwarded to
            live |= {m.grpc for m in self._context.fleet.membership.peers.values() if m.grpc}
        for target in set(self._channels) - live:
            asyncio.ensure_future(self._channels.pop(target).close())

    async def _forward(self, method: str, request: _Single | _Replay, context: aio.ServicerContext) -> None:
        metadata = _forwardable(context.invocation_metadata())
        text = CIMultiDict((k, v) for k, v in metadata if isinstance(v, str))
        try:
            key = session_key(text, b"", self._context.settings.session)
        except RouterError as error:
            self._context.metrics.errors.labels(error.reason).inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error.message)
        fleet = self._context.fleet
        if fleet is not None and key is not None:
            hop = ((HOP_METADATA, fleet.self_id),)

            async def to_owner(owner) -> bool:
                if owner.grpc is None:
                    return False
                if await self._to_owner(method, request, (*metadata, *hop), owner.grpc, context):
                    fleet.forwarded += 1
                    return True
                fleet.unreachable(owner, gone=True)
                return False

            if await fleet.via_owner(key, any(name == HOP_METADATA for name, _ in metadata), to_owner):
                return
        try:
            await forward(self._context, key, lambda lease: self._attempt(method, request, metadata, lease, context),
                          grpc=True)
        except NoReplicaError:
            self._context.metrics.errors.labels("no_replica").inc()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no replica with a gRPC port is available", ROUTER_ANSWER)
        except AllRefused as error:
            self._context.metrics.errors.labels("all_refused").inc()
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error), ROUTER_ANSWER)

    def _call(self, method: str, request: _Single | _Replay, metadata: Metadata, target: str,
              context: aio.ServicerContext):
        channel, timeout = self._channel(target), context.time_remaining()
        if isinstance(request, _Single):
            return channel.unary_stream(method)(request.message, metadata=metadata, timeout=timeout)
        return channel.stream_stream(method)(request.messages(), metadata=metadata, timeout=timeout)

    async def _attempt(self, method: str, request: _Single | _Replay, metadata: Metadata, lease: Lease,
                       context: aio.ServicerContext) -> bool:
        """One upstream call relayed to the client; whether the replica accepted it. Raises Refused if refused
        before answering."""
        assert lease.replica.grpc_target is not None  # acquire(grpc=True) only leases gRPC replicas
        call = self._call(method, request, metadata, lease.replica.grpc_target, context)
        started, answered = time.monotonic(), False
        code: str | None = "CANCELLED"
        try:
            response = await self._first(call, request)
            if response is None:
                code = "DEADLINE_EXCEEDED"
                self._timed_out(lease, context)
                return False
            while response is not aio.EOF:
                if not answered:
                    answered = True
                    await context.send_initial_metadata(_headers(await call.initial_metadata(), lease))
                await context.write(response)
                response = await call.read()
            code = (await call.code()).name
            if not answered:
                await context.send_initial_metadata(_headers(await call.initial_metadata(), lease))
            context.set_trailing_metadata(_forwardable(await call.trailing_metadata()))
        except aio.AioRpcError as error:
            code = error.code().name
            call.cancel()
            await request.settle()
            if error.code() is grpc.StatusCode.UNAVAILABLE and not answered and request.replayable:
                code = None
                raise Refused(error.details() or "UNAVAILABLE") from None
            context.set_code(error.code())
            context.set_details(error.details() or "")
            context.set_trailing_metadata(_forwardable(error.trailing_metadata()))
        finally:
            call.cancel()  # no-op when finished; stops the replica's work when the client went away
            if code is not None:
                self._context.metrics.observe(lease.replica_id, code, time.monotonic() - started)
        if answered or code not in _TRANSPORT_CODES:
            self._context.outliers.success(lease.replica)
        return answered or code == "OK"

    async def _to_owner(self, method: str, request: _Single | _Replay, metadata: Metadata, target: str,
                        context: aio.ServicerContext) -> bool:
        """Relay the call through the session's owner router; False when it was unavailable before answering
        (then this router decides). The owner's answer, errors included, is the client's."""
        call = self._call(method, request, metadata, target, context)
        answered = False
        try:
            response = await call.read()
            while response is not aio.EOF:
                if not answered:
                    answered = True
                    await context.send_initial_metadata(_forwardable(await call.initial_metadata()))
                await context.write(response)
                response = await call.read()
            if not answered:
                await context.send_initial_metadata(_forwardable(await call.initial_metadata()))
            context.set_trailing_metadata(_forwardable(await call.trailing_metadata()))
            context.set_code(await call.code())
            context.set_details(await call.details() or "")
        except aio.AioRpcError as error:
            call.cancel()
            await request.settle()
            trailers = _forwardable(error.trailing_metadata())
            if error.code() is grpc.StatusCode.UNAVAILABLE and not answered and request.replayable \
                    and ROUTER_ANSWER[0] not in trailers:
                return False
            context.set_code(error.code())
            context.set_details(error.details() or "")
            context.set_trailing_metadata(_forwardable(error.trailing_metadata()))
        finally:
            call.cancel()
        return True

    async def _first(self, call: Any, request: _Single | _Replay) -> Any:
        """The call's first message (or ``aio.EOF``); None when a one-message request got none within
        ``firstByteTimeoutSeconds``. A streamed request is not timed: its replica may wait for the client."""
        limit = self._context.settings.first_byte_timeout_seconds
        if limit is None or not isinstance(request, _Single):
            return await call.read()
        try:
            async with asyncio.timeout(limit):
                return await call.read()
        except TimeoutError:
            return None

    def _timed_out(self, lease: Lease, context: aio.ServicerContext) -> None:
        """The replica sent nothing within the first-byte timeout: DEADLINE_EXCEEDED, and a failure in its streak."""
        self._context.metrics.errors.labels("timeout").inc()
        self._context.outliers.failure(lease.replica, TIMEOUT)
        context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
        context.set_details(f"replica {lease.replica_id} did not answer in time (firstByteTimeoutSeconds)")

    def _channel(self, target: str) -> aio.Channel:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = aio.insecure_channel(target)
        return channel


def _forwardable(metadata) -> Metadata:
    return tuple((k, v) for k, v in (metadata or ()) if not k.startswith(":") and not k.startswith(_RESERVED))


def _headers(upstream, lease: Lease) -> Metadata:
    return (*_forwardable(upstream), (REPLICA_METADATA, lease.replica_id))


async def start_server(proxy: GrpcProxy, address: str) -> tuple[aio.Server, int]:
    """Serve ``proxy`` on ``address`` (host:port, port 0 = any); returns the server and its port."""
    server = aio.server()
    server.add_generic_rpc_handlers((proxy,))
    port = server.add_insecure_port(address)
    await server.start()
    return server, port

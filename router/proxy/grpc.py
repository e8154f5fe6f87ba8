"""The gRPC listener: every method passed through as raw bytes to the chosen replica.

gRPC is a stream of messages either way on the wire, so one stream-stream
handler carries unary and streaming methods alike; no protos are needed. The
session key comes from request metadata (the same names as the HTTP headers,
lower-cased), the routing goes through the same ``Balancer`` as HTTP, and so
a replica's in-flight count is one number across both protocols.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc
from grpc import aio

from ..balancer import Balancer
from ..observability import Metrics
from ..policy import NoReplicaError
from ..replicas import Lease
from ..settings import RouterSettings

log = logging.getLogger(__name__)

REPLICA_METADATA = "x-rolloutrouter-replica"
# Set by the gRPC library on every call; forwarding them would clash with the upstream call's own.
_RESERVED = ("user-agent", "te", "content-type", "host", "grpc-")


class _Replay:
    """The client's request messages, remembered so a refused attempt can be retried."""

    def __init__(self, source: AsyncIterator[bytes]):
        self._source, self._seen = source, []

    async def messages(self) -> AsyncIterator[bytes]:
        for message in list(self._seen):
            yield message
        async for message in self._source:
            self._seen.append(message)
            yield message


class GrpcProxy(grpc.GenericRpcHandler):
    def __init__(self, balancer: Balancer, metrics: Metrics, settings: Callable[[], RouterSettings]):
        self._balancer, self._metrics, self._settings = balancer, metrics, settings
        self._channels: dict[str, aio.Channel] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        async def forward(requests: AsyncIterator[bytes], context: aio.ServicerContext) -> AsyncIterator[bytes]:
            async for response in self._forward(details.method, requests, context):
                yield response
        return grpc.stream_stream_rpc_method_handler(forward)

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels.values()))
        self._channels.clear()

    def prune(self) -> None:
        """Close channels to targets no replica has any more."""
        live = {r.grpc_target for r in self._balancer.replicas.replicas()}
        for target in set(self._channels) - live:
            asyncio.ensure_future(self._channels.pop(target).close())

    async def _forward(self, method: str, requests: AsyncIterator[bytes],
                       context: aio.ServicerContext) -> AsyncIterator[bytes]:
        settings = self._settings()
        metadata = _forwardable(context.invocation_metadata())
        key = next((value for name in settings.session.headers
                    for k, value in metadata if k == name.lower() and value), None)
        replay = _Replay(requests)
        for _ in range(settings.connect_retries + 1):
            try:
                _, lease = self._balancer.acquire(key if isinstance(key, str) else None, grpc=True)
            except NoReplicaError:
                self._metrics.errors.labels("no_replica").inc()
                await context.abort(grpc.StatusCode.UNAVAILABLE, "no replica with a gRPC port is available")
            try:
                refused = False
                async for response in self._attempt(method, replay, metadata, lease, context):
                    if response is None:
                        refused = True
                        break
                    yield response
                if not refused:
                    return
            finally:
                lease.release()
        self._metrics.errors.labels("all_refused").inc()
        await context.abort(grpc.StatusCode.UNAVAILABLE,
                            f"replicas refused the connection on all {settings.connect_retries + 1} attempts")

    async def _attempt(self, method: str, replay: _Replay, metadata: Metadata, lease: Lease,
                       context: aio.ServicerContext) -> AsyncIterator[bytes | None]:
        """One upstream call; yields responses, or a single None if it was refused before answering."""
        target = lease.replica.grpc_target
        call = self._channel(target).stream_stream(method)(
            replay.messages(), metadata=metadata, timeout=context.time_remaining())
        started, code, answered = time.monotonic(), "CANCELLED", False
        try:
            async for response in call:
                if not answered:
                    answered = True
                    await context.send_initial_metadata(_headers(await call.initial_metadata(), lease))
                yield response
            code = (await call.code()).name
            if not answered:
                await context.send_initial_metadata(_headers(await call.initial_metadata(), lease))
            context.set_trailing_metadata(_forwardable(await call.trailing_metadata()))
        except aio.AioRpcError as error:
            code = error.code().name
            if error.code() is grpc.StatusCode.UNAVAILABLE and not answered:
                self._balancer.replicas.mark_down(lease.replica_id, self._settings().down_seconds)
                self._metrics.retries.labels(lease.replica_id).inc()
                code = None
                yield None
                return
            await context.abort(error.code(), error.details() or "", _forwardable(error.trailing_metadata()))
        finally:
            call.cancel()  # no-op when finished; stops the replica's work when the client went away
            if code is not None:
                self._metrics.observe(lease.replica_id, code, time.monotonic() - started)

    def _channel(self, target: str) -> aio.Channel:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = aio.insecure_channel(target)
        return channel


Metadata = tuple[tuple[str, str | bytes], ...]


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

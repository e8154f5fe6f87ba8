"""The HTTP listener: OpenAI-compatible paths forwarded to the chosen replica.

Bodies are read once (the session key may live in them, and a refused
connection is retried with the same bytes); responses stream through chunk by
chunk. Every lease is released exactly once, in a ``finally``, whatever ends
the response: success, upstream error, client disconnect or timeout.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time

import aiohttp
from aiohttp import web

from ..context import RouterContext
from ..policy import NoReplicaError
from ..replicas import Lease
from ..settings import RouterSettings
from .attempts import AllRefused, Refused, forward
from .errors import RouterError, error_body, error_response
from .session_key import session_key

log = logging.getLogger(__name__)

REPLICA_HEADER = "X-RolloutRouter-Replica"
CLIENT_CLOSED = 499  # nginx's code for "client went away", used in metrics only

# What vLLM's OpenAI-compatible server serves; anything else is a 404 from us.
FORWARDED_PATHS = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/models",
    "/v1/score", "/v1/rerank", "/v2/rerank", "/v1/audio/transcriptions", "/v1/audio/translations",
    "/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank", "/invocations", "/version",
})
FORWARDED_PREFIXES = ("/v1/responses/", "/v1/models/")
# Paths that read no conversation state: routed least-loaded, so they never move or count a session's pin.
UNKEYED_PATHS = frozenset({"/v1/models", "/tokenize", "/detokenize", "/version"})

BUFFER_LIMIT = 1 << 20  # non-streaming bodies up to this size are relayed in one piece
KEEPALIVE_SECONDS = 4.0  # idle upstream connections close before uvicorn's 5 s keep-alive closes them under us

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
})


def forwarded(path: str) -> bool:
    return path in FORWARDED_PATHS or path.startswith(FORWARDED_PREFIXES)


def _unkeyed(path: str) -> bool:
    return path in UNKEYED_PATHS or path.startswith("/v1/models/")


def end_to_end(headers) -> dict[str, str]:
    """Headers minus hop-by-hop ones, including those named by Connection."""
    named = {h.strip().lower() for h in headers.get("Connection", "").split(",") if h.strip()}
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in named}


SSE_DONE = b"data: [DONE]"


@dataclasses.dataclass(slots=True)
class _Outcome:
    """The status code to record for one attempt: a client that left counts as 499 until we know better."""

    code: int | None = CLIENT_CLOSED


class HttpProxy:
    """Forwards the OpenAI-compatible paths; owns the pooled upstream HTTP connections."""

    def __init__(self, context: RouterContext):
        self._context = context
        self._client: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the upstream connection pool (inside the running loop)."""
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, keepalive_timeout=KEEPALIVE_SECONDS)
        self._client = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not forwarded(request.path):
            return self._refuse(RouterError(404, f"path {request.path} is not an OpenAI-compatible endpoint this router forwards"))
        settings = self._context.settings
        try:
            body = await read_body(request, settings.max_body_bytes)
            key = None if _unkeyed(request.path) else session_key(request.headers, body, settings.session)
        except RouterError as error:
            return self._refuse(error)
        headers = end_to_end(request.headers)  # once: every attempt sends the same request
        try:
            return await forward(self._context, key,
                                 lambda lease: self._dispatch(request, headers, body, lease, settings))
        except NoReplicaError:
            return self._refuse(RouterError(503, "no replica is available to serve this request"), "no_replica")
        except AllRefused as error:
            return self._refuse(RouterError(503, str(error)), "all_refused")

    async def _dispatch(self, request: web.Request, headers: dict[str, str], body: bytes, lease: Lease,
                        settings: RouterSettings) -> web.StreamResponse:
        assert self._client is not None, "HttpProxy.start() first"
        url = lease.replica_id + request.rel_url.raw_path_qs
        started, outcome = time.monotonic(), _Outcome()
        try:
            try:
                upstream = await self._client.request(
                    request.method, url, headers=headers, data=body or None,
                    allow_redirects=False, timeout=_timeout(settings))
            except aiohttp.ClientConnectorError as error:
                outcome.code = None
                raise Refused(str(error)) from None
            except asyncio.TimeoutError:
                outcome.code = 504
                return self._refuse(RouterError(504, f"replica {lease.replica_id} did not answer in time"), "timeout",
                                    lease.replica_id)
            except aiohttp.ClientError as error:
                outcome.code = 502
                return self._refuse(RouterError(502, f"replica {lease.replica_id} failed: {error or type(error).__name__}"),
                                    "upstream_error", lease.replica_id)
            async with upstream:
                return await self._relay(request, upstream, lease, outcome)
        finally:
            if outcome.code is not None:
                self._context.metrics.observe(lease.replica_id, outcome.code, time.monotonic() - started)

    async def _relay(self, request: web.Request, upstream: aiohttp.ClientResponse, lease: Lease,
                     outcome: _Outcome) -> web.StreamResponse:
        """Pass the upstream response on, noting in ``outcome`` the code to record.

        A small body of known length is read whole and sent in one write (the
        common non-streaming JSON answer); anything else, SSE above all, streams.
        """
        headers = end_to_end(upstream.headers)
        headers[REPLICA_HEADER] = lease.replica_id
        length = upstream.content_length
        if length is not None and length <= BUFFER_LIMIT and upstream.content_type != "text/event-stream":
            try:
                body = await upstream.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                outcome.code = 502
                return self._refuse(RouterError(502, f"replica {lease.replica_id} broke off mid-response: "
                                                     f"{type(error).__name__}"), "upstream_broke_mid_response",
                                    lease.replica_id)
            outcome.code = upstream.status
            return web.Response(body=body, status=upstream.status, reason=upstream.reason, headers=headers)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        if length is not None:
            response.content_length = length
        await response.prepare(request)
        tail = b""
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
                tail = (tail + chunk)[-len(SSE_DONE) - 4:]
                if tail.rstrip().endswith(SSE_DONE):
                    # The client has the whole answer: OpenAI clients hang up right here,
                    # before the replica's end of body, and that is a success, not a 499.
                    outcome.code = upstream.status
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError,
                asyncio.TimeoutError) as error:
            outcome.code = 502
            await self._broken_stream(request, response, upstream, lease, error)
            return response
        except ConnectionResetError:  # the client went away; leaving `async with` closes upstream
            return response
        await response.write_eof()
        outcome.code = upstream.status
        return response

    async def _broken_stream(self, request: web.Request, response: web.StreamResponse,
                             upstream: aiohttp.ClientResponse, lease: Lease, error: BaseException) -> None:
        """End the client's response with an error it can see: an SSE error event, else a cut connection."""
        self._context.metrics.errors.labels("upstream_broke_mid_response").inc()
        log.warning("replica %s broke off mid-response: %r", lease.replica_id, error)
        if upstream.content_type == "text/event-stream":
            message = f"replica {lease.replica_id} failed mid-stream: {type(error).__name__}"
            with contextlib.suppress(ConnectionResetError):  # the client may be gone as well
                await response.write(b"data: " + json.dumps(error_body(502, message)).encode() + b"\n\n")
                await response.write_eof()
        elif request.transport is not None:
            request.transport.close()

    def _refuse(self, error: RouterError, reason: str | None = None, replica: str | None = None) -> web.Response:
        """The router's own error answer; names the replica when one was involved."""
        self._context.metrics.errors.labels(reason or f"http_{error.status}").inc()
        response = error_response(error.status, error.message, error.param)
        if replica is not None:
            response.headers[REPLICA_HEADER] = replica
        return response


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole request body, or a 413 naming the limit."""
    if request.content_length is not None and request.content_length > limit:
        raise RouterError(413, f"request body of {request.content_length} bytes exceeds maxBodyBytes={limit}")
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise RouterError(413, f"request body exceeds maxBodyBytes={limit}")
        chunks.append(chunk)
    return b"".join(chunks)


def _timeout(settings: RouterSettings) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=settings.upstream_timeout_seconds)

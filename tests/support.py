"""Test helpers: a scripted replica and an in-process router on real sockets (port 0), waiting for a
condition, an event loop on a simulated clock, and session keys that land where a test needs them."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from rollout_router.app import Runtime
from rollout_router.proxy.http.admin_listener import TokenFile
from rollout_router.serve import DATA_PATH_ENV
from rollout_router.settings import HealthSettings, RouterSettings

T = TypeVar("T")


@dataclass
class ScriptedReplica:
    """A replica whose behaviour a test controls: hold requests, stream, or die mid-stream.

    ``hold`` (when set) is awaited before answering, so tests can build exact
    in-flight skew; ``die_after`` cuts the connection after that many chunks;
    ``status`` other than 200 answers chat requests with that error; ``healthy``
    is what its ``/health`` says (200 or 503).
    """

    host: str
    port: int = 0
    chunks: int = 3
    hold: asyncio.Event | None = None
    die_after: int | None = None
    linger: float = 0.0  # pause between `data: [DONE]` and the end of the body, as uvicorn's separate writes
    status: int = 200
    healthy: bool = True
    probes: int = 0
    seen: list[dict] = field(default_factory=list)
    active: int = 0
    cancelled: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> ScriptedReplica:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]  # the kernel's pick when port is 0
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, request: web.Request) -> web.Response:
        self.probes += 1
        return web.Response(status=200 if self.healthy else 503)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append({"headers": dict(request.headers), "body": body, "query": request.query_string})
        self.active += 1
        try:
            if self.hold is not None:
                await self.hold.wait()
            if self.status != 200:
                return web.json_response({"error": {"message": "rejected", "type": "BadRequestError",
                                                    "param": None, "code": self.status}}, status=self.status)
            if not body.get("stream") and self.die_after is not None:
                return await self._cut_short(request)
            if not body.get("stream"):
                return web.json_response({"id": "x", "object": "chat.completion", "replica": self.url,
                                          "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                                       "finish_reason": "stop"}]})
            return await self._stream(request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1

    async def _cut_short(self, request: web.Request) -> web.StreamResponse:
        """Promise 1000 bytes, send 10, hang up."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 1000
        await response.prepare(request)
        await response.write(b'{"id": "x"')
        request.transport.close()
        return response

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(self.chunks):
            if self.die_after is not None and index == self.die_after:
                request.transport.close()
                return response
            chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "tiny",
                     "choices": [{"index": 0, "delta": {"content": f"t{index} "}, "finish_reason": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.01)
        await response.write(b"data: [DONE]\n\n")
        await asyncio.sleep(self.linger)
        await response.write_eof()
        return response


NO_PROBES = HealthSettings(probe_interval_seconds=None)  # for replicas that serve no /health, or count requests


@dataclass
class BrokenReplica:
    """A replica that accepts connections, reads what it is sent and then misbehaves.

    ``mode`` "hang" never answers (a wedged engine behind a live socket);
    "garbage" answers bytes that are not HTTP and keeps the connection open.
    """

    host: str
    mode: str = "hang"
    port: int = 0
    connections: int = 0
    _server: asyncio.AbstractServer | None = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> BrokenReplica:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            if self.mode == "garbage":
                writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
            await reader.read()  # hold the connection until the other side closes it

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in self._writers:
                writer.transport.abort()
            self._server = None


@contextlib.asynccontextmanager
async def scripted_replicas(first: int, count: int):
    """``count`` started ScriptedReplicas on 127.0.0.<first> and the addresses after it, each stopped afterwards
    (one that failed to start too: the ones before it are stopped)."""
    started: list[ScriptedReplica] = []
    try:
        for i in range(count):
            started.append(await ScriptedReplica(f"127.0.0.{first + i}").start())
        yield started
    finally:
        for replica in started:
            await replica.stop()


@contextlib.asynccontextmanager
async def running_router(settings: RouterSettings, host: str = "127.0.0.1", grpc: bool = False,
                         admin_token: TokenFile | None = None, data_path: str | None = None):
    """An in-process router on a real socket; yields (base_url, runtime).

    Every listener binds port 0: the kernel picks free ports (``runtime.grpc_port`` with ``grpc``; the admin
    listener on loopback, ``runtime.admin_url``). ``data_path``: ``serve --data-path``'s, by default as the
    environment says (``make test`` runs the data path's tests on each).
    """
    runtime = Runtime(settings, grpc_address=f"{host}:0" if grpc else None, admin_address=("127.0.0.1", 0),
                      admin_token=admin_token, data_path=data_path or os.environ.get(DATA_PATH_ENV, "auto"))
    port = await runtime.start(host, 0)
    try:
        yield f"http://{host}:{port}", runtime
    finally:
        await runtime.stop()


async def wait_for(predicate, timeout: float = 5.0, interval: float = 0.01) -> None:
    """Poll until ``predicate()`` is true; fail loudly when it never is."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def wait_until(check: Callable[[], object], what: str, timeout: float = 20.0) -> object:
    """Poll ``check`` until it returns something truthy, and return that (exceptions count as not yet).

    The blocking twin of ``wait_for``, for tests that drive processes.
    """
    last: object = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as error:  # noqa: BLE001  (not there yet)
            last = error
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


class _JumpingSelector(selectors.DefaultSelector):
    """Never sleeps for a timer: when nothing is ready, it moves the loop's clock to the timer instead."""

    def __init__(self, loop: VirtualClockLoop):
        super().__init__()
        self.loop = loop

    def select(self, timeout: float | None = None):
        ready = super().select(0 if timeout is not None else None)
        if not ready and timeout:
            self.loop.now += timeout
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on a simulated clock: whenever every task waits on a timer, time jumps to it.

    Code under test keeps calling ``loop.time()`` and ``asyncio.sleep``; durations
    it measures are then exactly the ones it simulated, however loaded the machine
    (for in-process engines only: real sockets would see time jump).
    """

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now


def run_in_virtual_time(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh ``VirtualClockLoop``."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()


def keys_spread(place: Callable[[str], object], targets: Sequence[object], prefix: str, per_target: int) -> list[str]:
    """``per_target`` keys ``prefix-N`` that ``place`` sends to each of ``targets``, interleaved target by target.

    Routers bind random ports and are hashed by URL, so a fixed list of keys leaves some router without a
    session in a few runs out of a hundred; chosen keys cover every router in every run.
    """
    chosen: list[list[str]] = [[] for _ in targets]
    for n in range(100_000):
        key = f"{prefix}-{n}"
        bucket = chosen[list(targets).index(place(key))]
        if len(bucket) < per_target:
            bucket.append(key)
        if all(len(b) == per_target for b in chosen):
            return [key for keys in zip(*chosen) for key in keys]
    raise AssertionError(f"no {per_target} keys per target among 100,000 {prefix}-N")

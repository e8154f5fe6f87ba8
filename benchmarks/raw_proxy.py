"""The floor for a Python proxy: uvloop + httptools, a keep-alive pool, the session header hashed to a replica.

No limits, no health, no metrics, no fleet, no retries, no error handling beyond closing: what a single-process
asyncio proxy costs per request before any router feature, so benchmarks/proxy_cost.py can show how much of
ours is the language and how much is the router (issue 22's "raw asyncio proxy" row). Responses are relayed as
they come, byte for byte; requests are re-sent as parsed (one head, the body).

    python benchmarks/raw_proxy.py HOST PORT BACKEND_URL...
"""
from __future__ import annotations

import asyncio
import sys
import zlib
from collections import deque
from urllib.parse import urlsplit

import httptools
import uvloop


class Upstream(asyncio.Protocol):
    """One pooled connection to a replica: relays the response to its client until it is complete."""

    def __init__(self, pool: list[Upstream]) -> None:
        self.pool = pool
        self.client: Client | None = None
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport

    def data_received(self, data: bytes) -> None:
        if self.client is not None and self.client.transport is not None:
            self.client.transport.write(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        self.pool.append(self)
        if client is not None:
            client.answered()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)


class Client(asyncio.Protocol):
    """One client connection: each request goes to the replica its X-Session-ID hashes to, in order."""

    def __init__(self, replicas: list[tuple[str, int]], pools: list[list[Upstream]]) -> None:
        self.replicas, self.pools, self.busy = replicas, pools, False
        self.queue: deque[tuple[int, bytes]] = deque()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.headers: list[bytes] = []
        self.body: list[bytes] = []
        self.key = self.url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.headers, self.body, self.key = [], [], b""

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append(b"%s: %s\r\n" % (name, value))
        if name.lower() == b"x-session-id":
            self.key = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        head = b"%s %s HTTP/1.1\r\n%s\r\n" % (self.parser.get_method(), self.url, b"".join(self.headers))
        self.queue.append((zlib.crc32(self.key) % len(self.replicas), head + b"".join(self.body)))
        if not self.busy:
            self.next()

    def next(self) -> None:
        """The next queued request to a pooled connection, or to a new one (then in a task)."""
        self.busy = True
        index, request = self.queue.popleft()
        pool = self.pools[index]
        if pool:
            self.send(pool.pop(), request)
        else:
            asyncio.get_running_loop().create_task(self.connect(index, request))

    async def connect(self, index: int, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(lambda: Upstream(self.pools[index]), *self.replicas[index])
        self.send(upstream, request)

    def send(self, upstream: Upstream, request: bytes) -> None:
        upstream.client = self
        if upstream.transport is not None:
            upstream.transport.write(request)

    def answered(self) -> None:
        self.busy = False
        if self.queue:
            self.next()


async def serve(host: str, port: int, backends: list[str]) -> asyncio.Server:
    replicas = [(urlsplit(url).hostname or "", urlsplit(url).port or 80) for url in backends]
    pools: list[list[Upstream]] = [[] for _ in replicas]
    return await asyncio.get_running_loop().create_server(lambda: Client(replicas, pools), host, port)


async def main(host: str, port: int, backends: list[str]) -> None:
    await (await serve(host, port, backends)).serve_forever()


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))

"""Calls to other routers' admin listeners: info, loads, pin handoff; and replica ``/metrics`` scrapes.

One aiohttp session with keep-alive connections, off the data path (the data
path forwards to owners through the proxy's own upstream pool). Every call
carries this router's admin token: all routers of a fleet share one.
``Unreachable`` means the other side could not be reached or did not answer in
time; an answer with an error status is ``PeerError``.
"""
from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from .. import jsonbody

# No answer, or one cut short: the other side could not be reached, went away or was silent too long.
UNANSWERED = (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError)
# Connections to one router at once: its watch of the loads and calls; more calls wait for one (the admin
# listener there keeps this many per candidate peer, proxy/http/admin_listener.py).
PER_PEER = 8
MAX_LINE_BYTES = 1 << 20  # a watch's read buffer; a line over twice this (a peer's loads: ~50 bytes a replica) is an error


class Unreachable(Exception):
    """No answer: refused, reset, or not within the timeout."""


class PeerError(Exception):
    """The peer answered with an error status (``status``), or a body that is not JSON (``status`` None)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class PeerClient:
    def __init__(self, token: Callable[[], bytes | None], timeout: float):
        self._token, self.timeout = token, timeout
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        token = self._token()
        return {"Authorization": f"Bearer {token.decode()}"} if token else {}

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                limit=0, limit_per_host=PER_PEER, ttl_dns_cache=None))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, method: str, url: str, body: Any = None, timeout: float | None = None) -> Any:
        """One JSON call; raises Unreachable or PeerError."""
        try:
            async with self._open().request(method, url, json=body, headers=self._headers(),
                                            timeout=aiohttp.ClientTimeout(total=timeout or self.timeout)) as answer:
                if answer.status >= 400:
                    raise PeerError(f"{method} {url} answered {answer.status}: {(await answer.text())[:200]}",
                                    answer.status)
                return await answer.json(content_type=None)
        except UNANSWERED as error:
            raise Unreachable(f"{method} {url}: {error!r}") from None
        except (aiohttp.ClientResponseError, ValueError) as error:
            raise PeerError(f"{method} {url}: {error!r}") from None

    async def watch(self, url: str) -> AsyncGenerator[Any, None]:
        """The JSON documents a streamed answer of JSON lines carries, as they come; raises Unreachable (nothing
        within the timeout between two lines too) or PeerError. An answer of one document (a router that does
        not stream) is one item, then the end."""
        try:
            async with self._open().get(url, headers=self._headers(), read_bufsize=MAX_LINE_BYTES,
                                        timeout=aiohttp.ClientTimeout(sock_connect=self.timeout,
                                                                      sock_read=self.timeout)) as answer:
                if answer.status >= 400:
                    raise PeerError(f"GET {url} answered {answer.status}: {(await answer.text())[:200]}")
                async for line in answer.content:
                    if line.strip():
                        yield jsonbody.parse(line)
        except UNANSWERED as error:
            raise Unreachable(f"GET {url}: {error!r}") from None
        except (aiohttp.ClientError, HttpProcessingError, ValueError) as error:  # a line too long among them
            raise PeerError(f"GET {url}: {error!r}") from None

    async def text(self, url: str, timeout: float | None = None) -> str:
        """A plain GET (a replica's /metrics); raises Unreachable or PeerError."""
        try:
            async with self._open().get(url, timeout=aiohttp.ClientTimeout(total=timeout or self.timeout)) as answer:
                if answer.status != 200:
                    raise PeerError(f"GET {url} answered {answer.status}")
                return await answer.text()
        except UNANSWERED as error:
            raise Unreachable(f"GET {url}: {error!r}") from None

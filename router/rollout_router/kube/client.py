"""Authenticated requests to one API server, on aiohttp (cancellable, no threads).

``Client.request`` sends one JSON request; ``Client.stream`` reads a watch's
newline-delimited JSON events. Error statuses raise ``ApiError``; transport
failures raise aiohttp's errors (both listed in ``TRANSIENT`` when retrying helps).
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp

from . import credentials
from .credentials import Credentials

if TYPE_CHECKING:
    from .resources import Resource

REQUEST_SECONDS = 30


class ApiError(Exception):
    """The API answered with an error status (a Kubernetes ``Status`` object, usually)."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message

    @classmethod
    def from_status(cls, status: Mapping[str, Any], default_code: int = 500) -> ApiError:
        """From a ``Status`` object: an error response's body, or a watch's ERROR event."""
        return cls(int(status.get("code") or default_code), status.get("reason") or "",
                   status.get("message") or "no message")

    @property
    def retryable(self) -> bool:
        """A conflict, a throttle or a server error: the same request may succeed later."""
        return self.status in (409, 429) or self.status >= 500


TRANSIENT = (aiohttp.ClientError, asyncio.TimeoutError)  # connection refused, dropped, timed out


async def _raise_for_status(response: aiohttp.ClientResponse) -> None:
    if response.status < 400:
        return
    text = await response.text()
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        raise ApiError.from_status(body, response.status)
    raise ApiError(response.status, response.reason or "", text)


class Client:
    """One aiohttp session to the API server; ``async with Client(...)`` or ``await client.close()``."""

    def __init__(self, creds: Credentials):
        self.credentials = creds
        self.server = creds.server
        self.discovered: dict[str, dict[str, Resource]] = {}  # apiVersion -> kind -> resource (``resources``)
        self._ssl = creds.ssl_context()
        self._session = aiohttp.ClientSession()

    @classmethod
    async def connect(cls) -> Client:
        """A client with the environment's credentials (in-cluster, else KUBECONFIG)."""
        return cls(await asyncio.to_thread(credentials.load))

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        authorization = self.credentials.authorization()
        if authorization:
            headers["Authorization"] = authorization
        return headers

    async def request(self, method: str, path: str, *, params: Mapping[str, str] | None = None, body: Any = None,
                      content_type: str = "application/json") -> Any:
        """One request; the decoded JSON answer."""
        data = None if body is None else json.dumps(body)
        async with self._session.request(method, self.server + path, params=params, data=data, ssl=self._ssl,
                                         headers=self._headers(content_type if data is not None else None),
                                         timeout=aiohttp.ClientTimeout(total=REQUEST_SECONDS)) as response:
            await _raise_for_status(response)
            return await response.json(content_type=None)

    async def stream(self, path: str, params: Mapping[str, str], read_seconds: float) -> AsyncIterator[dict]:
        """The JSON lines of a long-lived GET (a watch) until the server ends it."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_seconds)
        async with self._session.get(self.server + path, params=params, headers=self._headers(), ssl=self._ssl,
                                     timeout=timeout) as response:
            await _raise_for_status(response)
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)

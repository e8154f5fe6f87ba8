"""An HTTP listener (the traffic port, the admin port): HTTP/1.1 connections whose requests ``handle`` answers."""
from __future__ import annotations

import asyncio

from ..listener import Listener
from .server import ClientConnection, HttpRequest


class HttpListener(Listener):
    """The HTTP side of ``Listener``: its clients are ``ClientConnection``s, parsed with llhttp."""

    def connection(self) -> asyncio.Protocol:
        return ClientConnection(self)

    def key_names(self) -> tuple[tuple[bytes, ...], frozenset[bytes]]:
        """Headers holding a session key (none unless the listener forwards)."""
        return (), frozenset()

    def dispatch(self, client: ClientConnection, request: HttpRequest) -> None:
        """Start answering ``request`` (in a Task here; the traffic listener forwards most without one)."""
        client.answer_later(request, self.handle(client, request))

    async def handle(self, client: ClientConnection, request: HttpRequest) -> None:
        raise NotImplementedError

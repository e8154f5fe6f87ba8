"""An HTTP listener (the traffic port, the admin port): HTTP/1.1 connections whose requests ``handle`` answers."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ...listener import Listener
from .. import wire
from ..wire.request import HttpRequest
from .client import ClientConnection

if TYPE_CHECKING:
    from ... import admin


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


def write_admin(listener: HttpListener, client: ClientConnection, request: HttpRequest, answer: admin.AdminAnswer,
                extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Write an admin route's answer (counting it when it is an error)."""
    if answer.status >= 400:
        listener.context.metrics.errors.labels(f"http_{answer.status}").inc()
    client.write(wire.answer(answer.status, answer.body, answer.content_type.encode(), extra=extra,
                             close=request.close_after or not request.keep_alive, head_only=request.head_only))

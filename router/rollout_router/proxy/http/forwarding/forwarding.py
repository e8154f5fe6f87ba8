"""One request on its way to a replica, shared by the traffic port's two Python paths: the fast path (routed from
the parser's callbacks, finished from the relay's) and the coroutine path (``HttpProxy.handle``), which also takes
what the native lane routed and handed over."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ...outcome import Routing, answered
from ..connection.relay import STALE, verdict
from ..wire.heads import lines

if TYPE_CHECKING:
    from ..connection.client import ClientConnection
    from ..connection.relay import Exchange
    from ..wire.request import HttpRequest
    from .port import TrafficPort


class Forwarding:
    """One request on its way to a replica: its keys and head lines, and once routed by the fast path, its
    routing and the attempt's start, to finish it from the relay's callback (``done``) or in ``handle``."""

    __slots__ = ("proxy", "client", "request", "key", "group", "headers", "routed", "started", "refused")

    def __init__(self, proxy: TrafficPort, client: ClientConnection, request: HttpRequest, key: str | None,
                 group: str | None, routed: Routing | None = None) -> None:
        self.proxy, self.client, self.request, self.key, self.group = proxy, client, request, key, group
        self.headers = lines(request.headers)  # once for every attempt
        self.routed = routed
        self.started: float | None = None  # set while the fast path's attempt is out
        self.refused: OSError | None = None  # the lane's connect failed: the first attempt's refusal

    def done(self, exchange: Exchange, result: str | None) -> None:
        """The fast path's exchange ended: recorded and released as ``_send`` would; a pooled connection that
        went stale before answering hands the request to ``handle`` (a fresh connection, then the retries)."""
        proxy, client, request = self.proxy, self.client, self.request
        if result == STALE:
            client.answer_later(request, proxy.handle(client, request, self))
            return
        assert self.routed is not None and self.started is not None
        routing, self.routed = self.routed, None
        answered(proxy.context, routing, *verdict(exchange), time.monotonic(), exchange.first_at)
        proxy.answering_here -= 1
        client.answered(request)

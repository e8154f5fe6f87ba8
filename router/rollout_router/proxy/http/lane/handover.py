"""A client connection the native lane handed to the Python path (``LaneGlue.hand_over``), given back to the lane
once it is idle again: the lane's fields live here, the client connection below knows nothing of the lane."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from ..connection.client import ClientConnection
from ..connection.listener import HttpListener
from ..wire.request import HttpRequest

if TYPE_CHECKING:
    from ...outcome import Routing

# What the lane hands over with a request it had begun: a routing whose replica refused the connection, with the
# error, or ``_lane.RELAY`` (a sibling worker would not route it: relayed through its owner).
Handed = tuple["Routing", OSError] | str

SHAPE_HANDOVERS = 4  # the native lane takes a connection back unless its requests' shape sent it here more often


class Lane(Protocol):
    """What a handed-over connection asks of the lane that handed it over (``LaneGlue``)."""

    def take_back(self, client: HandedConnection) -> None: ...

    def dispatch(self, client: HandedConnection, request: HttpRequest, handed: Handed) -> None: ...


class HandedConnection(ClientConnection):
    """A connection the native lane handed over: the lane to give it back to once idle (``take_back``), and how
    often it was handed over for its requests' shape; what it was handed over with, until its first request is
    read (``handed``)."""

    lane: Lane
    shaped: int
    handed: Handed | None = None

    @classmethod
    def adopted(cls, listener: HttpListener, transport: asyncio.Transport, lane: Lane, write_paused: bool,
                shaped: int) -> HandedConnection:
        """A connection the native lane hands over: admitted and configured already."""
        client = cls(listener)
        client.transport, client.loop, client.lane, client.shaped = transport, asyncio.get_running_loop(), lane, shaped
        client.write_paused, client._write_paused_at = write_paused, listener.now
        listener.clients.add(client)
        transport.set_protocol(client)
        return client

    def started_at(self, head: float, body: float) -> None:
        """The lane's clocks of the request being read (of the connection's first head when it has sent nothing):
        its head began at ``head``, its body at ``body`` (0: not yet)."""
        if self._in_head:
            self._head_at = head
        elif self._request is not None and body:
            self._body_at = body

    def detach(self) -> None:
        """The lane has taken the connection back: nothing here acts on it any more."""
        self.gone, self.transport = True, None
        self.listener.clients.discard(self)

    def _next(self) -> None:
        """The next request, as any connection's; the first one the lane had begun, through the lane's glue with
        what came with it (``LaneGlue.dispatch``)."""
        handed = self.handed
        if handed is None:
            return ClientConnection._next(self)
        if self._busy or not self._queue or self.gone or self.write_paused:
            return None
        self._busy, self.handed = True, None
        self.lane.dispatch(self, self._queue.popleft(), handed)
        return None

    def answered(self, request: HttpRequest) -> None:
        """As any connection's, then, kept alive and idle (nothing read, queued or paused), back to the lane unless
        its requests' shape sent it here more than ``SHAPE_HANDOVERS`` times."""
        ClientConnection.answered(self, request)
        transport = self.transport
        if (transport is not None and request.keep_alive and not request.close_after and not transport.is_closing()
                and self.shaped <= SHAPE_HANDOVERS and self._idle()):
            self.lane.take_back(self)

"""What the forwarding paths and the native lane's glue ask of the traffic port: its declared interface
(``HttpProxy`` satisfies it), so nothing below the traffic port imports it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..connection.port import Port

if TYPE_CHECKING:
    from ...decisions import DecisionClient
    from ...listener import Limits
    from ...session_key import KeyNames
    from ..connection.client import ClientConnection
    from ..wire.request import HttpRequest
    from .forwarding import Forwarding


class TrafficPort(Port, Protocol):
    """The traffic port as its forwarding paths and the lane's glue use it."""

    answering_here: int  # requests being answered now on the Python side
    names: KeyNames  # the session and group keys' header names
    decisions: DecisionClient | None  # a --workers N worker's channels to its siblings
    clients: set[Any]  # the open client connections (the lane's too)
    closing: bool  # stopping: no new connections; each request's answer closes its connection when last in line

    async def handle(self, client: ClientConnection, request: HttpRequest, handed: Forwarding | None = None
                     ) -> None:
        """Answer one request on the coroutine path (``handed``: what was routed and could not finish)."""
        ...

    def admit(self) -> bool:
        """Whether one more client connection fits the listener's limit."""
        ...

    def limits(self) -> Limits:
        """The listener's bounds and timeouts."""
        ...

    def key_names(self) -> tuple[tuple[bytes, ...], frozenset[bytes]]:
        """The headers holding a session key: their names as sent, and lower-cased."""
        ...

"""What the relay asks of the listener it answers for: the declared interface of the traffic port (``HttpProxy``,
which satisfies it) as the connections below it see it, so nothing here imports the layers above."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ...context import RouterContext
    from ..wire.request import HttpRequest
    from .upstream import Pools


class Port(Protocol):
    """The traffic port as one attempt's relay uses it."""

    context: RouterContext
    now: float  # the sweep's coarse clock
    pools: Pools  # keep-alive connections to the replicas
    active: set[Any]  # answers in progress, on either data path: the sweep times them out

    def error_bytes(self, status: int, message: str, request: HttpRequest, replica: str | None = None,
                    param: str | None = None, retry_after: int | None = None) -> bytes:
        """The router's own error answer to ``request``, as bytes."""
        ...

"""The budget of request bytes the router holds at once, and each listener's share of it.

Every request byte a client makes the router hold (a head, a body read before it is forwarded, a gRPC message
waiting for its replica) is counted against one bound, ``maxBufferedBytes``, shared by the listeners (the
traffic port and the gRPC port), and in the listener that holds it (its ``buffered_bytes`` metric). Every path
that reads a request counts through a ``Share``: the Python data path, the gRPC listener and the native lane,
which calls it in C (``budget.pxd``) twice a request.
"""
from __future__ import annotations


class Budget:
    """Request bytes held at once over the listeners sharing it."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0


class Share:
    """One listener's part of a ``Budget``: what it holds is counted in the budget too."""

    __slots__ = ("budget", "buffered")

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.buffered = 0

    def charge(self, size: int, limit: int) -> bool:
        """Count ``size`` more bytes held, when the budget stays within ``limit``; False (nothing counted) else."""
        budget = self.budget
        if budget.held + size > limit:
            return False
        budget.held += size
        self.buffered += size
        return True

    def hold(self, size: int) -> None:
        """Count ``size`` bytes already held whatever the limit (a gRPC answer waiting for its client)."""
        self.budget.held += size
        self.buffered += size

    def release(self, size: int) -> None:
        """``size`` bytes counted by ``charge`` or ``hold`` are no longer held."""
        self.budget.held -= size
        self.buffered -= size

"""What every policy does with a request that has no session key, and with an empty fleet."""
from __future__ import annotations

import itertools
from collections.abc import Mapping

from .base import Counters, Decision, NoReplicaError, Outcome
from .hashing import least_loaded

NO_REPLICA = "no replica is available"


def require(loads: Mapping[str, float]) -> Mapping[str, float]:
    """``loads`` unchanged, or NoReplicaError when no replica can take a request."""
    if not loads:
        raise NoReplicaError(NO_REPLICA)
    return loads


class Unkeyed:
    """Least-loaded decisions that pin nothing.

    Ties are broken by a running count, so a burst of unkeyed requests spreads
    over the tied replicas instead of piling onto one, reproducibly.
    """

    def __init__(self) -> None:
        self._count = itertools.count()

    def decide(self, loads: Mapping[str, float], counters: Counters) -> Decision:
        replica = least_loaded(require(loads), f"#{next(self._count)}")
        counters.count(Outcome.UNKEYED)
        return Decision(replica, Outcome.UNKEYED)

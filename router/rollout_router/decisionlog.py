"""Routing decisions in the log at debug level, sampled so that a busy router's log stays readable.

``serve --log-level debug`` logs, for each outcome (kept, broken, new, repinned, unkeyed), at most one decision
per ``INTERVAL`` seconds, saying how many of that outcome went unlogged since: the session key as a short hash (a
key is the client's; the log keeps none), the outcome, the replica chosen, and the in-flight counts the policy
compared (the pinned replica's, the chosen one's, the lowest). At any other level nothing is built: the balancer
holds no ``DecisionLog``, and its cost on the request path is one attribute check.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping

from .policy import Decision
from .policy.hashing import lowest

log = logging.getLogger("rollout_router.decisions")
INTERVAL = 1.0  # seconds between two logged decisions of one outcome


def wanted() -> bool:
    """Whether the log takes decisions (debug level for ``rollout_router.decisions``)."""
    return log.isEnabledFor(logging.DEBUG)


class DecisionLog:
    """Each outcome's next loggable time and how many decisions of it went unlogged since its last line."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._next: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def record(self, key: str | None, decision: Decision, loads: Mapping[str, int]) -> None:
        """Log ``decision`` if its outcome's interval has passed, else count it as skipped."""
        outcome, now = decision.outcome.value, self._clock()
        if now < self._next.get(outcome, 0.0):
            self._skipped[outcome] = self._skipped.get(outcome, 0) + 1
            return
        self._next[outcome] = now + INTERVAL
        skipped = self._skipped.pop(outcome, 0)
        log.debug("decision %s key=%s replica=%s loads: %s (+%d %s not logged in the last %.0f s)", outcome,
                  _digest(key), decision.replica, _loads(decision, loads), skipped, outcome, INTERVAL)


def _digest(key: str | None) -> str:
    """A session key as 12 hex digits of its SHA-256: the same key reads the same in every line, and no key is kept."""
    return "-" if key is None else hashlib.sha256(key.encode()).hexdigest()[:12]


def _loads(decision: Decision, loads: Mapping[str, int]) -> str:
    """The in-flight counts the decision compared, before this request counts."""
    seen = [f"chosen {loads.get(decision.replica, 0)}"]
    if decision.previous is not None and decision.previous != decision.replica:
        seen.insert(0, f"pinned {decision.previous} {loads[decision.previous]}" if decision.previous in loads
                    else f"pinned {decision.previous} gone")
    return ", ".join([*seen, f"lowest {lowest(loads) if loads else 0}", f"{len(loads)} replicas"])

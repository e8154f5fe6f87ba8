"""The base of every policy that keeps a session table (``core.pins``: session key -> pinned replica)."""
from __future__ import annotations

from collections.abc import Mapping

from ..core.counters import kept_decision
from ..core.pins import SessionTable
from .base import Decision, LiveConfig, Outcome, Policy
from .unkeyed import Unkeyed

_MOVES = frozenset({Outcome.NEW, Outcome.BROKEN, Outcome.REPINNED})  # decisions that (re)pin a session
KEPT_REMEMBERED = 4096  # replicas whose KEPT decision is kept for reuse (SessionPolicy._keep)


class KeptDecisions(dict[str, Decision]):
    """Replica -> its KEPT decision, made on first use: a decision is immutable, so one serves every sticky hit on
    the replica (no ``Decision`` made per request); a churning fleet's old replica ids are cleared away."""

    __slots__ = ()

    def __missing__(self, replica: str) -> Decision:
        if len(self) >= KEPT_REMEMBERED:
            self.clear()
        decision = self[replica] = Decision(replica, Outcome.KEPT)
        return decision


class SessionPolicy(Policy):
    """A policy that remembers each key's replica in a bounded ``SessionTable``.

    It supplies the session hooks of ``Policy`` and one way to record a
    decision, so that kept / broken / re-pinned mean the same under every such
    policy (see ``Policy``).
    """

    def __init__(self, max_sessions: int = 100_000, idle_ttl: float | None = 3600.0):
        super().__init__()
        self.table = SessionTable(self.counters, max_sessions, idle_ttl)
        self._unkeyed = Unkeyed()
        self.kept_decisions = KeptDecisions()  # the native lane's sticky hit answers with these too

    def _keep(self, key: str, replica: str, now: float) -> Decision:
        """Record a sticky hit: ``key`` stays on ``replica``, the pin ``table.get`` has just returned (most
        decisions, so it is counted without ``Counters.count``)."""
        self.table.keep(key, now)
        return kept_decision(self.counters, self.kept_decisions, replica)

    def configure(self, config: LiveConfig) -> None:
        self.table.resize(config.max_sessions, config.idle_ttl)

    def release(self, key: str) -> bool:
        return self.table.release(key)

    def forget(self, key: str, decision: Decision, now: float) -> None:
        """See ``Policy``; a pin another request of the session has moved since is left alone."""
        if decision.outcome not in _MOVES or self.table.get(key, now) != decision.replica:
            return
        if decision.previous is None:
            self.table.drop(key)
        else:
            self.table.pin(key, decision.previous, now)

    def sessions(self) -> int:
        return len(self.table)

    def pinned(self, key: str, now: float) -> str | None:
        return self.table.get(key, now)

    def adopt(self, key: str, replica: str, now: float) -> None:
        self.table.pin(key, replica, now)

    def last_used(self, key: str, now: float) -> float | None:
        return self.table.used(key, now)

    def pin_age(self, key: str, now: float) -> float | None:
        return self.table.age(key, now)

    def pins(self, now: float) -> list[tuple[str, str, float]]:
        return self.table.held(now)

    def surrender(self, key: str, now: float) -> str | None:
        replica = self.table.get(key, now)
        if replica is not None:
            self.table.drop(key)
        return replica

    def expire(self, now: float, limit: int | None = None) -> int:
        return self.table.expire(now, limit)

    def release_all(self) -> int:
        return self.table.clear()

    def _follow(self, key: str, replica: str, loads: Mapping[str, float], now: float) -> Decision:
        """Record that ``key`` goes to ``replica``, classified against the replica of its previous turn."""
        previous = self.table.get(key, now)
        if previous is None:
            decision = Decision(replica, Outcome.NEW)
        elif previous == replica:
            return self._keep(key, replica, now)
        else:
            decision = Decision(replica, Outcome.BROKEN if previous in loads else Outcome.REPINNED, previous)
        return self._commit(key, decision, now)

    def _commit(self, key: str, decision: Decision, now: float) -> Decision:
        """Pin ``key`` where ``decision`` moves it (new, broken, re-pinned; a sticky hit is ``_keep``'s) and
        count the decision (a break notes the age of the pin it ends)."""
        if decision.outcome is Outcome.BROKEN:
            decision = Decision(decision.replica, decision.outcome, decision.previous, self.table.age(key, now))
        self.table.pin(key, decision.replica, now)
        self.counters.count(decision.outcome)
        return decision

"""Ours: session affinity that breaks when the pinned replica lags too far.

On a sticky hit the session stays on its replica while that replica's load is
within ``margin`` of the least-loaded one; otherwise it is re-pinned to a
least-loaded replica. ``margin=None`` keeps every pin (verl's sticky default),
``0`` moves unless already least-loaded, ``N`` tolerates a skew of N (any
number, as verl takes it: ``2.5`` keeps a pin at skew 2 and moves it at 3). Under
``full_determinism`` the margin is ignored and a new session's replica depends
only on its key and the replica set, never on load or arrival order.

A request with a group key (GRPO siblings) that starts a session, or has no
session key, is placed beside its group's members while their replica is
within the same margin (``groups``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..core.counters import kept_decision
from ..core.kept import kept, within
from .base import Decision, LiveConfig, NoReplicaError, Outcome, Request
from .groups import GroupTable
from .hashing import least_loaded, rendezvous
from .sessions import SessionPolicy
from .unkeyed import NO_REPLICA


class AffinityPolicy(SessionPolicy):
    name = "affinity"

    def __init__(
        self,
        margin: float | None = None,
        full_determinism: bool = False,
        max_sessions: int = 100_000,
        idle_ttl: float | None = 3600.0,
        max_groups: int = 10_000,
    ):
        super().__init__(max_sessions, idle_ttl)
        self.margin: float | None = None
        self.full_determinism = self._plain = False
        self.keep_margin: float | None = None  # the margin ``kept`` is given: None keeps every routable pin
        self.groups = GroupTable(self.counters, max_groups)
        self.configure(LiveConfig(margin, full_determinism, max_sessions, idle_ttl, max_groups=max_groups))

    def configure(self, config: LiveConfig) -> None:
        """Change the rule and the table's bounds live; pins and counters are kept."""
        margin = config.margin
        if margin is not None and (isinstance(margin, bool) or not isinstance(margin, int | float)
                                   or not 0 <= margin < math.inf):
            raise ValueError(f"affinity_break_margin must be a number >= 0 or None, got {margin!r}")
        super().configure(config)
        self.groups.resize(config.max_groups)
        self.margin, self.full_determinism = margin, config.full_determinism
        # read per request by ``decide`` (settings change rarely): whether the rule is ``core.kept``'s, every
        # routable pin kept or the margin's own (a subclass may decide on the request too: ``_keeps``)
        every = self._keeps_every_pin()
        self._plain = every or type(self)._keeps is AffinityPolicy._keeps
        self.keep_margin = None if every else margin

    def route(self, request: Request) -> Decision:
        return self.decide(request.key, request.loads, request.now, request.prefix, request.group)

    def decide(self, key: str | None, loads: Mapping[str, float], now: float,
               prefix: Sequence[int] | str | None = None, group: str | None = None) -> Decision:
        """The rule, for ``route`` and for the router, which calls it with no ``Request`` made per request."""
        if key is None:
            decision = self._unkeyed.decide(loads, self.counters)
            return decision if group is None else Decision(self._beside(group, loads, decision.replica),
                                                           Outcome.UNKEYED)
        if not loads:
            raise NoReplicaError(NO_REPLICA)
        if self._plain:  # the kept-pin rule, which the native lane's sticky hit calls too (most requests)
            replica = kept(self.table, loads, key, now, self.keep_margin)
            if replica is not None:
                return kept_decision(self.counters, self.kept_decisions, replica)
            pinned = self.table.get(key, now)
        else:
            pinned = self.table.get(key, now)
            if pinned is not None and pinned in loads and self._keeps(key, loads, pinned, now, prefix):
                return self._keep(key, pinned, now)
        if pinned is None:
            decision = Decision(self._beside(group, loads, self._place(key, loads)), Outcome.NEW)
        elif pinned not in loads:
            decision = Decision(self._place(key, loads), Outcome.REPINNED, previous=pinned)
        else:
            decision = Decision(least_loaded(loads, key), Outcome.BROKEN, previous=pinned)
        return self._commit(key, decision, now)

    def _keeps(self, key: str, loads: Mapping[str, float], pinned: str, now: float,
               prefix: Sequence[int] | str | None) -> bool:
        """The rule: whether session ``key`` stays on its ``pinned`` replica, still routable, at ``loads``
        (a subclass decides on the request too: its key, prefix and time). Not asked when ``_keeps_every_pin``."""
        if self.margin is None or self.full_determinism:
            return True
        return within(loads, loads[pinned], self.margin)

    def _keeps_every_pin(self) -> bool:
        """Whether ``_keeps`` is True for every routable pin under these settings (then ``decide`` does not ask
        it): with no margin, or under full determinism, for the margin's rule and its variants."""
        return self.margin is None or self.full_determinism

    def placements(self) -> list[tuple[str, str]]:
        return self.groups.held()

    def place_group(self, group: str, replica: str) -> None:
        self.groups.restore(group, replica)

    def release_all(self) -> int:
        """Drop every pin and every group (a phase switch: the next step's prompts are new)."""
        self.groups.clear()
        return super().release_all()

    def _beside(self, group: str | None, loads: Mapping[str, float], chosen: str) -> str:
        """Where a request starting a session goes: ``chosen``, or beside its ``group`` (``groups``)."""
        if group is None:
            return chosen
        return self.groups.place(group, loads, chosen, self.margin, self.full_determinism)

    def _place(self, key: str, loads: Mapping[str, float]) -> str:
        if self.full_determinism:
            return rendezvous(key, loads)
        return least_loaded(loads, key)

"""The session table (session key -> pinned replica, bounded by size and idleness), and the
base of every policy that keeps one."""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping

from .base import Counters, Decision, LiveConfig, Outcome, Policy
from .unkeyed import Unkeyed

_MOVES = frozenset({Outcome.NEW, Outcome.BROKEN, Outcome.REPINNED})  # decisions that (re)pin a session
_SLOT_BITS = 20  # up to 2**20 distinct replica ids over the table's life
_SLOT_MASK = (1 << _SLOT_BITS) - 1
_USED_BITS = 42  # last use in ms: 139 years of a monotonic clock
_USED_MASK = (1 << _USED_BITS) - 1
_START_SHIFT = _SLOT_BITS + _USED_BITS  # the second the pin began on its replica sits above both
_UNUSED = ~(_USED_MASK << _SLOT_BITS)  # a pin's int without its last use: what a sticky hit keeps
# A pin's layout, for the native lane's sticky hit (proxy/http/_lane_sticky.pxi), which reads and moves pins too:
# the bits of the replica's slot, their mask, the mask of the last use above them, and what a hit keeps of a pin.
PIN_LAYOUT = (_SLOT_BITS, _SLOT_MASK, _USED_MASK, _UNUSED)
KEPT_REMEMBERED = 4096  # replicas whose KEPT decision is kept for reuse (SessionPolicy._keep)


class SessionTable:
    """An LRU map of pins with an idle TTL; time is always passed in.

    ``max_sessions`` bounds memory (the least recently used pin is evicted);
    ``idle_ttl`` (seconds, ``None`` = never) expires pins of finished
    conversations that were never released explicitly.

    A pin is one int per key: its last use in whole milliseconds (rounded up,
    so a pin never expires early) above the slot of its replica id, each id
    stored once, and above both the whole second it was pinned to that replica
    (its age at a break, ``age``), which a sticky hit leaves as it is: the hit
    replaces the last use alone. That keeps a million pins within the router's
    memory budget (benchmarks/session_memory.py): no object per pin beyond the
    key and one int (of three 30-bit digits either way: a monotonic clock's
    seconds fit in the 28 bits above the 62 below them for eight years).
    """

    def __init__(self, counters: Counters, max_sessions: int = 100_000, idle_ttl: float | None = 3600.0):
        self._pins: OrderedDict[str, int] = OrderedDict()
        self._replicas: list[str] = []  # slot -> replica id
        self._slots: dict[str, int] = {}  # replica id -> slot
        self._counters = counters
        self.max_sessions = max_sessions
        self.idle_ttl = idle_ttl
        self.resize(max_sessions, idle_ttl)

    def __len__(self) -> int:
        return len(self._pins)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        replicas = self._replicas
        return ((key, replicas[packed & _SLOT_MASK]) for key, packed in self._pins.items())

    def resize(self, max_sessions: int, idle_ttl: float | None) -> None:
        """Apply new bounds live; pins beyond the new size are evicted LRU-first."""
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        if idle_ttl is not None and idle_ttl <= 0:
            raise ValueError("idle_ttl must be positive or None")
        self.max_sessions, self.idle_ttl = max_sessions, idle_ttl
        self._evict_over_size()

    def get(self, key: str, now: float) -> str | None:
        """The pinned replica, or None if unknown or idle past the TTL."""
        packed = self._pins.get(key)
        if packed is None:
            return None
        ttl = self.idle_ttl  # ``_idle`` inlined: every routed request with a key comes here
        if ttl is not None and now - ((packed >> _SLOT_BITS) & _USED_MASK) / 1000 > ttl:
            del self._pins[key]
            self._counters.expired_idle += 1
            return None
        return self._replicas[packed & _SLOT_MASK]

    def hit(self, key: str, now: float) -> str | None:
        """``get`` and ``keep`` in one call, for a rule that keeps every routable pin (``AffinityPolicy.decide``):
        the pinned replica, its last use now; None if unknown or idle past the TTL. A pin found whose replica is
        not routable is re-pinned by the caller, which sets its last use again."""
        pins = self._pins
        packed = pins.get(key)
        if packed is None:
            return None
        ttl = self.idle_ttl
        if ttl is not None and now - ((packed >> _SLOT_BITS) & _USED_MASK) / 1000 > ttl:
            del pins[key]
            self._counters.expired_idle += 1
            return None
        pins[key] = packed & _UNUSED | math.ceil(now * 1000) << _SLOT_BITS
        pins.move_to_end(key)
        return self._replicas[packed & _SLOT_MASK]

    def used(self, key: str, now: float) -> float | None:
        """When ``key``'s pin was last used (the policy's clock), or None if unknown or idle past the TTL."""
        return None if self.get(key, now) is None else _used(self._pins[key]) / 1000

    def age(self, key: str, now: float) -> float | None:
        """How long ``key`` has been pinned to its replica (to the second), or None if it has no live pin."""
        if self.get(key, now) is None:
            return None
        return max(0.0, now - (self._pins[key] >> _START_SHIFT))

    def held(self, now: float) -> list[tuple[str, str, float]]:
        """Every live pin as (key, replica, last use), least recently used first."""
        replicas = self._replicas
        return [(key, replicas[packed & _SLOT_MASK], _used(packed) / 1000)
                for key, packed in self._pins.items() if not self._idle(packed, now)]

    def pin(self, key: str, replica: str, now: float) -> None:
        """Pin (or re-pin) ``key`` and mark it most recently used; a pin to the same replica keeps its start."""
        slot = self._slots.get(replica)
        if slot is None:
            slot = self._slots[replica] = len(self._replicas)
            if slot > _SLOT_MASK:
                raise OverflowError("more than 2**20 distinct replica ids")
            self._replicas.append(replica)
        old = self._pins.get(key)
        used = math.ceil(now * 1000)
        start = used // 1000
        if old is not None and old & _SLOT_MASK == slot:
            start = min(start, old >> _START_SHIFT)
        self._pins[key] = ((start << _USED_BITS | used) << _SLOT_BITS) | slot
        self._pins.move_to_end(key)
        if len(self._pins) > self.max_sessions:
            self._evict_over_size()

    def keep(self, key: str, now: float) -> None:
        """``pin`` for a sticky hit (every kept request), right after ``get`` found the pin: it stays on its
        replica, so only its last use moves (its slot and start stay) and the table cannot grow."""
        pins = self._pins
        pins[key] = pins[key] & _UNUSED | math.ceil(now * 1000) << _SLOT_BITS
        pins.move_to_end(key)

    def drop(self, key: str) -> None:
        """Remove a pin that should not have been made (not counted as released)."""
        self._pins.pop(key, None)

    def release(self, key: str) -> bool:
        if self._pins.pop(key, None) is None:
            return False
        self._counters.released += 1
        return True

    def clear(self) -> int:
        """Release every pin; returns how many."""
        released = len(self._pins)
        self._pins.clear()
        self._counters.released += released
        return released

    def expire(self, now: float, limit: int | None = None) -> int:
        """Drop pins idle past the TTL, at most ``limit`` of them (None: all); the caller runs this periodically.

        A caller on an event loop passes a small ``limit`` and calls again while
        the whole batch expired, so a million idle pins never stall the loop.
        """
        expired = 0
        while self._pins and expired != limit:
            key, packed = next(iter(self._pins.items()))
            if not self._idle(packed, now):
                break  # LRU order is last-use order, so the rest are fresher
            del self._pins[key]
            expired += 1
        self._counters.expired_idle += expired
        return expired

    def _idle(self, packed: int, now: float) -> bool:
        return self.idle_ttl is not None and now - _used(packed) / 1000 > self.idle_ttl

    def _evict_over_size(self) -> None:
        while len(self._pins) > self.max_sessions:
            self._pins.popitem(last=False)
            self._counters.evicted_lru += 1


def _used(packed: int) -> int:
    """A pin's last use, in ms."""
    return (packed >> _SLOT_BITS) & _USED_MASK


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
        self._kept = KeptDecisions()

    def _keep(self, key: str, replica: str, now: float) -> Decision:
        """Record a sticky hit: ``key`` stays on ``replica``, the pin ``table.get`` has just returned (most
        decisions, so it is counted without ``Counters.count``)."""
        self.table.keep(key, now)
        self.counters.affinity_kept += 1
        return self._kept[replica]

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

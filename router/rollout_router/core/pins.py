"""The session table: session key -> pinned replica, bounded by size and idleness; time is always passed in.

Its declared interface is ``pins.pxd``: compiled where a C compiler was there at install (``core`` says when),
so the kept-pin rule (``kept``), which the policy and the native lane's sticky hit both call, reads and moves a
pin in C. The policies reach it through ``SessionPolicy.table``.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Protocol


class PinCounts(Protocol):
    """What the table counts into (``policy.Counters``): pins that went without a request releasing them."""

    expired_idle: int
    released: int
    evicted_lru: int


_SLOT_BITS = 20  # up to 2**20 distinct replica ids over the table's life
_SLOT_MASK = (1 << _SLOT_BITS) - 1
_USED_BITS = 42  # last use in ms: 139 years of a monotonic clock
_USED_MASK = (1 << _USED_BITS) - 1
_START_SHIFT = _SLOT_BITS + _USED_BITS  # the second the pin began on its replica sits above both
_UNUSED = ~(_USED_MASK << _SLOT_BITS)  # a pin's int without its last use: what a sticky hit keeps
_move_to_end = OrderedDict.move_to_end  # read once: compiled, a kept pin moves with no method lookup


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

    def __init__(self, counters: PinCounts, max_sessions: int = 100_000, idle_ttl: float | None = 3600.0):
        self.pins: OrderedDict[str, int] = OrderedDict()  # key -> its pin (``kept`` reads and moves it too)
        self.replicas: list[str] = []  # slot -> replica id
        self._slots: dict[str, int] = {}  # replica id -> slot
        self._counters = counters
        self.max_sessions = max_sessions
        self.idle_ttl = idle_ttl
        self.resize(max_sessions, idle_ttl)

    def __len__(self) -> int:
        return len(self.pins)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        replicas = self.replicas
        return ((key, replicas[packed & _SLOT_MASK]) for key, packed in self.pins.items())

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
        packed = self.pins.get(key)
        if packed is None:
            return None
        if idle(packed, self.idle_ttl, now):
            del self.pins[key]
            self._counters.expired_idle += 1
            return None
        return self.replicas[packed & _SLOT_MASK]

    def used(self, key: str, now: float) -> float | None:
        """When ``key``'s pin was last used (the policy's clock), or None if unknown or idle past the TTL."""
        return None if self.get(key, now) is None else _used(self.pins[key]) / 1000

    def age(self, key: str, now: float) -> float | None:
        """How long ``key`` has been pinned to its replica (to the second), or None if it has no live pin."""
        if self.get(key, now) is None:
            return None
        return max(0.0, now - (self.pins[key] >> _START_SHIFT))

    def held(self, now: float) -> list[tuple[str, str, float]]:
        """Every live pin as (key, replica, last use), least recently used first."""
        replicas = self.replicas
        return [(key, replicas[packed & _SLOT_MASK], _used(packed) / 1000)
                for key, packed in self.pins.items() if not idle(packed, self.idle_ttl, now)]

    def pin(self, key: str, replica: str, now: float) -> None:
        """Pin (or re-pin) ``key`` and mark it most recently used; a pin to the same replica keeps its start."""
        slot = self._slots.get(replica)
        if slot is None:
            slot = self._slots[replica] = len(self.replicas)
            if slot > _SLOT_MASK:
                raise OverflowError("more than 2**20 distinct replica ids")
            self.replicas.append(replica)
        old = self.pins.get(key)
        used = ms_up(now)
        start = used // 1000
        if old is not None and old & _SLOT_MASK == slot:
            start = min(start, old >> _START_SHIFT)
        self.pins[key] = ((start << _USED_BITS | used) << _SLOT_BITS) | slot
        self.pins.move_to_end(key)
        if len(self.pins) > self.max_sessions:
            self._evict_over_size()

    def keep(self, key: str, now: float) -> None:
        """``pin`` for a sticky hit (every kept request), right after ``get`` found the pin: it stays on its
        replica, so only its last use moves (its slot and start stay) and the table cannot grow."""
        moved(self.pins, key, self.pins[key], now)

    def drop(self, key: str) -> None:
        """Remove a pin that should not have been made (not counted as released)."""
        self.pins.pop(key, None)

    def release(self, key: str) -> bool:
        if self.pins.pop(key, None) is None:
            return False
        self._counters.released += 1
        return True

    def clear(self) -> int:
        """Release every pin; returns how many."""
        released = len(self.pins)
        self.pins.clear()
        self._counters.released += released
        return released

    def expire(self, now: float, limit: int | None = None) -> int:
        """Drop pins idle past the TTL, at most ``limit`` of them (None: all); the caller runs this periodically.

        A caller on an event loop passes a small ``limit`` and calls again while
        the whole batch expired, so a million idle pins never stall the loop.
        """
        expired = 0
        while self.pins and expired != limit:
            key, packed = next(iter(self.pins.items()))
            if not idle(packed, self.idle_ttl, now):
                break  # LRU order is last-use order, so the rest are fresher
            del self.pins[key]
            expired += 1
        self._counters.expired_idle += expired
        return expired

    def _evict_over_size(self) -> None:
        while len(self.pins) > self.max_sessions:
            self.pins.popitem(last=False)
            self._counters.evicted_lru += 1


def idle(packed: int, ttl: float | None, now: float) -> bool:
    """Whether a pin is idle past ``ttl`` (None: never) at ``now``: it expires, or a hit declines it."""
    return ttl is not None and now - ((packed >> _SLOT_BITS) & _USED_MASK) / 1000 > ttl


def moved(pins: OrderedDict[str, int], key: str, packed: int, now: float) -> None:
    """A sticky hit's pin (``packed``, as ``pins`` holds it for ``key``) moved: its last use ``now``, and the most
    recently used (``SessionTable.keep``, and the kept-pin rule, which has read the pin already)."""
    pins[key] = used_now(packed, now)
    _move_to_end(pins, key)


def used_now(packed: int, now: float) -> int:
    """The pin as a sticky hit leaves it: its replica and start kept, its last use ``now`` (rounded up)."""
    return packed & _UNUSED | ms_up(now) << _SLOT_BITS


def ms_up(now: float) -> int:
    """``now`` in whole milliseconds, rounded up (``math.ceil``, in C where compiled: a sticky hit asks it)."""
    scaled = now * 1000
    ms = int(scaled)
    return ms + 1 if ms < scaled else ms


def replica_slot(packed: int) -> int:
    """The slot of the pin's replica in ``SessionTable.replicas``."""
    return packed & _SLOT_MASK


def _used(packed: int) -> int:
    """A pin's last use, in ms."""
    return (packed >> _SLOT_BITS) & _USED_MASK

"""Replica loads indexed by load, so "least loaded" costs the same at 16 replicas as at 1,024.

``LoadIndex`` is the mapping of replica -> load the policies read (``Request.loads``), which the replica set
keeps up to date as requests start and end (``ledger``). It is a ``dict``, so a policy's ``in``, ``[]`` and
``len`` (several per routed request) run in C rather than through Python methods; policies are handed it as a
read-only ``Mapping`` and only the ledger and the replica set change it, through ``set``, ``move`` and
``discard``. It adds ``min()``, ``tied()``, ``total()`` and ``ordered()``; ``lowest`` here and
``least_loaded``, ``total`` and ``ordered`` in ``policy.hashing`` use them when given an index and fall back to
a scan for a plain dict (the simulator and the tests), so a policy reads the same either way. Its declared
interface is ``loads.pxd`` (compiled, the native lane calls ``move`` in C; ``core`` says when).

By load, each replica is filed under the load it had when ``min``, ``least`` or ``total`` last read the
index: a move (two per request) updates the mapping and notes the replica, and the next read files the
replicas that moved since (``_settle``; loads move by one, so the minimum is kept in O(1), and a re-filing
is a few dict operations: the replicas at a load are sorted only when ``least`` reads them). A request's
start and end between two reads cost no re-filing at all, and under a sticky policy that reads the minimum
only for new sessions, most moves are never filed one by one.
"""
from __future__ import annotations

from collections.abc import Mapping

SCANNED = 32  # replicas up to which ``min`` scans the loads rather than filing them by load


class LoadIndex(dict):  # a plain base (not dict[str, int]): Cython compiles it (loads.pxd)
    """Integer loads of the replicas that can take a request now, by replica and by load."""

    __slots__ = ("_at", "_sorted", "_min", "_total", "_ordered", "_moved")

    def __init__(self) -> None:
        super().__init__()
        self._at: dict[int, dict[str, None]] = {}  # filed load -> its replicas (a set, kept in order)
        self._sorted: dict[int, list[str]] = {}  # filed load -> its replicas sorted, as ``least`` last read them
        self._min = 0  # the lowest filed load
        self._total = 0  # the sum of the filed loads
        self._ordered: tuple[str, ...] | None = ()  # the replicas by name; None until re-sorted
        self._moved: dict[str, int] = {}  # replicas moved since they were filed -> the load they are filed at

    # by load
    def min(self) -> int:
        """The lowest load; ValueError when empty, as ``min()`` of no values. Up to ``SCANNED`` replicas, a scan
        of the loads (in C) costs less than filing the moves since the last read: a margin reads it per request."""
        if len(self) <= SCANNED:
            return min(self.values())  # the builtin (ValueError when empty)
        if self._moved:
            self._settle()
        return self._min

    def tied(self) -> list[str]:
        """The replicas at the lowest load, sorted by name (``policy.hashing.least_loaded`` breaks the tie): the
        same list until one of them moves; do not change it."""
        if not self:
            raise ValueError("tied() of an empty LoadIndex")
        if self._moved:
            self._settle()
        low = self._min
        tied = self._sorted.get(low)
        if tied is None:
            tied = self._sorted[low] = sorted(self._at[low])
        return tied

    def total(self) -> int:
        """The sum of the loads (kept as replicas are filed: what moved since the last read is filed first)."""
        if self._moved:
            self._settle()
        return self._total

    def ordered(self) -> tuple[str, ...]:
        """The replicas sorted by name: the same tuple object until a replica joins or leaves.

        Policies that cache per membership (a hash ring) can compare it with ``is``.
        """
        if self._ordered is None:
            self._ordered = tuple(sorted(self))
        return self._ordered

    # kept up to date by the replica set
    def set(self, replica: str, load: int) -> None:
        """Add ``replica`` at ``load``, or move it there."""
        if replica in self:
            return self.move(replica, load)
        self._ordered = None
        self[replica] = 0
        self._at.setdefault(0, {})[replica] = None
        self._sorted.pop(0, None)
        if len(self) == 1 or self._min > 0:
            self._min = 0
        self.move(replica, load)

    def move(self, replica: str, load: int) -> None:
        """Move ``replica`` to ``load`` if it is in the index (the replica set, as a request starts or ends:
        one call, a lookup and a few dict operations, not a membership test and then ``set``); it is filed
        at its new load when the minimum is next read."""
        old = self.get(replica)
        if old is not None:
            self[replica] = load
            self._moved.setdefault(replica, old)  # its first move since it was filed: the load it is filed at

    def discard(self, replica: str) -> None:
        old = self.pop(replica, None)
        if old is None:
            return
        filed = self._moved.pop(replica, old)
        self._ordered, self._total = None, self._total - filed
        self._leave(replica, filed)
        if filed == self._min and filed not in self._at and self._at:
            self._min = min(self._at)

    def _settle(self) -> None:
        """File the replicas that moved since they were last filed at their loads now (one pass: each
        re-filing is a move by the difference, which keeps the minimum as it goes)."""
        for replica, filed in self._moved.items():
            load = self[replica]
            if load != filed:
                self._refile(replica, filed, load)
        self._moved.clear()

    def _refile(self, replica: str, old: int, load: int) -> None:
        """File ``replica`` at ``load`` rather than ``old``, keeping the minimum and the total."""
        at, ordered = self._at, self._sorted
        self._total += load - old
        self._leave(replica, old)
        joined = at.get(load)
        if joined is None:
            at[load] = {replica: None}
        else:
            joined[replica] = None
        if load in ordered:
            del ordered[load]
        if load < self._min:
            self._min = load
        elif old == self._min and old not in at:
            self._min = min(at) if load > old + 1 else load

    def _leave(self, replica: str, load: int) -> None:
        tied = self._at[load]
        del tied[replica]
        if not tied:
            del self._at[load]
        if load in self._sorted:
            del self._sorted[load]


def lowest(loads: Mapping[str, float]) -> float:
    """The lowest load (O(1) from a ``LoadIndex``, a scan of a plain mapping: the simulator's, the tests')."""
    if isinstance(loads, LoadIndex):
        index = loads  # (typed where compiled: its ``min`` called in C, as a margin does per request)
        return index.min()
    low = getattr(loads, "min", None)  # another mapping that keeps its minimum (a test's counting wrapper)
    return low() if low is not None else min(loads.values())

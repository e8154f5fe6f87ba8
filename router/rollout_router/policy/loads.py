"""Replica loads indexed by load, so "least loaded" costs the same at 16 replicas as at 1,024.

``LoadIndex`` is a read-only ``Mapping`` of replica -> load for the policies
(``Request.loads``) that the replica set keeps up to date as requests start
and end (loads move by one, so the minimum is kept in O(1), and a move is a few dict operations: the
replicas at a load are sorted only when ``least`` reads them). It adds
``min()``, ``least(key)``, ``total()`` and ``ordered()``; ``lowest``,
``least_loaded``, ``total`` and ``ordered`` in ``hashing`` use them when given
an index and fall back to a scan for a plain dict (the simulator and the
tests), so a policy reads the same either way.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

from .hashing import tie_break


class LoadIndex(Mapping[str, int]):
    """Integer loads of the replicas that can take a request now, by replica and by load."""

    def __init__(self) -> None:
        self._load: dict[str, int] = {}
        self._at: dict[int, dict[str, None]] = {}  # load -> the replicas at that load (a set, kept in order)
        self._sorted: dict[int, list[str]] = {}  # load -> its replicas sorted, as ``least`` last read them
        self._min = 0
        self._total = 0
        self._ordered: tuple[str, ...] | None = ()  # the replicas by name; None until re-sorted

    # Mapping
    def __getitem__(self, replica: str) -> int:
        return self._load[replica]

    def __contains__(self, replica: object) -> bool:
        return replica in self._load

    def __iter__(self) -> Iterator[str]:
        return iter(self._load)

    def __len__(self) -> int:
        return len(self._load)

    # by load
    def min(self) -> int:
        """The lowest load; ValueError when empty, as ``min()`` of no values."""
        if not self._load:
            raise ValueError("min() of an empty LoadIndex")
        return self._min

    def least(self, key: str) -> str:
        """A replica at the lowest load, tied replicas chosen as ``hashing.least_loaded`` chooses them."""
        low = self.min()
        tied = self._sorted.get(low)
        if tied is None:
            tied = self._sorted[low] = sorted(self._at[low])
        return tie_break(key, tied)

    def total(self) -> int:
        """The sum of the loads, kept as loads move."""
        return self._total

    def ordered(self) -> tuple[str, ...]:
        """The replicas sorted by name: the same tuple object until a replica joins or leaves.

        Policies that cache per membership (a hash ring) can compare it with ``is``.
        """
        if self._ordered is None:
            self._ordered = tuple(sorted(self._load))
        return self._ordered

    # kept up to date by the replica set
    def set(self, replica: str, load: int) -> None:
        """Add ``replica`` at ``load``, or move it there."""
        if replica in self._load:
            return self.move(replica, load)
        self._ordered = None
        self._load[replica] = 0
        self._at.setdefault(0, {})[replica] = None
        self._sorted.pop(0, None)
        if len(self._load) == 1 or self._min > 0:
            self._min = 0
        self.move(replica, load)

    def move(self, replica: str, load: int) -> None:
        """Move ``replica`` to ``load`` if it is in the index (the replica set, as a request starts or ends:
        one call, a lookup and a few dict operations, not a membership test and then ``set``)."""
        old = self._load.get(replica)
        if old is None or old == load:
            return
        at, ordered = self._at, self._sorted
        tied = at[old]  # ``_leave``, inlined: this runs twice per request
        del tied[replica]
        if not tied:
            del at[old]
        if old in ordered:
            del ordered[old]
        joined = at.get(load)
        if joined is None:
            at[load] = {replica: None}
        else:
            joined[replica] = None
        if load in ordered:
            del ordered[load]
        self._total += load - old
        self._load[replica] = load
        if load < self._min:
            self._min = load
        elif old == self._min and old not in at:
            self._min = min(at) if load > old + 1 else load

    def discard(self, replica: str) -> None:
        old = self._load.pop(replica, None)
        if old is None:
            return
        self._ordered, self._total = None, self._total - old
        self._leave(replica, old)
        if old == self._min and self._min not in self._at and self._at:
            self._min = min(self._at)

    def _leave(self, replica: str, load: int) -> None:
        tied = self._at[load]
        del tied[replica]
        if not tied:
            del self._at[load]
        if load in self._sorted:
            del self._sorted[load]

"""Stable hashing shared by the policies (never Python's salted ``hash``)."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

from ..core.loads import lowest as lowest  # with the readers below: the policies read loads through this module


def stable_hash(*parts: str) -> int:
    """A 64-bit hash of ``parts`` that is the same in every process and run."""
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous(key: str, replicas: Iterable[str]) -> str:
    """Highest-random-weight choice of ``key`` over ``replicas`` (full determinism's placement).

    Removing a replica moves only the keys that were on it.
    """
    return max(replicas, key=lambda replica: (stable_hash(key, replica), replica))


def least_loaded(loads: Mapping[str, float], key: str) -> str:
    """A least-loaded replica; ties broken by ``tie_break``, so concurrent new sessions spread.

    Given a ``LoadIndex`` (the router's live loads) this is O(log n); given a
    plain mapping (the simulator, the tests) it scans. Both choose the same replica.
    """
    tied = getattr(loads, "tied", None)
    if tied is not None:
        return tie_break(key, tied())
    low = min(loads.values())
    return tie_break(key, sorted(replica for replica, load in loads.items() if load == low))


def tie_break(key: str, tied: Sequence[str]) -> str:
    """One of ``tied`` (sorted by name), chosen by a stable hash of ``key``."""
    return tied[0] if len(tied) == 1 else tied[stable_hash(key) % len(tied)]



def total(loads: Mapping[str, float]) -> float:
    """The sum of the loads (O(1) from a ``LoadIndex``, a scan of a plain mapping)."""
    kept = getattr(loads, "total", None)
    return kept() if kept is not None else sum(loads.values())


def ordered(loads: Mapping[str, float]) -> Sequence[str]:
    """The replicas sorted by name (cached by a ``LoadIndex`` until membership changes)."""
    cached = getattr(loads, "ordered", None)
    return cached() if cached is not None else sorted(loads)

"""Stable hashing shared by the policies (never Python's salted ``hash``)."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping


def stable_hash(*parts: str) -> int:
    """A 64-bit hash of ``parts`` that is the same in every process and run."""
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous(key: str, replicas: Iterable[str]) -> str:
    """Highest-random-weight choice of ``key`` over ``replicas``.

    Removing a replica moves only the keys that were on it, and concurrent new
    sessions that tie on load spread over the tied replicas instead of all
    taking the first one.
    """
    return max(replicas, key=lambda replica: (stable_hash(key, replica), replica))


def least_loaded(loads: Mapping[str, float], key: str) -> str:
    """A least-loaded replica; ties broken by a hash of ``key``.

    Given a ``LoadIndex`` (the router's live loads) this is O(log n) and ties
    spread by the key's hash over the tied replicas in name order; given a
    plain mapping it scans, with a rendezvous tie-break.
    """
    least = getattr(loads, "least", None)
    if least is not None:
        return least(key)
    low = min(loads.values())
    return rendezvous(key, [replica for replica, load in loads.items() if load == low])


def lowest(loads: Mapping[str, float]) -> float:
    """The lowest load (O(1) from a ``LoadIndex``, a scan of a plain mapping)."""
    low = getattr(loads, "min", None)
    return low() if low is not None else min(loads.values())


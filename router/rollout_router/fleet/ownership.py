"""Which router owns a session: rendezvous (highest-random-weight) hashing of (member id, key). Pure.

Every router computes the same owner from the same member set, with no
coordination. Adding a member moves only the keys it now wins; removing one
moves only the keys it owned. ``History`` remembers recent member sets so that
a new owner knows whom to ask for a pin after ownership moved (``handoff``).
"""
from __future__ import annotations

from collections.abc import Collection, Iterable

from ..policy.hashing import stable_hash


def owner(key: str, members: Iterable[str]) -> str:
    """The member that owns ``key`` (members are their admin URLs)."""
    return max(members, key=lambda member: (stable_hash(member, key), member))


class History:
    """Recent member sets, newest last, each with the time it was replaced; entries older than ``window`` go.

    ``previous_owners`` lists whom a key's pin may be held by when it is not
    here: the key's owner under each earlier member set, newest first, without
    this router and without repeats. When this router joins a fleet, the set
    before it is the current one without it, so a newcomer asks the routers
    that owned its keys before.
    """

    def __init__(self, self_id: str, window: float):
        self.self_id, self.window = self_id, window
        self.current: frozenset[str] = frozenset({self_id})
        self._earlier: list[tuple[frozenset[str], float]] = []  # (member set, when it ended)
        self._joined = False

    def update(self, members: Collection[str], now: float) -> bool:
        """Record the member set now (self is added); True when it changed."""
        members = frozenset(members) | {self.self_id}
        if members == self.current:
            return False
        if not self._joined:  # alone until now: the fleet before us is what we see, minus us
            self._joined = True
            self._earlier.append((members - {self.self_id}, now))
        else:
            self._earlier.append((self.current, now))
        self.current = members
        self.expire(now)
        return True

    def expire(self, now: float) -> None:
        self._earlier = [(members, ended) for members, ended in self._earlier if now - ended <= self.window]

    def previous_owners(self, key: str, now: float) -> list[str]:
        """Who may hold ``key``'s pin, newest member set first (empty in a fleet that has not changed lately)."""
        found: list[str] = []
        for members, ended in reversed(self._earlier):
            if now - ended > self.window:
                break
            if members:
                candidate = owner(key, members)
                if candidate != self.self_id and candidate not in found:
                    found.append(candidate)
        return found

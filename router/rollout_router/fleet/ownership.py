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
    here: the key's owner under each earlier member set, newest first, then,
    for ``window`` after this router first saw a peer, its owner among the
    current members but this router and the ``siblings`` it joined with (the
    other workers of its pod, which started with it: the "runner-up", who owned
    the key before they joined, whose member set it never saw), without this
    router and without repeats.
    """

    def __init__(self, self_id: str, window: float, siblings: frozenset[str] = frozenset()):
        self.self_id, self.window, self.siblings = self_id, window, siblings
        self.current: frozenset[str] = frozenset({self_id})
        self._earlier: list[tuple[frozenset[str], float]] = []  # (member set, when it ended)
        self._joined: float | None = None  # when this router first saw a peer

    def update(self, members: Collection[str], now: float) -> bool:
        """Record the member set now (self is added); True when it changed."""
        members = frozenset(members) | {self.self_id}
        if members == self.current:
            return False
        if self._joined is None:
            self._joined = now
        else:
            self._earlier.append((self.current, now))
        self.current = members
        self.expire(now)
        return True

    def expire(self, now: float) -> None:
        self._earlier = [(members, ended) for members, ended in self._earlier if now - ended <= self.window]

    def knows(self, member: str) -> bool:
        """Whether ``member`` is in the current member set or one that ended within the window."""
        return member in self.current or any(member in members for members, _ in self._earlier)

    def previous_owners(self, key: str, now: float) -> list[str]:
        """Who may hold ``key``'s pin, newest member set first (empty in a fleet that has not changed lately)."""
        found: list[str] = []
        for members, ended in reversed(self._earlier):
            if now - ended > self.window:
                break
            found.append(owner(key, members))
        before = self.current - {self.self_id} - self.siblings
        if self._joined is not None and now - self._joined <= self.window and before:
            found.append(owner(key, before))
        return [m for i, m in enumerate(found) if m != self.self_id and m not in found[:i]]

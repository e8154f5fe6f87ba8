"""Who the routers of the fleet are: candidate peers from their sources, members while they answer.

Candidates come from sources (``--peer`` and ``fleet.peers``: "static"; the
Ready router pods of ``--peer-selector``: "pods"); each source replaces only
its own entries. A candidate becomes a member when it answers (its
``/fleet/v1/info``) and stays one until it has not answered for
``peerTimeoutSeconds``; this router is always a member. A peer that says it is
leaving (SIGTERM: ``fleet/leaving.py``) stays followed (its loads still count
and it still answers handoffs) but owns no key. No I/O here: the follower
(``node``) reports answers and failures.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

STATIC, PODS = "static", "pods"


@dataclasses.dataclass(slots=True)
class Member:
    """A peer router, known by its admin URL (``id``)."""

    id: str
    http: str | None = None  # its traffic URL, from /fleet/v1/info
    grpc: str | None = None  # its gRPC host:port, if it serves gRPC
    loads: dict[str, int] = dataclasses.field(default_factory=dict)  # its own in-flight counts by replica
    answered: float | None = None  # clock of its last answer
    live: bool = False
    leaving: bool = False  # it said it is leaving: no longer an owner, still a handoff source
    asked: bool = False  # its first poll has ended, answered or not


class Membership:
    def __init__(self, self_id: str):
        self.self_id = self_id
        self.peers: dict[str, Member] = {}  # candidates, self excluded
        self._sources: dict[str, set[str]] = {}

    def set_source(self, source: str, ids: Iterable[str]) -> tuple[set[str], list[Member]]:
        """Make ``source``'s candidates exactly ``ids``; returns (ids added, members dropped)."""
        wanted = {i.rstrip("/") for i in ids} - {self.self_id}
        self._sources[source] = wanted
        named = set().union(*self._sources.values())
        dropped = [self.peers.pop(i) for i in list(self.peers) if i not in named]
        added = named - self.peers.keys()
        for peer_id in added:
            self.peers[peer_id] = Member(peer_id)
        return added, dropped

    def named_by(self, source: str) -> bool:
        """Whether ``source`` has given its candidates at least once (none counts)."""
        return source in self._sources

    def members(self) -> frozenset[str]:
        """The live members that own keys (not leaving), self included."""
        return frozenset([self.self_id, *(m.id for m in self.peers.values() if m.live and not m.leaving)])

    def answered(self, peer_id: str, now: float, loads: dict[str, int] | None = None) -> bool:
        """A peer answered; True when it became a member."""
        member = self.peers.get(peer_id)
        if member is None:
            return False
        member.answered = now
        if loads is not None:
            member.loads = loads
        joined = not member.live and member.http is not None
        member.live = member.live or joined
        return joined

    def failed(self, peer_id: str, now: float, timeout: float, gone: bool = False) -> Member | None:
        """A poll of a peer failed; the member when it left (silent ``timeout`` seconds, or ``gone`` for sure)."""
        member = self.peers.get(peer_id)
        if member is None or not member.live:
            return None
        if gone or member.answered is None or now - member.answered >= timeout:
            member.live = False
            return member
        return None

    def get(self, peer_id: str) -> Member | None:
        return self.peers.get(peer_id)

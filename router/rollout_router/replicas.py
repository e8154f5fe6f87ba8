"""The live replica set and its in-flight accounting.

Protocol-neutral: HTTP and gRPC listeners acquire leases from the same set, so
a replica's in-flight count is one number whatever the protocol. Discovery
(static list or Kubernetes watch) adds and removes replicas at any time; a
removed replica keeps its count while its last requests drain, so a lease
always releases into the object it was taken from and counts never go negative.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class Replica:
    """One serving endpoint. ``id`` is its HTTP base URL."""

    id: str
    grpc_target: str | None = None
    inflight: int = 0
    down_until: float = 0.0


class Lease:
    """One request's hold on a replica; ``release`` is idempotent."""

    __slots__ = ("replica", "_owner", "_released")

    def __init__(self, owner: ReplicaSet, replica: Replica):
        self.replica, self._owner, self._released = replica, owner, False

    @property
    def replica_id(self) -> str:
        return self.replica.id

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._owner._release(self.replica)


class ReplicaSet:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._live: dict[str, Replica] = {}
        self._draining: dict[str, Replica] = {}

    def __contains__(self, replica_id: str) -> bool:
        return replica_id in self._live

    def __len__(self) -> int:
        return len(self._live)

    def replicas(self) -> list[Replica]:
        return list(self._live.values())

    def add(self, replica_id: str, grpc_target: str | None = None) -> Replica:
        """Add (or update) a replica; one that is still draining keeps its count."""
        replica = self._live.get(replica_id) or self._draining.pop(replica_id, None) or Replica(replica_id)
        replica.grpc_target = grpc_target
        self._live[replica_id] = replica
        return replica

    def remove(self, replica_id: str) -> None:
        replica = self._live.pop(replica_id, None)
        if replica is not None and replica.inflight > 0:
            self._draining[replica_id] = replica

    def replace(self, endpoints: Iterable[tuple[str, str | None]]) -> None:
        """Make the live set exactly these (replica id, gRPC target) pairs (static lists, reloads)."""
        wanted = dict(endpoints)
        for replica_id in set(self._live) - set(wanted):
            self.remove(replica_id)
        for replica_id, grpc_target in wanted.items():
            self.add(replica_id, grpc_target)

    def loads(self, grpc: bool = False) -> dict[str, int]:
        """In-flight counts of the replicas that may take a request now (with ``grpc``: over gRPC)."""
        now = self._clock()
        return {r.id: r.inflight for r in self._live.values()
                if r.down_until <= now and (r.grpc_target is not None or not grpc)}

    def ready_count(self) -> int:
        return len(self.loads())

    def acquire(self, replica_id: str) -> Lease:
        replica = self._live[replica_id]
        replica.inflight += 1
        return Lease(self, replica)

    def mark_down(self, replica_id: str, seconds: float) -> None:
        """Passive health: skip a replica that refused a connection for a while."""
        replica = self._live.get(replica_id)
        if replica is not None:
            replica.down_until = self._clock() + seconds

    def grpc_targets(self) -> set[str]:
        """gRPC targets still in use: live replicas and those draining their last requests."""
        return {r.grpc_target for r in (*self._live.values(), *self._draining.values()) if r.grpc_target}

    def total_inflight(self) -> int:
        return sum(r.inflight for r in self._live.values()) + sum(r.inflight for r in self._draining.values())

    def _release(self, replica: Replica) -> None:
        if replica.inflight <= 0:  # a bug somewhere: never let routing see a negative load
            log.error("in-flight count of %s would go negative; kept at 0", replica.id)
            return
        replica.inflight -= 1
        if replica.inflight == 0 and self._draining.get(replica.id) is replica:
            del self._draining[replica.id]

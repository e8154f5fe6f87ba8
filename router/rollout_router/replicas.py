"""The live replica set and its in-flight accounting.

Protocol-neutral: HTTP and gRPC listeners acquire leases from the same set, so
a replica's in-flight count is one number whatever the protocol. Discovery
(static list or Kubernetes watch) adds and removes replicas at any time; a
removed replica keeps its count while its last requests drain, so a lease
always releases into the object it was taken from and counts never go negative.
Routable replicas are kept in ``LoadIndex``es (one for HTTP, one for gRPC),
updated as counts move, so routing never scans the whole set. With other
routers in front of the same replicas (``fleet``), each replica's load in the
indexes is its own in-flight count plus ``external``: the count the other
routers reported, or what vLLM reports beyond ours (``fleet.loadview``).

A replica is routable unless it is marked down (it refused a connection),
ejected (passive health, ``health.outliers``) or failed its last probe (active
health, ``health.probes``); each takes it out of the indexes the same way, so
a session pinned to it is re-placed on its next turn. Each protocol has its
own probe verdict (``healthy`` over HTTP, ``grpc_healthy`` over gRPC), so a
replica whose HTTP server fails its probe still takes gRPC calls and the
other way round. A replica given by its gRPC address alone (``grpc://HOST:PORT``,
vLLM's gRPC frontend serves no HTTP) is in the gRPC index only. Any source of replicas
(static list, discovery, registration) only calls ``add``/``remove``: the
prober probes every live replica each round.

Each replica remembers which sources name it (the static list, discovery,
the worker API): a source adds and removes only its own entries, and a
replica leaves when no source names it any more, so a static reload never
drops a worker registered over the API, nor the API a static one.
"""
from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping

from .core import ledger
from .core.loads import LoadIndex
from .core.replica import ReplicaState

log = logging.getLogger(__name__)

STATIC, DISCOVERED, API = "static", "discovered", "api"  # where a replica came from
GRPC_ONLY = "grpc://"  # the id prefix of a replica given by its gRPC address alone


def grpc_only(replica_id: str) -> bool:
    """Whether the replica serves gRPC only (its id is ``grpc://HOST:PORT``): never an HTTP request's target."""
    return replica_id.startswith(GRPC_ONLY)


class Replica(ReplicaState):
    """One serving endpoint. ``id`` is its HTTP base URL, or ``grpc://HOST:PORT`` for a gRPC-only one; what the
    request path counts in (``id``, ``grpc_target``, ``inflight``, ``external``, ``failures``, ``server_errors``)
    is the core's ``ReplicaState``."""

    __slots__ = ("down_until", "ejected_until", "ejections", "healthy", "grpc_healthy", "sources")

    def __init__(self, replica_id: str, healthy: bool = True, grpc_healthy: bool = True, external: int = 0) -> None:
        super().__init__(replica_id, None, external)
        self.down_until = 0.0  # out of rotation until then: refused a connection, or ejected
        self.ejected_until = 0.0  # the end of its last ejection (passive health)
        self.ejections = 0  # the ejection multiplier: grows with each ejection, decays while it behaves
        self.healthy = healthy  # the last active HTTP probe passed (or none has run yet)
        self.grpc_healthy = grpc_healthy  # the last active gRPC probe passed (or none has run yet)
        self.sources: dict[str, str | None] = {}  # source -> the gRPC target it named

    def __repr__(self) -> str:
        return f"Replica({self.id!r}, inflight={self.inflight}, external={self.external})"


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
            self._owner.put(self.replica)


OUT_OF_ROTATION = {"ejected": "ejected after failures", "unhealthy": "failing their health probe",
                   "down": "refusing connections", "no_grpc": "without a gRPC target",
                   "grpc_only": "serving gRPC only (grpc://)"}


class Deadlines(dict[str, float]):
    """Replica ids out of rotation until a time, with the earliest of those times, so finding the ones whose time
    is over costs a comparison until one is (routing asks on every request; a failing fleet has many out)."""

    __slots__ = ("earliest",)

    def __init__(self) -> None:
        super().__init__()
        self.earliest = math.inf  # no time here ends before this (one removed by ``pop`` may leave it early)

    def hold(self, replica_id: str, until: float) -> None:
        self[replica_id] = until
        self.earliest = min(self.earliest, until)

    def ended(self, now: float) -> list[str]:
        """Drop and return the ids whose time is over at ``now``."""
        if now < self.earliest:
            return []
        over = [replica_id for replica_id, until in self.items() if until <= now]
        for replica_id in over:
            del self[replica_id]
        self.earliest = min(self.values(), default=math.inf)
        return over


class ReplicaSet:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._live: dict[str, Replica] = {}
        self._draining: dict[str, Replica] = {}
        self._http, self._grpc = LoadIndex(), LoadIndex()  # the replicas routable now, by load
        self._down = Deadlines()  # replicas marked down (or ejected) -> until when
        self._ejected = Deadlines()  # live replicas ejected -> until when (``ejected`` drops those over)
        self._external: dict[str, int] = {}  # replica id -> load outside this router, also for ids not (yet) here
        self.epoch = 0  # moves when a replica joins, leaves or is ejected (the RL fan-out's membership fence)
        self.departures = 0  # replicas gone for good (removed idle, or drained): when ``known`` may turn False

    def __contains__(self, replica_id: str) -> bool:
        return replica_id in self._live

    def __len__(self) -> int:
        return len(self._live)

    # What the native lane's sticky hit reads, held as long as the set lives (these objects are never replaced):
    # the live replicas by id, the ones marked down, and the load indexes (``loads`` revives the marked down
    # whose time is over: the lane declines once one is, and the Python path asks ``loads``).
    @property
    def members(self) -> Mapping[str, Replica]:
        """The live replicas by id (a live view: do not keep a copy)."""
        return self._live

    @property
    def marked_down(self) -> Deadlines:
        """Live replicas out of rotation -> until when (a live view: do not change it)."""
        return self._down

    @property
    def indexes(self) -> tuple[LoadIndex, LoadIndex]:
        """The HTTP and the gRPC load index, for ``ledger`` (live views: only the ledger and the set change them)."""
        return self._http, self._grpc

    def replicas(self, source: str | None = None) -> list[Replica]:
        """Live replicas, or those ``source`` names."""
        return [r for r in self._live.values() if source is None or source in r.sources]

    def draining(self) -> list[Replica]:
        """Replicas removed from the set whose last requests are still in flight (they leave when those end)."""
        return list(self._draining.values())

    def add(self, replica_id: str, grpc_target: str | None = None, source: str = STATIC,
            healthy: bool = True) -> Replica:
        """Add (or update) ``source``'s entry for a replica; one that is still draining keeps its count.

        A new replica starts routable unless ``healthy=False`` (a source that
        wants it out of rotation until its first probe passes); an existing
        one keeps its health.
        """
        replica = self._live.get(replica_id) or self._draining.pop(replica_id, None)
        if replica_id not in self._live:
            self.epoch += 1
        if replica is None:
            replica = Replica(replica_id, healthy=healthy, grpc_healthy=healthy,
                              external=self._external.get(replica_id, 0))
        replica.sources[source] = grpc_target
        replica.grpc_target = _grpc_target(replica)
        self._live[replica_id] = replica
        if replica.ejected_until > self._clock():  # back from draining while still ejected
            self._ejected.hold(replica_id, replica.ejected_until)
        if replica.down_until > self._clock():  # back from draining while still marked down
            self._down.hold(replica_id, replica.down_until)
        self._index(replica)
        return replica

    def remove(self, replica_id: str, source: str = STATIC) -> None:
        """Drop ``source``'s entry; the replica leaves (draining its requests) once no source names it."""
        replica = self._live.get(replica_id)
        if replica is None or source not in replica.sources:
            return
        del replica.sources[source]
        if replica.sources:
            replica.grpc_target = _grpc_target(replica)
            self._index(replica)
            return
        del self._live[replica_id]
        self.epoch += 1
        self._unindex(replica_id)
        self._down.pop(replica_id, None)
        self._ejected.pop(replica_id, None)
        if replica.inflight > 0:
            self._draining[replica_id] = replica
        else:
            self.departures += 1

    def replace(self, endpoints: Iterable[tuple[str, str | None]], source: str = STATIC) -> None:
        """Make ``source``'s entries exactly these (replica id, gRPC target) pairs (static lists, reloads)."""
        wanted = dict(endpoints)
        for replica in self.replicas(source):
            if replica.id not in wanted:
                self.remove(replica.id, source)
        for replica_id, grpc_target in wanted.items():
            self.add(replica_id, grpc_target, source)

    def loads(self, grpc: bool = False) -> LoadIndex:
        """In-flight counts of the replicas that may take a request now (with ``grpc``: over gRPC).

        A live view, kept up to date as requests start and end: read it, do not keep it.
        """
        if self._down:
            now = self._clock()
            if now >= self._down.earliest:  # a mark-down has ended: not a look over every replica down, per request
                self._revive(now)
        return self._grpc if grpc else self._http

    def set_external(self, replica_id: str, load: int) -> None:
        """The replica's load outside this router (other routers' in-flight requests); moves it in the indexes."""
        if load:
            self._external[replica_id] = load
        else:
            self._external.pop(replica_id, None)
        replica = self._live.get(replica_id)
        if replica is not None and replica.external != load:
            replica.external = load
            self._recount(replica)

    def external(self) -> dict[str, int]:
        """Loads outside this router by replica id (zero ones left out)."""
        return dict(self._external)

    def ready_count(self) -> int:
        """Replicas that can take a request now over either protocol."""
        http, grpc = self.loads(), self._grpc
        return len(http) + sum(1 for replica_id in grpc if replica_id not in http)

    def acquire(self, replica_id: str) -> Lease:
        """Count one request in flight on a live replica, held by a ``Lease``."""
        return Lease(self, self.take(replica_id))

    def take(self, replica_id: str) -> Replica:
        """Count one request in flight on a live replica, for a caller that ``put``s it back exactly once (the
        native lane, whose finish is called once per request: no ``Lease`` made per request)."""
        replica = self._live[replica_id]
        ledger.take(replica, self._http, self._grpc)
        return replica

    def get(self, replica_id: str) -> Replica | None:
        return self._live.get(replica_id)

    def known(self, replica_id: str) -> bool:
        """Live, or removed with requests still in flight (draining): a request may still be counted against it."""
        return replica_id in self._live or replica_id in self._draining

    def mark_down(self, replica_id: str, seconds: float) -> None:
        """Skip a replica that refused a connection for a while."""
        replica = self._live.get(replica_id)
        if replica is not None:
            self._take_out(replica, self._clock() + seconds)

    def eject(self, replica: Replica, seconds: float) -> None:
        """Passive health: take a failing replica out of rotation for ``seconds``."""
        replica.ejected_until = self._clock() + seconds
        if self._live.get(replica.id) is replica:
            self.epoch += 1
            self._ejected.hold(replica.id, replica.ejected_until)
            self._take_out(replica, replica.ejected_until)

    def set_healthy(self, replica_id: str, healthy: bool, grpc: bool = False) -> bool:
        """Active health: one protocol's probe verdict. Returns True when it changed the replica's state."""
        replica = self._live.get(replica_id)
        if replica is None or (replica.grpc_healthy if grpc else replica.healthy) == healthy:
            return False
        if grpc:
            replica.grpc_healthy = healthy
        else:
            replica.healthy = healthy
        self._index(replica)
        return True

    def ejected(self) -> int:
        """Live replicas ejected now: kept as they are ejected, not counted over the fleet (passive health asks
        on every failure once a streak is long enough, and a failing fleet fails many requests)."""
        self._ejected.ended(self._clock())
        return len(self._ejected)

    def why_unroutable(self, replica_id: str, grpc: bool = False) -> str:
        """Why a replica is not routable now: removed, ejected, unhealthy, down, or no_grpc."""
        replica = self._live.get(replica_id)
        if replica is None:
            return "removed"
        if replica.ejected_until > self._clock():
            return "ejected"
        if not (replica.grpc_healthy if grpc else replica.healthy):
            return "unhealthy"
        if replica_id in self._down:
            return "down"
        if grpc:
            return "no_grpc" if replica.grpc_target is None else "routable"
        return "grpc_only" if grpc_only(replica_id) else "routable"

    def unavailable(self, grpc: bool = False) -> str:
        """Why no replica can take a request, for the 503 answer: none configured, or why each one is out."""
        if not self._live:
            return ("no replica is configured (no --backend, no backends in the --config file) "
                    "or discovered (no Ready pod matches discovery.selector)")
        if grpc and not any(replica.grpc_target for replica in self._live.values()):
            return ("no replica with a gRPC port is configured (--backend grpc://HOST:PORT or URL,grpc=HOST:PORT, "
                    "or grpc in the --config file's backends, or discovery.grpcPort)")
        reasons = collections.Counter(self.why_unroutable(replica_id, grpc) for replica_id in self._live)
        out = ", ".join(f"{count} {OUT_OF_ROTATION.get(why, why)}" for why, count in sorted(reasons.items()))
        return f"no replica is available: the {len(self._live)} configured are out of rotation ({out})"

    def _take_out(self, replica: Replica, until: float) -> None:
        replica.down_until = max(until, self._down.get(replica.id, 0.0))
        self._down.hold(replica.id, replica.down_until)
        self._unindex(replica.id)

    def grpc_targets(self) -> set[str]:
        """gRPC targets still in use: live replicas and those draining their last requests."""
        return {r.grpc_target for r in (*self._live.values(), *self._draining.values()) if r.grpc_target}

    def own_loads(self) -> dict[str, int]:
        """This router's in-flight count per replica, live or draining, zero ones left out (``/fleet/v1/loads``)."""
        return {r.id: r.inflight for r in (*self._live.values(), *self._draining.values()) if r.inflight}

    def total_inflight(self) -> int:
        return sum(r.inflight for r in self._live.values()) + sum(r.inflight for r in self._draining.values())

    def put(self, replica: Replica) -> None:
        """A request counted by ``take`` ended (a ``Lease`` calls it once, whatever ends the request)."""
        if replica.inflight <= 0:  # a bug somewhere: never let routing see a negative load
            log.error("in-flight count of %s would go negative; kept at 0", replica.id)
            return
        replica_id = replica.id
        if self._live.get(replica_id) is replica:
            ledger.put(replica, self._http, self._grpc)
            return
        replica.inflight -= 1
        if replica.inflight == 0 and self._draining.get(replica_id) is replica:
            del self._draining[replica_id]
            self.departures += 1

    def _recount(self, replica: Replica) -> None:
        """Move a replica whose count changed within the indexes that hold it."""
        if self._live.get(replica.id) is replica:
            ledger.recount(replica, self._http, self._grpc)

    def _index(self, replica: Replica) -> None:
        """Put a replica in (or out of) each protocol's index by its state: down, probe verdicts, addresses."""
        if replica.id in self._down:
            return
        load = replica.inflight + replica.external
        if replica.healthy and not grpc_only(replica.id):
            self._http.set(replica.id, load)
        else:
            self._http.discard(replica.id)
        if replica.grpc_target is not None and replica.grpc_healthy:
            self._grpc.set(replica.id, load)
        else:
            self._grpc.discard(replica.id)

    def _unindex(self, replica_id: str) -> None:
        self._http.discard(replica_id)
        self._grpc.discard(replica_id)

    def _revive(self, now: float) -> None:
        """Put back replicas whose time marked down is over."""
        for replica_id in self._down.ended(now):
            replica = self._live.get(replica_id)
            if replica is not None:
                self._index(replica)


def _grpc_target(replica: Replica) -> str | None:
    """A gRPC-only replica's own address, else the first gRPC target any of its sources named (a worker
    registered by its HTTP URL names none)."""
    if grpc_only(replica.id):
        return replica.id[len(GRPC_ONLY):]
    return next((target for target in replica.sources.values() if target is not None), None)

"""The one interface every routing policy implements.

A policy is pure: it sees replica loads and a session key handed to it, and
answers with a replica. It performs no I/O, reads no clock (the caller passes
``now``) and never touches asyncio, so the proxy, the fleet simulator and the
tests all drive the very same code.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable


class NoReplicaError(LookupError):
    """Raised when a request must be routed but no replica can take it."""


class Outcome(enum.StrEnum):
    """Why a replica was chosen; every decision has exactly one outcome."""

    NEW = "new"  # first request of a session: pinned to a least-loaded replica
    KEPT = "kept"  # sticky hit, affinity kept
    BROKEN = "broken"  # sticky hit, skew beyond the margin: re-pinned
    REPINNED = "repinned"  # the pinned replica left the set: re-pinned
    UNKEYED = "unkeyed"  # no session key: least-loaded, nothing pinned


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """What a policy may look at for one routing decision.

    ``loads`` maps every routable replica to its load *before* this request is
    added (in-flight requests for the router; the simulator may pass another
    measure). ``prefix`` is optional request content (token ids or text) for
    cache-aware policies; affinity policies ignore it.
    """

    key: str | None
    loads: Mapping[str, float]
    now: float = 0.0
    prefix: Sequence[int] | str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    replica: str
    outcome: Outcome
    previous: str | None = None  # the replica a BROKEN/REPINNED session left


@dataclasses.dataclass(slots=True)
class Counters:
    """Monotonic decision counters, exported as metrics and in /status."""

    affinity_kept: int = 0
    affinity_broken: int = 0
    new_sessions: int = 0
    repinned_replica_gone: int = 0
    unkeyed: int = 0
    evicted_lru: int = 0
    expired_idle: int = 0
    released: int = 0

    def count(self, outcome: Outcome) -> None:
        field = _OUTCOME_FIELD[outcome]
        setattr(self, field, getattr(self, field) + 1)

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


_OUTCOME_FIELD = {
    Outcome.NEW: "new_sessions",
    Outcome.KEPT: "affinity_kept",
    Outcome.BROKEN: "affinity_broken",
    Outcome.REPINNED: "repinned_replica_gone",
    Outcome.UNKEYED: "unkeyed",
}


@runtime_checkable
class Policy(Protocol):
    """A routing policy: ``route`` decides, ``release`` drops a session's pin."""

    name: str
    counters: Counters

    def route(self, request: Request) -> Decision: ...

    def release(self, key: str) -> bool: ...

    def sessions(self) -> int: ...

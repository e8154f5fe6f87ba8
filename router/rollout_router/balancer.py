"""Joins the replica set and the policy: one call routes and takes a lease.

Every listener (HTTP and gRPC) routes through ``Balancer.acquire``, so policy
decisions and in-flight accounting are shared across protocols. The balancer
holds no settings: app.py's ``Runtime`` hands it the policy's name and live knobs.
"""
from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

from . import decisionlog
from .core.changes import Changes
from .decisionlog import DecisionLog
from .policy import Decision, LiveConfig, Outcome, Policy, create
from .policy.hashing import lowest
from .replicas import Lease, Replica, ReplicaSet


class Balancer:
    def __init__(self, replicas: ReplicaSet, policy: str, config: LiveConfig,
                 clock: Callable[[], float] = time.monotonic, changes: Changes | None = None):
        self.replicas = replicas
        self.changes = changes or Changes()  # told when ``apply`` builds a new policy (the lane's sticky hit reads it)
        self.clock = clock  # the policy's clock (the native lane's sticky hit routes only on the same one)
        self.policy: Policy = _build(policy, config)
        self.repinned: collections.Counter[str] = collections.Counter()  # re-pins by why the replica was out
        # Told of each break: the load gap the margin saw (pinned minus lowest) and the pin's age (metrics).
        self.on_break: Callable[[float, float | None], None] = lambda gap, age: None
        # At debug level, a sample of the decisions in the log (decisionlog.py); None otherwise.
        self.decisions = DecisionLog(clock) if decisionlog.wanted() else None

    def acquire(self, key: str | None, prefix: Sequence[int] | str | None = None,
                grpc: bool = False, group: str | None = None) -> tuple[Decision, Lease]:
        """Route one request and count it in flight, held by a ``Lease``; raises NoReplicaError.

        ``grpc`` limits the choice to replicas with a gRPC target; the counts
        compared are the same shared in-flight counts either way. ``group`` is
        the request's GRPO group key (policy/groups.py).
        """
        decision, replica = self.take(key, prefix, grpc, group)
        return decision, Lease(self.replicas, replica)

    def take(self, key: str | None, prefix: Sequence[int] | str | None = None,
             grpc: bool = False, group: str | None = None) -> tuple[Decision, Replica]:
        """``acquire`` for a caller that puts the replica back itself, once (``ReplicaSet.take``)."""
        loads = self.replicas.loads(grpc)
        decision = self.policy.decide(key, loads, self.clock(), prefix, group)
        if self.decisions is not None:
            self.decisions.record(key, decision, loads)
        previous = decision.previous  # None unless the session moved (a sticky hit: most requests)
        if previous is not None:
            if decision.outcome is Outcome.REPINNED:
                self.repinned[self.replicas.why_unroutable(previous, grpc)] += 1
            elif decision.outcome is Outcome.BROKEN and previous in loads:
                self.on_break(loads[previous] - lowest(loads), decision.pin_age)  # before this request counts
        return decision, self.replicas.take(decision.replica)

    def why_moved(self, decision: Decision, grpc: bool = False) -> str | None:
        """Why ``decision`` moved its session: margin (a break), or why the old replica was out (a re-pin)."""
        if decision.outcome is Outcome.BROKEN:
            return "margin"
        if decision.outcome is Outcome.REPINNED and decision.previous is not None:
            return self.replicas.why_unroutable(decision.previous, grpc)
        return None

    def forget(self, key: str | None, decision: Decision) -> None:
        """The replica did not accept the request ``decision`` routed: undo what it did to the pin."""
        if key is not None:
            self.policy.forget(key, decision, self.clock())

    def release_session(self, key: str) -> bool:
        return self.policy.release(key)

    def pinned(self, key: str) -> str | None:
        return self.policy.pinned(key, self.clock())

    def adopt(self, key: str, replica: str, idle: float = 0.0) -> None:
        """A pin handed over by the session's previous owner (another router, or this one before a restart), last
        used ``idle`` seconds ago."""
        self.policy.adopt(key, replica, max(0.0, self.clock() - idle))

    def last_used(self, key: str) -> float | None:
        """When ``key``'s pin was last used (this router's clock), if it has one."""
        return self.policy.last_used(key, self.clock())

    def pin_age(self, key: str) -> float | None:
        """How long ``key`` has been pinned to its replica (seconds), if it has a pin."""
        return self.policy.pin_age(key, self.clock())

    def pins(self) -> list[tuple[str, str, float]]:
        """Every pin held, as (key, replica, last use on this router's clock)."""
        return self.policy.pins(self.clock())

    def surrender(self, key: str) -> str | None:
        """Give ``key``'s pin to its new owner; the replica it was pinned to, if any."""
        return self.policy.surrender(key, self.clock())

    def expire_idle(self, limit: int | None = None) -> int:
        """Drop at most ``limit`` idle pins (None: all); returns how many."""
        return self.policy.expire(self.clock(), limit)

    def apply(self, policy: str, config: LiveConfig) -> None:
        """Apply new settings live. Pins survive unless the policy itself changes; counters always do."""
        if policy == self.policy.name:
            self.policy.configure(config)
            return
        counters, self.policy = self.policy.counters, _build(policy, config)
        for name, value in counters.as_dict().items():
            setattr(self.policy.counters, name, value)
        self.changes.bump()


def _build(name: str, config: LiveConfig) -> Policy:
    policy = create(name)
    policy.configure(config)
    return policy

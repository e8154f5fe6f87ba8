"""Joins the replica set and the policy: one call routes and takes a lease.

Every listener (HTTP today, gRPC next) routes through ``Balancer.acquire``, so
policy decisions and in-flight accounting are shared across protocols.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from .policy import Decision, Policy, Request, create
from .replicas import Lease, ReplicaSet
from .settings import PolicySettings


class Balancer:
    def __init__(self, settings: PolicySettings, replicas: ReplicaSet, clock: Callable[[], float] = time.monotonic):
        self.replicas = replicas
        self._clock = clock
        self.settings = settings
        self.policy: Policy = self._build(settings)

    def acquire(self, key: str | None, prefix: Sequence[int] | str | None = None,
                grpc: bool = False) -> tuple[Decision, Lease]:
        """Route one request and count it in flight; raises NoReplicaError.

        ``grpc`` limits the choice to replicas with a gRPC target; the counts
        compared are the same shared in-flight counts either way.
        """
        decision = self.policy.route(Request(key, self.replicas.loads(grpc), self._clock(), prefix))
        return decision, self.replicas.acquire(decision.replica)

    def release_session(self, key: str) -> bool:
        return self.policy.release(key)

    def expire_idle(self) -> int:
        table = getattr(self.policy, "table", None)
        return table.expire(self._clock()) if table is not None else 0

    def apply(self, settings: PolicySettings) -> None:
        """Apply new policy settings live. Pins survive unless the policy itself changes."""
        if settings.policy != self.policy.name:
            counters = self.policy.counters
            self.policy = self._build(settings)
            for field in dataclasses.fields(counters):
                setattr(self.policy.counters, field.name, getattr(counters, field.name))
        elif hasattr(self.policy, "configure"):
            self.policy.configure(settings.affinity_break_margin, settings.full_determinism)
            self.policy.table.resize(settings.session.max_sessions, settings.session.idle_timeout_seconds)
        self.settings = settings

    @staticmethod
    def _build(settings: PolicySettings) -> Policy:
        return create(
            settings.policy,
            margin=settings.affinity_break_margin,
            full_determinism=settings.full_determinism,
            max_sessions=settings.session.max_sessions,
            idle_ttl=settings.session.idle_timeout_seconds,
        )

"""Candidate refinements of ``affinity_break_margin`` (off unless configured).

``AffinityPolicy`` with two optional extras, both found by the fleet simulator
study (docs/simulator.md), reusing its code rather than copying it:

* ``context_scale``: the margin grows with the session's context, because
  moving an N-token conversation costs an N-token re-prefill. The effective
  margin is ``margin + len(prefix) / context_scale`` where ``len(prefix)`` is
  the request's prefix length in the units the caller passes (the simulator
  passes one unit per 16-token KV block).
* ``cooldown``: a session that was (re)pinned less than ``cooldown`` seconds
  ago is kept, against ping-pong.

With both ``None`` it decides exactly like ``AffinityPolicy(margin)``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..core.kept import within
from .affinity import AffinityPolicy
from .base import Decision, Outcome


class AdaptiveAffinityPolicy(AffinityPolicy):
    name = "affinity_adaptive"

    def __init__(self, margin: float | None = 2, context_scale: float | None = None, cooldown: float | None = None,
                 full_determinism: bool = False, max_sessions: int = 100_000, idle_ttl: float | None = 3600.0):
        super().__init__(margin, full_determinism, max_sessions, idle_ttl)
        if context_scale is not None and context_scale <= 0:
            raise ValueError("context_scale must be positive or None")
        if cooldown is not None and cooldown < 0:
            raise ValueError("cooldown must be >= 0 or None")
        self.context_scale, self.cooldown = context_scale, cooldown
        self._moved_at: dict[str, float] = {}

    def decide(self, key: str | None, loads: Mapping[str, float], now: float,
               prefix: Sequence[int] | str | None = None, group: str | None = None) -> Decision:
        decision = super().decide(key, loads, now, prefix, group)
        if self.cooldown is not None and key is not None and decision.outcome is not Outcome.KEPT:
            self._moved_at[key] = now
            if len(self._moved_at) > self.table.max_sessions:
                self._moved_at.pop(next(iter(self._moved_at)))
        return decision

    def release(self, key: str) -> bool:
        self._moved_at.pop(key, None)
        return super().release(key)

    def _keeps(self, key: str, loads: Mapping[str, float], pinned: str, now: float,
               prefix: Sequence[int] | str | None) -> bool:
        if self.margin is None or self.full_determinism:
            return super()._keeps(key, loads, pinned, now, prefix)
        if self.cooldown is not None:
            moved = self._moved_at.get(key)
            if moved is not None and now - moved < self.cooldown:
                return True
        margin = float(self.margin)
        if self.context_scale is not None and prefix is not None:
            margin += len(prefix) / self.context_scale
        return within(loads, loads[pinned], margin)

"""Affinity that moves a session only when the queueing a move saves outweighs the re-prefill it costs.

``affinity_break_margin`` compares the pinned replica's in-flight count with
the least-loaded one against a fixed margin. This rule makes the margin the
price of the move, from signals a router can observe:

* ``margin``: a fixed part, in in-flight requests (as ``affinity``'s margin);
* ``relative``: a part proportional to the least load. A replica with 768
  sequences in flight runs each of them barely slower for two more, while a
  move always costs the session's re-prefill, so the skew worth a move grows
  with the load (bounded-load hashing's ``c x mean``, measured from the minimum);
* ``context_scale``: ``context_tokens / context_scale`` more when the caller
  passes the session's context length (the re-prefill a move costs);
* ``kv_high``: when the pinned replica's ``kv_cache_usage_perc`` (from its
  ``/metrics``) is at or above ``kv_high``, its copy of the prefix is likely
  evicted already, so the move costs no extra prefill: only the fixed
  ``margin`` is kept.

A session moves to a least-loaded replica when ``pinned - least > threshold``.
With ``relative=0``, ``context_scale=None`` and ``kv_high=None`` it decides
exactly like ``affinity`` with the same ``margin``. Sim results: docs/simulator.md,
"A rule for every point".
"""
from __future__ import annotations

from collections.abc import Mapping

from .affinity import AffinityPolicy
from .base import Decision, LiveConfig, Request
from .hashing import lowest


class CostAffinityPolicy(AffinityPolicy):
    name = "cost_affinity"

    def __init__(self, margin: int = 2, relative: float = 0.0, context_scale: float | None = None,
                 kv_high: float | None = None, min_context: int | None = None, kv_skew: float | None = None,
                 min_gap: float | None = None,
                 max_sessions: int = 100_000, idle_ttl: float | None = 3600.0):
        _check(margin, relative, context_scale, kv_high)
        self.context_scale = context_scale
        self.min_context, self.kv_skew, self.min_gap = min_context, kv_skew, min_gap  # EXPERIMENT
        self.relative, self.kv_high = 0.0, None
        self._request: Request | None = None
        super().__init__(margin, False, max_sessions, idle_ttl)
        self.configure(LiveConfig(margin, False, max_sessions, idle_ttl, relative, kv_high))

    def configure(self, config: LiveConfig) -> None:
        """The router's live knobs: the margin (None keeps every pin), ``relative`` and ``kv_high``."""
        _check(0, config.relative, None, config.kv_high)
        super().configure(config)
        self.relative, self.kv_high = float(config.relative), config.kv_high

    def route(self, request: Request) -> Decision:
        self._request = request
        try:
            return super().route(request)
        finally:
            self._request = None

    def threshold(self, request: Request, pinned: str, least: float) -> float:
        """The skew (in-flight requests over the least-loaded replica) this session tolerates on ``pinned``."""
        fixed = float(self.margin or 0)
        usage = request.kv_usage.get(pinned) if request.kv_usage is not None else None
        if self.kv_high is not None and usage is not None and usage >= self.kv_high:
            return fixed  # the prefix is probably evicted there already: moving re-prefills nothing extra
        extra = self.relative * least
        if self.context_scale is not None and request.context_tokens is not None:
            extra += request.context_tokens / self.context_scale
        return fixed + extra

    def _keeps(self, loads: Mapping[str, float], pinned: str) -> bool:
        request = self._request
        if self.margin is None or self.full_determinism or request is None:
            return super()._keeps(loads, pinned)
        least = lowest(loads)
        if self.min_context is not None and request.context_tokens is not None \
                and request.context_tokens < self.min_context:
            return True
        if self.min_gap is not None and request.key is not None:
            last = self.table.last_used(request.key)
            if last is not None and request.now - last < self.min_gap:
                return True
        if self.kv_skew is not None and request.kv_usage is not None:
            low = min(request.kv_usage.values())
            if request.kv_usage[pinned] - low < self.kv_skew:
                return True
        return loads[pinned] - least <= self.threshold(request, pinned, least)


def _check(margin: object, relative: object, context_scale: object, kv_high: object) -> None:
    """Strict option parsing: a wrong type or range is an error naming the option, never a silent default."""
    if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
        raise ValueError(f"cost_affinity margin must be an integer >= 0, got {margin!r}")
    if isinstance(relative, bool) or not isinstance(relative, (int, float)) or not 0 <= relative <= 10:
        raise ValueError(f"cost_affinity relative must be a number in [0, 10], got {relative!r}")
    if context_scale is not None and (isinstance(context_scale, bool) or not isinstance(context_scale, (int, float))
                                      or context_scale <= 0):
        raise ValueError(f"cost_affinity context_scale must be a positive number or None, got {context_scale!r}")
    if kv_high is not None and (isinstance(kv_high, bool) or not isinstance(kv_high, (int, float))
                                or not 0 < kv_high <= 1):
        raise ValueError(f"cost_affinity kv_high must be a number in (0, 1] or None, got {kv_high!r}")

"""Affinity that moves a session only when the queueing a move saves can outweigh what the move costs.

``affinity_break_margin`` moves a session whenever its replica carries more
than ``margin`` in-flight requests over the least-loaded one. A move costs
the session's re-prefill on the new replica (and its cached prefix where it
was); what it saves is the queueing of the turn it is about to run, which is
large only when the turn is long and the skew is large against the load. The
rule prices both from what the router itself observes:

* ``min_turn_seconds``: a session whose previous turn was routed less than
  this long ago (its previous turn, queueing and tool call included, was
  short) keeps its pin: over a short turn the queueing a move saves does not
  pay for the re-prefill and the lost cache. The session table already keeps
  each pin's last use, so this costs no memory.
* ``relative``: the skew tolerated grows with the load, ``margin + relative x
  least``: two more sequences beside 768 slow a replica's steps far less than
  two beside 20, while a move's cost does not shrink.

``min_turn_seconds=None`` and ``relative=0`` decide exactly like ``affinity``
with the same margin; ``margin=None`` keeps every pin. The defaults are the
simulator's choice (docs/simulator.md, "A rule for every point", which also
says where they fail): seconds are H200-roofline seconds there, so
``min_turn_seconds`` is a deployment's own number.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field

from ..core.kept import within
from .affinity import AffinityPolicy
from .base import LiveConfig, PolicyOptions
from .hashing import lowest


class CostAffinityOptions(PolicyOptions):
    """What ``cost_affinity`` adds to the margin (docs/simulator.md, "A rule for every point")."""

    relative: float = Field(0.01, ge=0, le=10, allow_inf_nan=False, description="Skew tolerated beyond "
                            "affinityBreakMargin, per in-flight request on the least-loaded replica.")
    min_turn_seconds: float | None = Field(40.0, ge=0, allow_inf_nan=False, description="A session whose previous "
                                           "turn was routed less than this many seconds ago keeps its pin; null: "
                                           "every session may move.")


class CostAffinityPolicy(AffinityPolicy):
    name = "cost_affinity"
    Options = CostAffinityOptions

    def __init__(self, margin: float | None = 2, relative: float = 0.01, min_turn_seconds: float | None = 40.0,
                 full_determinism: bool = False, max_sessions: int = 100_000, idle_ttl: float | None = 3600.0):
        _check(relative, min_turn_seconds)  # the options model's own checks, worded for a keyword argument
        options = CostAffinityOptions.model_construct(relative=relative, min_turn_seconds=min_turn_seconds)
        self.relative: float = 0.0
        self.min_turn_seconds: float | None = None
        super().__init__(margin, full_determinism, max_sessions, idle_ttl)
        self.configure(LiveConfig(margin, full_determinism, max_sessions, idle_ttl, options))

    def configure(self, config: LiveConfig) -> None:
        """The router's live knobs: the margin (None keeps every pin); its own: ``relative``, ``min_turn_seconds``."""
        options = config.options_for(CostAffinityOptions)
        super().configure(config)
        self.relative, self.min_turn_seconds = float(options.relative), options.min_turn_seconds

    def _keeps(self, key: str, loads: Mapping[str, float], pinned: str, now: float,
               prefix: Sequence[int] | str | None) -> bool:
        if self.margin is None or self.full_determinism:
            return super()._keeps(key, loads, pinned, now, prefix)
        if self.min_turn_seconds is not None:
            last = self.table.used(key, now)
            if last is not None and now - last < self.min_turn_seconds:
                return True
        return within(loads, loads[pinned], self.margin + self.relative * lowest(loads))


def _check(relative: object, min_turn_seconds: object) -> None:
    """Strict option parsing: a wrong type or range is an error naming the option, never a silent default."""
    if isinstance(relative, bool) or not isinstance(relative, (int, float)) or not 0 <= relative <= 10:
        raise ValueError(f"cost_affinity relative must be a number in [0, 10], got {relative!r}")
    if min_turn_seconds is not None and (isinstance(min_turn_seconds, bool)
                                         or not isinstance(min_turn_seconds, (int, float))
                                         or not 0 <= min_turn_seconds < float("inf")):
        raise ValueError(f"cost_affinity min_turn_seconds must be a number >= 0 or None, got {min_turn_seconds!r}")

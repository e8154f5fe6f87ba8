"""The kept-pin rule, once: the policy (``AffinityPolicy.decide``) and the native lane's sticky hit both call it.

On a sticky hit a session stays on its replica while the replica is routable and, with a margin, its load is
within the margin of the least loaded one; otherwise the policy re-places it. ``kept`` is that rule and what
keeping does to the pin (its last use moves); ``within`` is the margin's part alone, which the policies built
on the margin (``cost_affinity``, ``adaptive_affinity``) also ask.
"""
from __future__ import annotations

from collections.abc import Mapping

from .loads import lowest
from .pins import SessionTable, idle, moved, replica_slot


def within(loads: Mapping[str, float], load: float, margin: float) -> bool:
    """Whether a replica at ``load`` is within ``margin`` of the least loaded of ``loads`` (a number: ``2.5``
    keeps a pin at a skew of 2 and moves it at 3)."""
    return load - lowest(loads) <= margin


def kept(table: SessionTable, loads: Mapping[str, float], key: str, now: float, margin: float | None) -> str | None:
    """The replica session ``key`` stays on, its pin's last use moved to ``now``: the pin is live, its replica
    routable (in ``loads``) and, unless ``margin`` is None (every routable pin kept), ``within`` the margin.

    None when any of that fails, with nothing changed: the caller re-places the session (``SessionTable.get``
    then expires an idle pin and counts it).
    """
    pins = table.pins
    packed = dict.get(pins, key)  # (OrderedDict's own get: compiled, a cached C method rather than a lookup)
    if packed is None or idle(packed, table.idle_ttl, now):
        return None
    replica = table.replicas[replica_slot(packed)]
    if replica not in loads or margin is not None and not within(loads, loads[replica], margin):
        return None
    moved(pins, key, packed, now)
    return replica

"""Passive health: eject a replica after N failures in a row, Envoy's outlier detection in small.

A failure is an attempt that got no usable answer: no response head within
``firstByteTimeoutSeconds`` (``timeout``), bytes that are not HTTP
(``invalid_response``), or a connection closed before the answer
(``closed``). Any response head (whatever its status: a 4xx or 5xx is the
replica answering) is a success and resets the streak. At
``health.consecutiveFailures`` the replica is ejected for
``baseEjectionSeconds`` times its ejection multiplier, capped at
``maxEjectionSeconds``; the multiplier grows by one per ejection and shrinks
by one per ``baseEjectionSeconds`` the replica spends back in rotation, as in
Envoy. Ejection is refused (the streak stays, so the replica goes as soon as
room frees) when it would put more than ``maxEjectionPercent`` of the
replicas out at once (rounded down: below 100%, a fleet of one is never ejected).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..replicas import Replica, ReplicaSet
from ..settings import HealthSettings

log = logging.getLogger(__name__)

TIMEOUT, INVALID_RESPONSE, CLOSED = "timeout", "invalid_response", "closed"


class OutlierDetector:
    """Failure streaks and ejections; ``settings`` is read on every call, so reloads apply at once."""

    def __init__(self, replicas: ReplicaSet, settings: Callable[[], HealthSettings],
                 on_ejection: Callable[[str, str], None], clock: Callable[[], float] = time.monotonic):
        self._replicas, self._settings, self._on_ejection, self._clock = replicas, settings, on_ejection, clock

    @staticmethod
    def success(replica: Replica) -> None:
        """The replica answered: its streak starts over."""
        replica.failures = 0

    def failure(self, replica: Replica, reason: str) -> bool:
        """Count one failure; returns True when it ejected the replica."""
        now = self._clock()
        if replica.ejected_until > now:  # requests sent before the ejection still report in
            return False
        replica.failures += 1
        settings = self._settings()
        if replica.failures < settings.consecutive_failures:
            return False
        if not self._room(settings):
            if replica.failures == settings.consecutive_failures:
                log.warning("replica %s failed %d times in a row (%s) but is not ejected: maxEjectionPercent=%d "
                            "of the replicas are out already", replica.id, replica.failures, reason,
                            settings.max_ejection_percent)
            return False
        seconds = self._duration(replica, now, settings)
        replica.failures = 0
        self._replicas.eject(replica, seconds)
        self._on_ejection(replica.id, reason)
        log.warning("replica %s ejected for %.0f s after %d failures in a row (last: %s)", replica.id, seconds,
                    settings.consecutive_failures, reason)
        return True

    def _room(self, settings: HealthSettings) -> bool:
        """Whether one more replica may be ejected under ``maxEjectionPercent``."""
        allowed = len(self._replicas) * settings.max_ejection_percent // 100
        return self._replicas.ejected() < allowed

    @staticmethod
    def _duration(replica: Replica, now: float, settings: HealthSettings) -> float:
        """The next ejection's length: base times the multiplier, which decays while the replica behaves."""
        base = settings.base_ejection_seconds
        if replica.ejections and replica.ejected_until:
            replica.ejections = max(0, replica.ejections - int((now - replica.ejected_until) // base))
        replica.ejections += 1
        return min(base * replica.ejections, max(base, settings.max_ejection_seconds))

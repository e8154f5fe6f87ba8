"""Passive health: eject a replica after N failures in a row, Envoy's outlier detection in small.

A failure is an attempt that got no usable answer: no response head within
``firstByteTimeoutSeconds`` (``timeout``), bytes that are not HTTP
(``invalid_response``), or a connection closed before the answer
(``closed``). Any response head is the replica answering and resets that
streak; 5xx heads keep a streak of their own (Envoy's ``consecutive_5xx``),
which any other answer resets. At ``health.consecutiveFailures`` failures, or
``health.consecutive5xx`` 5xx answers, the replica is ejected for
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

from ..core.answers import streaks_end
from ..replicas import Replica, ReplicaSet
from ..settings import HealthSettings

log = logging.getLogger(__name__)

TIMEOUT, INVALID_RESPONSE, CLOSED, SERVER_ERRORS = "timeout", "invalid_response", "closed", "http_5xx"


class OutlierDetector:
    """Failure streaks and ejections; ``settings`` is read on every call, so reloads apply at once."""

    def __init__(self, replicas: ReplicaSet, settings: Callable[[], HealthSettings],
                 on_ejection: Callable[[str, str], None], clock: Callable[[], float] = time.monotonic):
        self._replicas, self._settings, self._on_ejection, self._clock = replicas, settings, on_ejection, clock

    def answered(self, replica: Replica, status: int) -> bool:
        """The replica answered with ``status``: the failure streak ends; a 5xx extends the 5xx streak.

        Returns True when that streak ejected the replica.
        """
        if status < 500:
            streaks_end(replica)
            return False
        replica.failures = 0
        if replica.ejected_until > self._clock():
            return False
        replica.server_errors += 1
        limit = self._settings().consecutive_5xx
        if not limit or replica.server_errors < limit:
            return False
        if self._eject(replica, limit, f"{SERVER_ERRORS} (last {status})"):
            replica.server_errors = 0
            self._on_ejection(replica.id, SERVER_ERRORS)
            return True
        return False

    def failure(self, replica: Replica, reason: str) -> bool:
        """Count one failure; returns True when it ejected the replica."""
        if replica.ejected_until > self._clock():  # requests sent before the ejection still report in
            return False
        replica.failures += 1
        limit = self._settings().consecutive_failures
        if replica.failures < limit or not self._eject(replica, limit, reason):
            return False
        replica.failures = 0
        self._on_ejection(replica.id, reason)
        return True

    def _eject(self, replica: Replica, streak: int, reason: str) -> bool:
        """Eject ``replica`` after a streak of ``streak``, unless ``maxEjectionPercent`` are out already."""
        now, settings = self._clock(), self._settings()
        if not self._room(settings):
            if replica.failures == streak or replica.server_errors == streak:
                log.warning("replica %s failed %d times in a row (%s) but is not ejected: maxEjectionPercent=%d "
                            "of the replicas are out already", replica.id, streak, reason,
                            settings.max_ejection_percent)
            return False
        seconds = self._duration(replica, now, settings)
        self._replicas.eject(replica, seconds)
        log.warning("replica %s ejected for %.0f s after %d failures in a row (last: %s)", replica.id, seconds,
                    streak, reason)
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

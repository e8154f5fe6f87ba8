"""The one holder of a running router's live state.

Settings, the replica set, the balancer, replica health and the metrics live here, and every
listener and admin route reads them from here per request. A reload replaces
``settings`` in one assignment and re-configures the balancer in the same call,
so no component can keep an older copy.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .balancer import Balancer
from .health import OutlierDetector, Prober
from .observability import Metrics
from .replicas import ReplicaSet
from .settings import RouterSettings

if TYPE_CHECKING:
    from .fleet.node import Fleet


class RouterContext:
    def __init__(self, settings: RouterSettings, clock: Callable[[], float] = time.monotonic):
        self.settings, self.clock = settings, clock
        self.replicas = ReplicaSet(clock)
        self.balancer = Balancer(self.replicas, settings.policy, settings.live_config(), clock)
        self.metrics = Metrics(self)
        self.outliers = OutlierDetector(self.replicas, lambda: self.settings.health, self.metrics.ejected, clock)
        self.prober = Prober(self.replicas, lambda: self.settings.health, self.metrics.probe_failed)
        self.fleet: Fleet | None = None  # session ownership among several routers (fleet/), when on

    def configure(self, settings: RouterSettings) -> None:
        """Take new settings: the policy's knobs apply live and pins are kept."""
        self.settings = settings
        self.balancer.apply(settings.policy, settings.live_config())

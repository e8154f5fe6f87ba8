"""What the listeners and admin routes read per request: a plain bundle of the live pieces.

Settings, the replica set, the balancer, replica health, the metrics sink and the
fleet, each built once in app.py (``Runtime``) and handed over here; nothing in
this module builds them or reads them. A reload replaces ``settings`` in one
assignment and re-configures the balancer in the same call, so no listener can
keep an older copy. The fleet and the metrics are given what they read
themselves (``fleet/node.py``, ``observability.py``) and never see this bundle.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .balancer import Balancer
from .health import OutlierDetector, Prober
from .replicas import ReplicaSet
from .settings import RouterSettings

if TYPE_CHECKING:
    from .fleet.node import Fleet
    from .observability import Metrics


class RouterContext:
    def __init__(self, settings: RouterSettings, replicas: ReplicaSet, balancer: Balancer, metrics: Metrics,
                 outliers: OutlierDetector, prober: Prober, clock: Callable[[], float]):
        self.settings, self.clock = settings, clock
        self.replicas, self.balancer, self.metrics = replicas, balancer, metrics
        self.outliers, self.prober = outliers, prober
        self.fleet: Fleet | None = None  # session ownership among several routers (fleet/), when on

    def configure(self, settings: RouterSettings) -> None:
        """Take new settings: the policy's knobs apply live and pins are kept."""
        self.settings = settings
        self.balancer.apply(settings.policy, settings.live_config())

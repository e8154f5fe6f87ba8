"""The one holder of a running router's live state.

Settings, the replica set, the balancer and the metrics live here, and every
listener and admin route reads them from here per request. A reload replaces
``settings`` in one assignment and re-configures the balancer in the same call,
so no component can keep an older copy.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from .balancer import Balancer
from .observability import Metrics
from .replicas import ReplicaSet
from .settings import RouterSettings


class RouterContext:
    def __init__(self, settings: RouterSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.replicas = ReplicaSet(clock)
        self.balancer = Balancer(self.replicas, settings.policy, settings.live_config(), clock)
        self.metrics = Metrics(self)

    def configure(self, settings: RouterSettings) -> None:
        """Take new settings: the policy's knobs apply live and pins are kept."""
        self.settings = settings
        self.balancer.apply(settings.policy, settings.live_config())

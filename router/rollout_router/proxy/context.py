"""What the listeners and admin routes read per request, stated by the proxy itself.

A protocol, not a bundle to build: ``app.Runtime`` has these attributes and is
handed to every listener, so the proxy never imports what sits above it
(app.py; the import-linter contract in pyproject.toml checks it). Each is
read when used, never copied: a reload replaces ``settings`` in one assignment
and re-configures the balancer in the same call, so no listener keeps an older
copy. Of the replica prober only its wake-up is used (the worker API probes a
new worker at once); the reload machinery and the background tasks are not
here: no listener reads them.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..balancer import Balancer
from ..core.changes import Changes
from ..health import OutlierDetector, Prober
from ..replicas import ReplicaSet
from ..settings import RouterSettings

if TYPE_CHECKING:
    from ..fleet.node import Fleet
    from ..fleet.rlstate import RlState
    from ..observability import Metrics


class RouterContext(Protocol):
    @property
    def settings(self) -> RouterSettings: ...

    @property
    def replicas(self) -> ReplicaSet: ...

    @property
    def balancer(self) -> Balancer: ...

    @property
    def metrics(self) -> Metrics:
        """Counted into by the listeners; read by /metrics and /status."""

    @property
    def outliers(self) -> OutlierDetector:
        """Told of every replica's answer (passive ejection)."""

    @property
    def fleet(self) -> Fleet | None:
        """Session ownership among several routers, when on."""

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def draining(self) -> bool:
        """Stopping (SIGTERM): /readyz fails, so that balancers move on (``stopping.py``)."""

    @property
    def rl(self) -> RlState:
        """The RL step's dispatch state: asked whether dispatch is paused, and the replicas' weight versions."""

    @property
    def changes(self) -> Changes:
        """Counts each change of the settings, the fleet, the balancer's policy or the pause: the native lane's
        sticky hit reads those again only when it moved."""

    @property
    def prober(self) -> Prober:
        """Woken by the worker API, so a newly added worker is probed now rather than a round later."""

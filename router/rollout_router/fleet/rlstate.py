"""The RL step's dispatch state: paused or not, the pause queue, the replicas' weight versions, the last operations.

One ``RlState`` per router. The data path asks only ``paused`` (one attribute
read when dispatch runs); while paused, a request waits in ``wait_turn`` until
resume, bounded by ``rl.maxQueuedRequests`` (how many wait at once) and
``rl.maxPauseSeconds`` (how long each waits): beyond either it gets ``Paused``,
which the listeners answer 503 with ``Retry-After`` (gRPC: UNAVAILABLE). Every
request that waited is counted once as dispatched or refused, so none is lost
silently.

Several routers share the state (docs/rl.md, "Many routers"): each change carries
an ``epoch`` (a counter, then the id of the router that made it, so two changes
never tie); the router that takes a call pushes the new state to its peers, and
every router's ``/fleet/v1/loads`` answer carries it, so a router that missed the
push adopts it at its next poll of any peer (``adopt`` keeps the higher epoch).
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import math
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.changes import Changes
from ..settings import RlSettings
from .client import PeerClient
from .rlengines import EngineRoutes

RETRY_AFTER_CAP_SECONDS = 30  # the Retry-After of a refused request: the pause bound, at most this
# A weight version goes into every answer's head (X-Weight-Version): visible ASCII, inner spaces, at most this long
VERSION = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,254}[\x21-\x7e])?")
MAX_VERSIONS = 1024  # replicas whose version is kept (the oldest go first): what a peer may make this router hold
MAX_REPLICA_ID = 512  # characters of a replica id a peer's versions may name


class Paused(Exception):
    """A request refused while dispatch is paused: the queue is full or it waited ``maxPauseSeconds``."""

    def __init__(self, message: str, retry_after: int, reason: str):
        super().__init__(message)
        self.message, self.retry_after, self.reason = message, retry_after, reason


class RlState:
    def __init__(self, settings: Callable[[], RlSettings], origin: str = "",
                 wall: Callable[[], float] = time.time, changes: Changes | None = None):
        self._settings, self._wall = settings, wall
        self.origin = origin  # this router's id in the epochs it makes (its admin URL once in a fleet)
        self.changes = changes or Changes()  # told of every pause and resume (the native lane's sticky hit reads it)
        self._paused = False
        self.mode: str | None = None  # the pause's mode: wait or abort
        self.epoch: tuple[int, str] = (0, "")
        self._resumed = asyncio.Event()
        self._resumed.set()
        self.queued = 0  # requests waiting now
        self.queue = collections.Counter[str]()  # queued, dispatched, full, timeout
        self.versions: dict[str, str] = {}  # replica id -> its weight_version, as last read from it (``set_version``)
        self.weight_version: str | None = None  # the version the last successful update set
        self.last: dict[str, dict[str, Any]] = {}  # "pause" / "resume" / "update" -> {at, outcome, ...}
        self.operations = collections.Counter[tuple[str, str]]()  # (operation, outcome)
        self.pins_cleared = 0
        self.updates = 0  # successful weight updates, fleet-wide (a peer's higher count is adopted)
        self.on_new_weights: Callable[[], int] = lambda: 0  # rl.onWeightUpdate: clears pins (how many) or not
        self.engines = PeerClient(lambda: None, settings().engine_timeout_seconds)  # no token: replicas get none
        self.routes = EngineRoutes(self.set_version, self.forget_version)  # vLLM's own RL routes, or not, per replica
        self.lock = asyncio.Lock()  # one weight update at a time

    @property
    def paused(self) -> bool:
        """Whether dispatch is paused (the data path holds requests)."""
        return self._paused

    @paused.setter
    def paused(self, paused: bool) -> None:
        self._paused = paused
        self.changes.bump()

    # the data path
    async def wait_turn(self) -> None:
        """Wait while paused; raises ``Paused`` when the queue is full or the wait reaches ``maxPauseSeconds``."""
        settings = self._settings()
        retry = max(1, min(RETRY_AFTER_CAP_SECONDS, math.ceil(settings.max_pause_seconds)))
        if self.queued >= settings.max_queued_requests:
            self.queue["full"] += 1
            raise Paused(f"dispatch is paused for an RL weight update and {self.queued} requests already wait "
                         f"(rl.maxQueuedRequests={settings.max_queued_requests}); retry later", retry, "rl_queue_full")
        self.queued += 1
        self.queue["queued"] += 1
        try:
            async with asyncio.timeout(settings.max_pause_seconds):
                while self.paused:
                    await self._resumed.wait()
        except TimeoutError:
            self.queue["timeout"] += 1
            raise Paused(f"dispatch stayed paused for an RL weight update longer than this request may wait "
                         f"(rl.maxPauseSeconds={settings.max_pause_seconds:g}); retry later", retry,
                         "rl_pause_timeout") from None
        finally:
            self.queued -= 1
        self.queue["dispatched"] += 1

    # changes
    def pause(self, mode: str) -> tuple[int, str]:
        """Stop dispatching; returns the new epoch."""
        self._set(True, mode, self._next())
        return self.epoch

    def resume(self) -> tuple[int, str]:
        self._set(False, None, self._next())
        return self.epoch

    def _next(self) -> tuple[int, str]:
        return self.epoch[0] + 1, self.origin

    def _set(self, paused: bool, mode: str | None, epoch: tuple[int, str]) -> None:
        self.epoch = epoch
        if paused == self.paused:
            self.mode = mode if paused else None
            return
        self.paused, self.mode = paused, mode if paused else None
        if paused:
            self._resumed.clear()
        else:
            self._resumed.set()
        self.record("pause" if paused else "resume", "ok", mode=mode)

    def record(self, operation: str, outcome: str, **detail: Any) -> None:
        """The last ``operation`` (pause, resume, update) and its outcome, for /status and the resource's status."""
        self.operations[(operation, outcome)] += 1
        self.last[operation] = {"at": self._wall(), "outcome": outcome,
                                **{k: v for k, v in detail.items() if v is not None}}

    def set_version(self, replica: str, version: object) -> bool:
        """Keep ``replica``'s weight version if a response head can carry it (a replica's or a peer's word: a CR or
        LF in it would split every answer's head); the versions kept are bounded, the oldest dropped first."""
        if not isinstance(version, str) or VERSION.fullmatch(version) is None:
            return False
        self.versions.pop(replica, None)  # re-inserted as the newest
        self.versions[replica] = version
        while len(self.versions) > MAX_VERSIONS:
            del self.versions[next(iter(self.versions))]
        return True

    def forget_version(self, replica: str) -> None:
        """A replica left: what it said no longer holds (it may come back as another vLLM)."""
        self.versions.pop(replica, None)

    def new_weights(self, version: str | None, updates: int | None = None) -> None:
        """A weight update succeeded (here, or on a peer: its count ``updates``): the pins follow the setting."""
        if updates is None:  # made here: a new epoch, so the peers adopt the versions
            self.updates, self.epoch = self.updates + 1, self._next()
        else:
            self.updates = updates
        if version is not None:
            self.weight_version = version
        self.pins_cleared += self.on_new_weights()

    # the fleet exchange
    def shared(self) -> dict[str, Any]:
        """What the peers learn (``/fleet/v1/loads`` answers and pushes): the epoch, the pause and the versions."""
        return {"epoch": list(self.epoch), "paused": self.paused, "mode": self.mode,
                "weightVersion": self.weight_version, "versions": dict(self.versions), "updates": self.updates}

    def adopt(self, document: object) -> bool:
        """Take a peer's state when its epoch is newer than ours; False (nothing changed) otherwise or if malformed."""
        if not isinstance(document, dict):
            return False
        epoch, paused, mode = document.get("epoch"), document.get("paused"), document.get("mode")
        if not (isinstance(epoch, list) and len(epoch) == 2 and isinstance(epoch[0], int)
                and isinstance(epoch[1], str) and isinstance(paused, bool)):
            return False
        if (epoch[0], epoch[1]) <= self.epoch:
            return False
        self._set(paused, mode if mode in ("wait", "abort") else None, (epoch[0], epoch[1]))
        versions = document.get("versions")
        if isinstance(versions, dict):
            for replica, version in itertools.islice(versions.items(), MAX_VERSIONS):
                if isinstance(replica, str) and len(replica) <= MAX_REPLICA_ID:
                    self.set_version(replica, version)
        version, updates = document.get("weightVersion"), document.get("updates")
        if isinstance(updates, int) and not isinstance(updates, bool) and updates > self.updates:
            self.new_weights(version if isinstance(version, str) else None, updates)
        return True

    def status(self) -> dict[str, Any]:
        """The ``rl`` section of /status."""
        return {"paused": self.paused, "mode": self.mode, "epoch": list(self.epoch),
                "weightVersion": self.weight_version, "queued": self.queued, "queue": dict(self.queue),
                "pinsCleared": self.pins_cleared, "updates": self.updates, "last": self.last, "versions": dict(self.versions),
                "routes": dict(self.routes.kinds)}


class RlCollector(Collector):
    """``rolloutrouter_rl_*``: the pause, its queue, the operations and their outcomes, the pins cleared."""

    def __init__(self, state: RlState):
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state
        paused = GaugeMetricFamily("rolloutrouter_rl_paused", "1 while dispatch is paused (POST /v1/rl/pause).")
        paused.add_metric([], float(state.paused))
        queued = GaugeMetricFamily("rolloutrouter_rl_queued_requests", "Requests waiting for dispatch to resume.")
        queued.add_metric([], state.queued)
        queue = CounterMetricFamily("rolloutrouter_rl_queue_requests", "Requests that arrived while dispatch was "
                                    "paused, by what became of them: queued (each), then dispatched, or refused "
                                    "with 503 when the queue was full or the wait reached rl.maxPauseSeconds.",
                                    labels=["outcome"])
        for outcome in ("queued", "dispatched", "full", "timeout"):
            queue.add_metric([outcome], state.queue[outcome])
        operations = CounterMetricFamily("rolloutrouter_rl_operations", "RL fleet operations by outcome.",
                                         labels=["operation", "outcome"])
        for (operation, outcome), count in sorted(state.operations.items()):
            operations.add_metric([operation, outcome], count)
        cleared = CounterMetricFamily("rolloutrouter_rl_pins_cleared", "Pins cleared at weight updates "
                                      "(rl.onWeightUpdate: clear).")
        cleared.add_metric([], state.pins_cleared)
        yield from (paused, queued, queue, operations, cleared)

"""Assembles a running router: settings -> replica set -> balancer -> listeners.

``Runtime`` builds each component once and gives it the pieces it reads (the
fleet and the metrics their own; the listeners the runtime itself, read through
the protocol they state, ``proxy.context.RouterContext``), and holds what runs them: the listeners, replica sources and background
tasks. It applies new settings without dropping pins; ``start`` opens the HTTP traffic listener, the admin
listener (metrics, status, sessions; its own port), the background tasks for
pin expiry, config-file reloads, replica discovery and health probes, and the
gRPC listener beside them when asked for.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from . import descriptors, pinfile, stopping
from .balancer import Balancer
from .core.changes import Changes
from .fleet.rlstate import RlCollector, RlState
from .health import OutlierDetector, Prober
from .listening import address
from .observability import Metrics
from .proxy.http import HttpProxy
from .proxy.http.admin_listener import AdminListener, TokenFile
from .proxy.listener import limit_connections
from .replicas import DISCOVERED, STATIC, ReplicaSet
from .settings import (
    DiscoverySettings,
    FleetSettings,
    HealthSettings,
    Ownership,
    RouterSettings,
    SettingsError,
    load_settings,
)
from .usage import bind

if TYPE_CHECKING:
    from .fleet.node import Fleet
    from .proxy.decisions import DecisionService
    from .proxy.grpc import GrpcProxy

log = logging.getLogger(__name__)

EXPIRY_INTERVAL = 15.0
EXPIRY_BATCH = 10_000  # pins dropped per turn of the event loop (about 5 ms), so expiry never stalls traffic
RELOAD_INTERVAL = 2.0
WORKER_HOST = "127.0.0.1"  # a worker's private traffic ports (``serve --workers N``)
STOP_GRACE_SECONDS = 2.0  # gRPC calls in flight at stop are given this long


class Runtime:
    """The router's live state and what runs it; ``overrides`` are CLI flags re-applied over every reload.

    The listeners read its live pieces (``proxy.context.RouterContext``: settings, replica set, balancer,
    metrics, outlier detector, fleet, clock) when they use them, never a copy.
    """

    def __init__(self, settings: RouterSettings, config_path: Path | None = None,
                 overrides: Callable[[RouterSettings], RouterSettings] = lambda s: s,
                 grpc_address: str | None = None, admin_address: tuple[str, int] | None = None,
                 admin_token: TokenFile | None = None, peering: Peering | None = None, data_path: str = "auto",
                 state_file: Path | None = None):
        self.settings, self.clock = settings, time.monotonic
        # counts each change of the settings, the fleet, the policy or the pause (the lane's sticky hit reads them
        # again then): bumped by ``apply``, ``_start_fleet``, the balancer and the RL state
        self.changes = Changes()
        self.replicas = ReplicaSet(self.clock)
        self.balancer = Balancer(self.replicas, settings.policy, settings.live_config(), self.clock, self.changes)
        self.metrics = Metrics(self.balancer, self.replicas, lambda: self.settings, lambda: self.fleet, self.clock)

        def health() -> HealthSettings:  # read live: a reload replaces the settings
            return self.settings.health
        self.outliers = OutlierDetector(self.replicas, health, self.metrics.ejected, self.clock)
        self.prober = Prober(self.replicas, health, self.metrics.probe_failed)
        self.fleet: Fleet | None = None  # session ownership among several routers (fleet/), when on
        self.decisions: DecisionService | None = None  # a --workers N worker's, deciding for its siblings
        # the RL step's pause and weight versions (/v1/rl/*)
        self.rl = RlState(lambda: self.settings.rl, changes=self.changes)
        self.rl.on_new_weights = self._on_new_weights
        self.metrics.registry.register(RlCollector(self.rl))
        self.metrics.rl = self.rl
        self.peering = peering or Peering()
        self.draining = False  # stopping: /readyz fails (``drain``)
        self.state_file = state_file  # ``--state-file``: the pins are read back at start, written at stop
        self._started = False
        self.config_path, self._overrides = config_path, overrides
        self.grpc_address = grpc_address
        self.grpc_port: int | None = None
        self.http_proxy = HttpProxy(self, data_path)
        self.metrics.data_path = self.http_proxy.data_path
        self.admin_address = admin_address  # None: no admin listener (tests that need none)
        self.admin = AdminListener(self, admin_token)
        self.admin_port: int | None = None
        self.grpc_proxy: GrpcProxy | None = None
        if grpc_address is not None:
            from .proxy.grpc import GrpcProxy  # loaded only by routers that serve gRPC
            self.grpc_proxy = GrpcProxy(self, self.http_proxy.budget)  # one budget of request bytes for both
        self.port: int | None = None
        self._fleet_ports: tuple[int | None, int | None] = (None, None)  # a worker's private HTTP and gRPC ports
        self._discovery: asyncio.Task | None = None
        self._background: asyncio.Task | None = None
        self._probing: asyncio.Task | None = None
        self._asking: asyncio.Task | None = None  # which RL routes each replica serves, and its weight version
        self._config_mtime = _mtime(config_path)

    def apply(self, settings: RouterSettings) -> None:
        """Take new settings live: policy knobs keep pins; replica sources are swapped."""
        previous = self.settings
        self.settings = settings  # one assignment: every listener reads the new settings from here on
        self.changes.bump()
        self.balancer.apply(settings.policy, settings.live_config())
        self.metrics.configure(settings.metrics)
        if self.fleet is not None:
            self.fleet.configure(settings.fleet or FleetSettings())
        if settings.discovery is None:
            self._stop_discovery()
            self.replicas.replace(((b.url, b.grpc) for b in settings.backends), STATIC)
            self.replicas.replace((), DISCOVERED)  # after the static list is in: no moment without replicas
        elif settings.discovery != previous.discovery or self._discovery is None:
            self._stop_discovery()
            self._start_discovery(settings.discovery)

    def _on_new_weights(self) -> int:
        """rl.onWeightUpdate at a weight update: clear every pin (how many), or keep them (0)."""
        if self.settings.rl.on_weight_update != "clear":
            return 0
        return sum(self.balancer.release_session(key) for key, _, _ in self.balancer.pins())

    def reload(self) -> bool:
        """Re-read the config file; a bad file is logged and the running settings stay."""
        if self.config_path is None:
            return False
        self._config_mtime = _mtime(self.config_path)
        try:
            loaded = load_settings(self.config_path)
            settings = self._overrides(loaded)
            _keeps_replicas(self.settings, settings, "backends" in loaded.model_fields_set)
        except (OSError, SettingsError) as error:
            log.error("config %s not applied, keeping the running settings: %s", self.config_path, error)
            self.metrics.config_reloads["rejected"] += 1
            return False
        previous = self.settings
        self.apply(settings)
        self.metrics.config_reloads["applied"] += 1
        log.info("config %s applied: %s", self.config_path, "; ".join(reload_said(previous, settings)) or "nothing changed")
        return True

    def _stop_discovery(self) -> None:
        if self._discovery is not None:
            self._discovery.cancel()
            self._discovery = None

    def _start_discovery(self, discovery: DiscoverySettings) -> None:
        from .discovery import kubernetes  # only routers that discover pods need the client
        self._discovery = asyncio.get_running_loop().create_task(
            kubernetes.run(discovery, self.replicas), name="discovery")

    async def run_background(self) -> None:
        """Pin expiry and config-file polling (ConfigMap updates arrive as file changes). A bug in one pass is
        logged and the next pass runs: a dead loop would stop pin expiry and reloads without a word."""
        waited = 0.0
        while True:
            await asyncio.sleep(RELOAD_INTERVAL)
            waited += RELOAD_INTERVAL
            try:
                if self.config_path is not None and _mtime(self.config_path) != self._config_mtime:
                    self.reload()
                if waited >= EXPIRY_INTERVAL:
                    waited = 0.0
                    await self.expire_pins()
                    if self.grpc_proxy is not None:
                        self.grpc_proxy.prune()
            except Exception:
                log.exception("the router's background pass failed; the next runs in %gs", RELOAD_INTERVAL)

    @property
    def admin_url(self) -> str:
        """Where the admin listener answers (after ``start``)."""
        assert self.admin_address is not None and self.admin_port is not None, "no admin listener"
        return f"http://{address(self.admin_address[0], self.admin_port)}"

    async def expire_pins(self) -> int:
        """Drop idle pins ``EXPIRY_BATCH`` at a time, yielding to the loop between batches; returns how many."""
        total = 0
        while (expired := self.balancer.expire_idle(EXPIRY_BATCH)) == EXPIRY_BATCH:
            total += expired
            await asyncio.sleep(0)
        return total + expired

    async def start(self, host: str, port: int) -> int:
        """Start everything the router owns; listen for HTTP on ``host:port`` (0: any free port). Returns the port."""
        self.apply(self.settings)
        self._started = True
        if self.state_file is not None:  # before any request can make a pin of its own
            pinfile.restore(self.state_file, self.balancer, self.replicas, self.settings.session,
                            self.settings.group.max_groups)
        limit = descriptors.raise_limit()
        cap = descriptors.connection_cap(self.settings.max_connections, limit, 1 + (self.grpc_proxy is not None))
        limit_connections(cap)
        for listener in (self.http_proxy, self.admin, *([self.grpc_proxy] if self.grpc_proxy is not None else [])):
            listener.reuse_port = self.peering.worker  # the parent holds these ports bound, not listening
        self.port = await bind(self.http_proxy.start(host, port), "--host", "--port", host, port)
        if self.admin_address is not None:
            self.admin_port = await bind(self.admin.start(*self.admin_address), "--admin-host", "--admin-port",
                                         *self.admin_address)
        self._background = asyncio.get_running_loop().create_task(self.run_background(), name="background")
        self._probing = asyncio.get_running_loop().create_task(self.prober.run(), name="health-probes")
        self._asking = asyncio.get_running_loop().create_task(self.rl.routes.watch(
            self.replicas, self.rl.engines, lambda: self.settings.health.probe_interval_seconds is not None),
            name="rl-routes")
        if self.grpc_proxy is not None and self.grpc_address is not None:
            grpc_host, _, grpc_port = self.grpc_address.rpartition(":")
            self.grpc_port = await bind(self.grpc_proxy.start(grpc_host.strip("[]"), int(grpc_port)), "--host",
                                        "--grpc-port", grpc_host, int(grpc_port))
        descriptors.say_cut(self.settings.max_connections, cap, limit)  # once bound: a bind error stays one line
        if self.peering.worker:  # where the other workers forward to this one: the shared port could be any of them
            # (a fleet of pods: the other pods' routers too, on the admin listener's addresses: docs/fleet.md)
            private = self.admin_address[0] if self.peering.selector and self.admin_address else WORKER_HOST
            self._fleet_ports = (await self.http_proxy.listen_privately(private),
                                 await self.grpc_proxy.listen_privately(private) if self.grpc_proxy else None)
        if self.peering.wanted(self.settings):
            self._start_fleet()
        if self.peering.sockets is not None and self.fleet is not None and self.admin_port is not None:
            await self._start_decisions(self.peering.sockets, self.admin_port)
        return self.port

    async def _start_decisions(self, sockets: Path, admin_port: int) -> None:
        """A worker's decision channels (``proxy.decisions``): its own socket, named by its admin port, and its
        siblings', named by theirs, in the directory its parent made."""
        from .proxy.decisions import DecisionClient, DecisionService
        assert self.fleet is not None
        service = DecisionService(self)
        try:
            await service.start(sockets / f"{admin_port}.sock")
        except OSError as error:  # a path past AF_UNIX's 108 bytes (a long TMPDIR): the workers relay instead
            log.warning("no decision channel at %s (%s): turns for the other workers' keys are relayed", sockets,
                        error)
            return
        self.decisions = service
        siblings = {sibling: sockets / f"{urlsplit(sibling).port}.sock" for sibling in self.fleet.siblings}
        self.http_proxy.decisions = DecisionClient(
            siblings, self.clock, lambda: (self.settings.fleet or FleetSettings()).peer_timeout_seconds)

    def _start_fleet(self) -> None:
        """Session ownership: needs the admin listener, where the other routers reach this one."""
        from .fleet.node import Fleet, advertised
        if self.admin_address is None or self.admin_port is None:
            raise RuntimeError("session ownership (--peer, fleet.peers, --peer-selector) needs the admin listener")
        self_id = self.peering.advertise or advertised(self.admin_address[0], self.admin_port)
        self.rl.origin = self_id
        host = urlsplit(self_id).hostname or "127.0.0.1"
        token = self.admin.token
        http_port, grpc_port = self._fleet_ports
        self.fleet = Fleet(self.replicas, self.balancer, self.clock, self.settings.fleet or FleetSettings(),
                           lambda: self.settings.session.idle_timeout_seconds, self_id,
                           f"http://{address(host, http_port or self.port or 0)}",
                           address(host, grpc_port or self.grpc_port) if self.grpc_port is not None else None,
                           lambda: token.current() if token is not None else None,
                           self.peering.peers, self.peering.selector, self.peering.namespace, self.peering.ownership,
                           self.rl, siblings=self.peering.peers if self.peering.worker else ())
        self.changes.bump()
        self.fleet.start()

    def has_peers(self) -> bool:
        """Whether another router shares the sessions now (then SIGTERM hands them over: ``drain``)."""
        return self.fleet is not None and len(self.fleet.members()) > 1

    def in_flight(self) -> int:
        """HTTP requests being answered, gRPC calls in progress (those forwarded to another router too)."""
        calls = len(self.grpc_proxy.calls) if self.grpc_proxy is not None else 0
        return self.http_proxy.answering + calls

    async def drain(self, timeout: float, accept_seconds: float, why: str = "") -> bool:
        """Stop taking new work and finish what was accepted, within ``timeout`` seconds (``stopping.py``; ``why``
        starts its log line); a router sharing its sessions hands them over meanwhile (``fleet/leaving.py``)."""
        from .fleet import leaving
        fleet = self.fleet if self.has_peers() or self.peering.worker else None  # a worker: even once alone
        listeners = [self.http_proxy, *([self.grpc_proxy] if self.grpc_proxy is not None else [])]

        async def begin() -> None:
            self.draining = True
            if fleet is not None:
                await leaving.begin(fleet)

        def stop_accepting() -> None:
            for listener in listeners:
                listener.stop_accepting()

        async def end() -> bool:
            return await leaving.end(fleet) if fleet is not None else True

        def busy() -> int:  # and connections open: a request still being read on one is accepted
            return (self.in_flight() + self.replicas.total_inflight()
                    + sum(len(listener.clients) + listener.taking for listener in listeners))
        def pins_left() -> int:
            return len(self.balancer.pins()) if fleet is not None else 0
        steps = stopping.Drain(busy, self.in_flight, self.metrics.answered, begin, stop_accepting, end, pins_left)
        return await stopping.drain(steps, timeout, accept_seconds, why)

    async def stop(self) -> None:
        if self.state_file is not None and self._started:
            pinfile.save_logged(self.state_file, self.balancer, self.clock())
        if self.decisions is not None:
            self.decisions.close()
        if self.http_proxy.decisions is not None:
            self.http_proxy.decisions.close()
        if self.fleet is not None:
            await self.fleet.stop()
        if self.grpc_proxy is not None:
            await self.grpc_proxy.close(grace=STOP_GRACE_SECONDS)
        for task in (self._background, self._probing, self._discovery, self._asking):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.http_proxy.close()
        await self.admin.close()
        await self.rl.engines.close()


@dataclasses.dataclass(frozen=True)
class Peering:
    """The command line's peer sources (``--peer``, ``--peer-selector``/``--peer-namespace``, ``--advertise``)
    and ``--ownership``."""

    peers: tuple[str, ...] = ()
    selector: str | None = None
    namespace: str | None = None
    advertise: str | None = None
    ownership: Ownership | None = None
    worker: bool = False  # one of ``serve --workers N``'s processes: it shares the traffic ports (multicore.py)
    sockets: Path | None = None  # a worker's: where the workers' decision channels are (``proxy.decisions``)

    def wanted(self, settings: RouterSettings) -> bool:
        """Session ownership is on when any peer source is given (the config's ``fleet`` section is one)."""
        return bool(self.peers or self.selector) or settings.fleet is not None


def reload_said(before: RouterSettings, after: RouterSettings, limit: int = 12) -> list[str]:
    """What a reload changed, as the file names it (``session.maxSessions: 100000 -> 50``), at most ``limit``."""
    old, new = _flat(before.model_dump(mode="json", by_alias=True)), _flat(after.model_dump(mode="json", by_alias=True))
    said = [f"{key}: {_short(old.get(key))} -> {_short(new.get(key))}" for key in sorted(old.keys() | new.keys())
            if old.get(key) != new.get(key)]
    return said[:limit] + ([f"and {len(said) - limit} more"] if len(said) > limit else [])


def _flat(document: dict, prefix: str = "") -> dict:
    flat: dict = {}
    for key, value in document.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _short(value: object) -> str:
    if isinstance(value, list) and all(isinstance(v, dict) and "url" in v for v in value):
        value = [v["url"] + (f",grpc={v['grpc']}" if v.get("grpc") else "") for v in value]  # backends
    if isinstance(value, list) and len(value) > 4:
        return f"[{len(value)} items]"
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return "null" if value is None else value if isinstance(value, str) else json.dumps(value)


def _keeps_replicas(running: RouterSettings, settings: RouterSettings, said: bool) -> None:
    """Raise when the ``running`` settings name replicas and ``settings`` name none, unless the file says
    ``backends: []`` itself: a file that is empty, a comment, or half written (an editor's save, ``cat >``) must not
    empty a running fleet. (Replicas registered through the worker API are no setting: a reload keeps them.)"""
    names = (running.discovery is not None or running.backends) and settings.discovery is None and not settings.backends
    if names and not said:
        raise SettingsError("it names no replica (no backends, no discovery) where the running settings do: applying "
                            "it would remove every replica; write 'backends: []' to mean that")


def _mtime(path: Path | None) -> float | None:
    try:
        return path.stat().st_mtime if path else None
    except OSError:
        return None

"""Prometheus metrics and the /status document, both read from live state.

Decision counters and in-flight gauges are collected at scrape time from the
policy and the replica set, so /metrics and /status can never disagree.
``Metrics`` is given what it reads (the balancer, the replica set, the live
settings and fleet) by app.py; the listeners only count into it, through the
runtime they are handed (``proxy.context.RouterContext``), and import nothing from here.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import descriptors
from .replicas import grpc_only

if TYPE_CHECKING:
    from .balancer import Balancer
    from .fleet.node import Fleet
    from .replicas import Replica, ReplicaSet
    from .settings import RouterSettings

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# Decision counter field -> metric name (without the _total suffix).
_DECISIONS = {
    "affinity_kept": "Keyed requests sent to the replica of the session's previous turn.",
    "affinity_broken": "Keyed requests moved off a still-routable replica (margin exceeded, or the policy's own rule).",
    "new_sessions": "Sessions pinned for the first time.",
    "repinned_replica_gone": "Sessions re-pinned because their replica left the set or was down.",
    "unkeyed": "Requests routed without a session: no key, or a policy that keeps none.",
    "evicted_lru": "Pins evicted because the session table was full.",
    "expired_idle": "Pins dropped after the idle timeout.",
    "released": "Pins released explicitly with DELETE /v1/sessions/{key}.",
    "group_colocated": "New sessions (or unkeyed requests) with a group key placed on their group's replica.",
    "group_spilled": "New sessions (or unkeyed requests) with a group key placed elsewhere: the group's replica was "
                     "beyond the margin or gone.",
}


class _LiveCollector(Collector):
    def __init__(self, metrics: Metrics):
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        live = self._metrics
        reloads = CounterMetricFamily("rolloutrouter_config_reloads", "Config file reloads, by result.",
                                      labels=["result"])
        for result, count in live.config_reloads.items():
            reloads.add_metric([result], count)
        yield reloads
        counters = live.balancer.policy.counters.as_dict()
        for field, doc in _DECISIONS.items():
            family = CounterMetricFamily(f"rolloutrouter_{field}", doc)
            family.add_metric([], counters[field])
            yield family
        inflight = GaugeMetricFamily("rolloutrouter_backend_inflight_requests",
                                     "Requests in flight per replica.", labels=["backend"])
        for replica in live.replicas.replicas():
            inflight.add_metric([replica.id], replica.inflight)
        yield inflight
        repinned = CounterMetricFamily("rolloutrouter_repinned", "Sessions re-pinned because their replica was "
                                       "not routable, by why: removed, ejected, unhealthy, down, no_grpc.",
                                       labels=["reason"])
        for reason, count in live.balancer.repinned.items():
            repinned.add_metric([reason], count)
        yield repinned
        healthy = GaugeMetricFamily("rolloutrouter_backend_healthy",
                                    "1 while the replica's last health probe passed (over HTTP; for a gRPC-only "
                                    "replica over gRPC).", labels=["backend"])
        grpc_healthy = GaugeMetricFamily("rolloutrouter_backend_grpc_healthy",
                                         "1 while the last gRPC health probe of a replica with a gRPC address passed.",
                                         labels=["backend"])
        for replica in live.replicas.replicas():
            http_ok = replica.grpc_healthy if grpc_only(replica.id) else replica.healthy
            healthy.add_metric([replica.id], 1 if http_ok else 0)
            if replica.grpc_target is not None:
                grpc_healthy.add_metric([replica.id], 1 if replica.grpc_healthy else 0)
        yield healthy
        yield grpc_healthy
        exhausted = CounterMetricFamily("rolloutrouter_descriptors_exhausted",
                                        "Connects to replicas (connect) and probes (probe) the router could not make "
                                        "for want of a file descriptor; no replica is blamed for them.",
                                        labels=["where"])
        for where, count in sorted(descriptors.exhausted.items()):
            exhausted.add_metric([where], count)
        yield exhausted
        yield GaugeMetricFamily("rolloutrouter_backends_ejected", "Replicas ejected now (passive health).",
                                value=live.replicas.ejected())
        yield GaugeMetricFamily("rolloutrouter_sessions", "Sessions currently pinned.",
                                value=live.balancer.policy.sessions())
        yield GaugeMetricFamily("rolloutrouter_backends_ready", "Replicas that can take requests now.",
                                value=live.replicas.ready_count())
        yield GaugeMetricFamily("rolloutrouter_backends", "Replicas known (ready or not).",
                                value=len(live.replicas))
        margin = live.settings().affinity_break_margin
        yield GaugeMetricFamily("rolloutrouter_affinity_break_margin",
                                "The configured margin; -1 means null (never break).",
                                value=-1 if margin is None else margin)
        yield from _fleet_metrics(live.fleet())


def _fleet_metrics(fleet: Fleet | None) -> Iterator[Metric]:
    """Session ownership among several routers (zeros, and one member, for a router alone)."""
    for name, doc, value in (
            ("forwarded", "Requests forwarded to their session's owner router.", fleet and fleet.forwarded),
            ("owner_unreachable", "Requests whose owner router could not be reached before the first byte: "
             "decided here (entry ownership: lookups that found no pin while a peer did not answer).",
             fleet and fleet.owner_unreachable),
            ("handoffs", "Pins received from a session's previous owner after ownership moved.",
             fleet and fleet.handoff.handoffs),
            ("sessions_replaced", "Sessions placed anew because their previous owner router is gone for good.",
             fleet and fleet.handoff.replaced),
            ("pin_lookups", "Entry ownership: keys without a pin here that every peer router was asked for.",
             fleet and fleet.handoff.lookups)):
        yield CounterMetricFamily(f"rolloutrouter_{name}", doc, value=value or 0)
    yield GaugeMetricFamily("rolloutrouter_fleet_members", "Routers sharing the sessions, this one included.",
                            value=len(fleet.members()) if fleet else 1)
    age = GaugeMetricFamily("rolloutrouter_peer_load_age_seconds", "Age of the newest load report from each "
                            "peer router.", labels=["peer"])
    for peer, seconds in (fleet.peer_load_ages() if fleet else {}).items():
        age.add_metric([peer], seconds)
    yield age


class Metrics:
    """One registry per router, so several routers can live in one process (tests).

    ``settings`` and ``fleet`` are read when a scrape or /status asks: a reload replaces
    the settings, and the fleet starts after the listeners.
    """

    def __init__(self, balancer: Balancer, replicas: ReplicaSet, settings: Callable[[], RouterSettings],
                 fleet: Callable[[], Fleet | None], clock: Callable[[], float]):
        self.balancer, self.replicas, self.settings, self.fleet, self.clock = balancer, replicas, settings, fleet, clock
        self.registry = CollectorRegistry()
        self.registry.register(_LiveCollector(self))
        self.requests = Counter("rolloutrouter_requests", "Proxied requests by replica and status code.",
                                ["backend", "code"], registry=self.registry)
        self.duration = Histogram("rolloutrouter_request_duration_seconds",
                                  "Time from dispatch to the end of the response, per replica.",
                                  ["backend"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.retries = Counter("rolloutrouter_upstream_retries", "Requests retried on another replica after a refused connection.",
                               ["backend"], registry=self.registry)
        self.errors = Counter("rolloutrouter_request_errors", "Requests answered by the router itself with an error, by reason.",
                              ["reason"], registry=self.registry)
        self.connections_rejected = Counter("rolloutrouter_connections_rejected",
                                            "Client connections refused (503) at the listener's maxConnections.",
                                            ["listener"], registry=self.registry)
        self.client_connections = Gauge("rolloutrouter_client_connections", "Client connections open, per listener.",
                                        ["listener"], registry=self.registry)
        self.grpc_calls = Gauge("rolloutrouter_grpc_calls", "gRPC calls in progress on the gRPC listener; bounded by "
                                "maxGrpcStreams.", registry=self.registry)
        self.buffered_bytes = Gauge("rolloutrouter_buffered_request_bytes",
                                    "Request bytes (heads and bodies) held now, per listener; bounded by maxBufferedBytes.",
                                    ["listener"], registry=self.registry)

        self.ejections = Counter("rolloutrouter_replica_ejections", "Replicas ejected after failures in a row, "
                                 "by the last failure: timeout, invalid_response, closed.",
                                 ["backend", "reason"], registry=self.registry)
        self.probe_failures = Counter("rolloutrouter_health_probe_failures", "Failed health probes, by why: "
                                      "timeout, connection_failed, bad_status, invalid_response, closed.",
                                      ["backend", "reason"], registry=self.registry)

        self.config_reloads = {"applied": 0, "rejected": 0}  # read by the live collector and /status
        self._children: dict[tuple[str, int | str], tuple[Callable[[], None], Callable[[float], None]]] = {}

    def ejected(self, backend: str, reason: str) -> None:
        self.ejections.labels(backend, reason).inc()

    def probe_failed(self, backend: str, reason: str) -> None:
        self.probe_failures.labels(backend, reason).inc()

    def observe(self, backend: str, code: int | str, seconds: float) -> None:
        """Count one finished request; the labelled children are looked up once per (backend, code)."""
        children = self._children.get((backend, code))
        if children is None:
            children = self._children[(backend, code)] = (self.requests.labels(backend, str(code)).inc,
                                                          self.duration.labels(backend).observe)
        children[0]()
        children[1](seconds)


    def status(self) -> dict:
        """verl's get_status() plus the decision counters."""
        return _status(self)


def _status(live: Metrics) -> dict:
    balancer, replicas, settings, fleet = live.balancer, live.replicas, live.settings(), live.fleet()
    loads, grpc_loads = replicas.loads(), replicas.loads(grpc=True)  # live views, read once for the document
    now, wall = live.clock(), time.time()
    return {
        **balancer.policy.counters.as_dict(),
        "policy": balancer.policy.name,
        "affinity_break_margin": settings.affinity_break_margin,
        "full_determinism": settings.full_determinism,
        "sessions": balancer.policy.sessions(),
        "total_inflight": replicas.total_inflight(),
        "backends_ready": replicas.ready_count(),
        "backends_ready_http": len(loads),
        "backends_ready_grpc": len(grpc_loads),
        "backends_ejected": replicas.ejected(),
        "repinned": dict(balancer.repinned),
        "backends": [_backend(r, r.id in loads, r.id in grpc_loads, now, wall) for r in replicas.replicas()],
        "config_reloads": dict(live.config_reloads),
        "fleet": fleet.status() if fleet is not None else None,
    }


def _backend(replica: Replica, ready: bool, ready_grpc: bool, now: float, wall: float) -> dict:
    """One replica in /status: ``ready`` over HTTP, ``ready_grpc`` over gRPC, ``protocols`` the listeners it can
    serve at all; ``ejected_until`` is Unix time, null when not ejected."""
    ejected = replica.ejected_until > now
    protocols = [*([] if grpc_only(replica.id) else ["http"]), *(["grpc"] if replica.grpc_target else [])]
    return {"url": replica.id, "inflight": replica.inflight, "fleet_inflight": replica.inflight + replica.external,
            "protocols": protocols, "grpc": replica.grpc_target,
            "ready": ready, "ready_grpc": ready_grpc, "healthy": replica.healthy, "grpc_healthy": replica.grpc_healthy,
            "ejected_until": round(wall + replica.ejected_until - now, 3) if ejected else None,
            "consecutive_failures": replica.failures}

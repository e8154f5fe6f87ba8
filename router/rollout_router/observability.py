"""Prometheus metrics and the /status document, both read from live state.

Decision counters and in-flight gauges are collected at scrape time from the
policy and the replica set, so /metrics and /status can never disagree.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .balancer import Balancer

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# Decision counter field -> metric name (without the _total suffix).
_DECISIONS = {
    "affinity_kept": "Sticky hits that stayed on their pinned replica.",
    "affinity_broken": "Sticky hits re-pinned because the pinned replica exceeded the break margin.",
    "new_sessions": "Sessions pinned for the first time.",
    "repinned_replica_gone": "Sessions re-pinned because their replica left the set or was down.",
    "unkeyed": "Requests without a session key (routed least-loaded, never pinned).",
    "evicted_lru": "Pins evicted because the session table was full.",
    "expired_idle": "Pins dropped after the idle timeout.",
    "released": "Pins released explicitly with DELETE /v1/sessions/{key}.",
}


class _LiveCollector(Collector):
    def __init__(self, balancer: Balancer, metrics: Metrics):
        self._balancer, self._metrics = balancer, metrics

    def collect(self):
        reloads = CounterMetricFamily("rolloutrouter_config_reloads", "Config file reloads, by result.",
                                      labels=["result"])
        for result, count in self._metrics.config_reloads.items():
            reloads.add_metric([result], count)
        yield reloads
        counters = self._balancer.policy.counters.as_dict()
        for field, doc in _DECISIONS.items():
            family = CounterMetricFamily(f"rolloutrouter_{field}", doc)
            family.add_metric([], counters[field])
            yield family
        inflight = GaugeMetricFamily("rolloutrouter_backend_inflight_requests",
                                     "Requests in flight per replica.", labels=["backend"])
        for replica in self._balancer.replicas.replicas():
            inflight.add_metric([replica.id], replica.inflight)
        yield inflight
        yield GaugeMetricFamily("rolloutrouter_sessions", "Sessions currently pinned.",
                                value=self._balancer.policy.sessions())
        yield GaugeMetricFamily("rolloutrouter_backends_ready", "Replicas that can take requests now.",
                                value=self._balancer.replicas.ready_count())
        yield GaugeMetricFamily("rolloutrouter_backends", "Replicas known (ready or not).",
                                value=len(self._balancer.replicas))
        margin = self._balancer.settings.affinity_break_margin
        yield GaugeMetricFamily("rolloutrouter_affinity_break_margin",
                                "The configured margin; -1 means null (never break).",
                                value=-1 if margin is None else margin)


class Metrics:
    """One registry per router, so several routers can live in one process (tests)."""

    def __init__(self, balancer: Balancer):
        self.registry = CollectorRegistry()
        self.registry.register(_LiveCollector(balancer, self))
        self.requests = Counter("rolloutrouter_requests", "Proxied requests by replica and status code.",
                                ["backend", "code"], registry=self.registry)
        self.duration = Histogram("rolloutrouter_request_duration_seconds",
                                  "Time from dispatch to the end of the response, per replica.",
                                  ["backend"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.retries = Counter("rolloutrouter_upstream_retries", "Requests retried on another replica after a refused connection.",
                               ["backend"], registry=self.registry)
        self.errors = Counter("rolloutrouter_request_errors", "Requests answered by the router itself with an error, by reason.",
                              ["reason"], registry=self.registry)

        self.config_reloads = {"applied": 0, "rejected": 0}  # read by the live collector and /status

    def observe(self, backend: str, code: int | str, seconds: float) -> None:
        self.requests.labels(backend, str(code)).inc()
        self.duration.labels(backend).observe(seconds)


def status(balancer: Balancer, metrics: Metrics) -> dict:
    """verl's get_status() plus the decision counters."""
    replicas = balancer.replicas.replicas()
    loads = balancer.replicas.loads()
    return {
        **balancer.policy.counters.as_dict(),
        "policy": balancer.policy.name,
        "affinity_break_margin": balancer.settings.affinity_break_margin,
        "full_determinism": balancer.settings.full_determinism,
        "sessions": balancer.policy.sessions(),
        "total_inflight": balancer.replicas.total_inflight(),
        "backends_ready": len(loads),
        "backends": [{"url": r.id, "inflight": r.inflight, "ready": r.id in loads} for r in replicas],
        "config_reloads": dict(metrics.config_reloads),
    }

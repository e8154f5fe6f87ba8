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

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import descriptors
from .core.tallies import CounterChild, HistogramChild, Sampler, answered_in
from .replicas import grpc_only
from .tallies import Spread, Tally

if TYPE_CHECKING:
    from .balancer import Balancer
    from .fleet.node import Fleet
    from .fleet.rlstate import RlState
    from .proxy.turns import Turn
    from .replicas import Replica, ReplicaSet
    from .settings import MetricsSettings, RouterSettings

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
GAP_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)  # in-flight requests (the margin's unit)
AGE_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)
OUTCOMES = ("kept", "broken", "new", "repinned", "unkeyed")
MOVED = ("broken", "repinned")
OTHER = "other"  # the backend label of replicas beyond settings.metrics.maxBackendLabels
SHARED_KEPT = 4096  # (replica, code) pairs under ``other`` whose series are remembered; cleared when full

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
    "restored": "Pins read back at start from the --state-file a stopping router wrote.",
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
                                     "Requests in flight per replica, a removed one's too until its last ends.",
                                     labels=["backend"])
        for backend, value in live.per_backend(lambda r: r.inflight, draining=True).items():
            inflight.add_metric([backend], value)
        yield inflight
        repinned = CounterMetricFamily("rolloutrouter_repinned", "Sessions re-pinned because their replica was "
                                       "not routable, by why: removed, ejected, unhealthy, down, no_grpc.",
                                       labels=["reason"])
        for reason, count in live.balancer.repinned.items():
            repinned.add_metric([reason], count)
        yield repinned
        healthy = GaugeMetricFamily("rolloutrouter_backend_healthy",
                                    "1 while the replica's last health probe passed (over HTTP; for a gRPC-only "
                                    "replica over gRPC); backend=\"other\" counts the healthy ones beyond "
                                    "maxBackendLabels.", labels=["backend"])
        grpc_healthy = GaugeMetricFamily("rolloutrouter_backend_grpc_healthy",
                                         "1 while the last gRPC health probe of a replica with a gRPC address passed.",
                                         labels=["backend"])
        for backend, value in live.per_backend(
                lambda r: int(r.grpc_healthy if grpc_only(r.id) else r.healthy)).items():
            healthy.add_metric([backend], value)
        for backend, value in live.per_backend(lambda r: int(r.grpc_healthy), grpc=True).items():
            grpc_healthy.add_metric([backend], value)
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
        yield from _lane_metrics(live.data_path())


def _lane_metrics(path: dict) -> Iterator[Metric]:
    """The traffic port's native lane: what it answered, what it handed to the Python data path and why."""
    yield CounterMetricFamily("rolloutrouter_http_lane_requests", "HTTP requests the traffic port's native lane "
                              "forwarded and relayed itself (docs/architecture.md); 0 on the Python data path.",
                              value=path.get("lane_requests", 0))
    handovers = CounterMetricFamily("rolloutrouter_http_lane_handovers", "HTTP requests the native lane handed to "
                                    "the Python data path, by why (docs/architecture.md, \"The native lane\").",
                                    labels=["reason"])
    for reason, count in path.get("lane_handovers", {}).items():
        handovers.add_metric([reason], count)
    yield handovers


def _fleet_metrics(fleet: Fleet | None) -> Iterator[Metric]:
    """Session ownership among several routers (zeros, and one member, for a router alone)."""
    for name, doc, value in (
            ("forwarded", "Requests forwarded to their session's owner router.", fleet and fleet.forwarded),
            ("delegated", "Requests sent to the replica their session's owner worker chose (serve --workers N): "
             "asked, not relayed.", fleet and fleet.delegated),
            ("decisions_abandoned", "Decisions made for a sibling worker that had stopped waiting and relayed the "
             "request instead: each is also in the decision counters, which are over by this many.",
             fleet and fleet.abandoned),
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
        # When this process began counting (Unix time): the operator tells a restart from a slow count by it.
        self.started_at = round(time.time(), 3)
        self.registry = CollectorRegistry()
        self.registry.register(_LiveCollector(self))
        # Counted per request: plain numbers a collector reads at scrape time (tallies.py), not locked metrics.
        self.requests = Tally("rolloutrouter_requests", "Proxied requests by replica and status code.",
                              ["backend", "code"])
        self.duration = Spread("rolloutrouter_request_duration_seconds",
                               "Time from dispatch to the end of the response, per replica.",
                               ["backend"], LATENCY_BUCKETS)
        self.retries = Tally("rolloutrouter_upstream_retries", "Requests retried on another replica after a refused "
                             "connection.", ["backend"])
        self.errors = Counter("rolloutrouter_request_errors", "Requests answered by the router itself with an error, by reason.",
                              ["reason"], registry=self.registry)
        self.connections_rejected = Counter("rolloutrouter_connections_rejected",
                                            "Client connections refused (503) at the listener's maxConnections.",
                                            ["listener"], registry=self.registry)
        self.write_stalls = Counter("rolloutrouter_client_write_stalls",
                                    "Client connections cut after reading nothing of their answers for 60 s.",
                                    ["listener"], registry=self.registry)
        self.client_connections = Gauge("rolloutrouter_client_connections", "Client connections open, per listener.",
                                        ["listener"], registry=self.registry)
        self.grpc_calls = Gauge("rolloutrouter_grpc_calls", "gRPC calls in progress on the gRPC listener; bounded by "
                                "maxGrpcStreams.", registry=self.registry)
        self.buffered_bytes = Gauge("rolloutrouter_buffered_request_bytes",
                                    "Request bytes (heads and bodies) held now, per listener; bounded by maxBufferedBytes.",
                                    ["listener"], registry=self.registry)

        self.ejections = Tally("rolloutrouter_replica_ejections", "Replicas ejected after failures in a row, "
                               "by the last failure: timeout, invalid_response, closed.", ["backend", "reason"])
        self.probe_failures = Tally("rolloutrouter_health_probe_failures", "Failed health probes, by why: "
                                    "timeout, connection_failed, bad_status, invalid_response, closed, router.",
                                    ["backend", "reason"])
        self._per_backend = (self.requests, self.duration, self.retries, self.ejections, self.probe_failures)
        for family in self._per_backend:
            self.registry.register(family)

        self.config_reloads = {"applied": 0, "rejected": 0}  # read by the live collector and /status
        self.rl: RlState | None = None  # the RL step's state (app.py sets it): /status's "rl"
        # the traffic port's data path and its lane's counts (app.py sets it): /status's "data_path"
        self.data_path: Callable[[], dict] = lambda: {"http": "python"}
        # (replica, code) -> its series, for replicas with a backend label of their own (``observe``; the native
        # lane's answer counts into the ones found here)
        self.series: dict[tuple[str, int | str], tuple[CounterChild, HistogramChild]] = {}
        self._labels: dict[str, str] = {}  # the replicas with a backend label of their own (at most the cap)
        self._scanned = -1  # ``replicas.departures`` when ``_reclaim`` last looked the labels over
        # (replica, code) -> the ``other`` series, for replicas without a label of their own: good until a label
        # may have freed (``_reclaim`` looks again), then each asks again
        self._shared: dict[tuple[str, int | str], tuple[CounterChild, HistogramChild]] = {}
        self.margin = MarginMeter(self.registry)
        self.configure(settings().metrics)
        # A turn the replica accepted (``MarginMeter.turn``), bound once: one call per request rather than two.
        self.turn: Callable[[Turn], None] = self.margin.turn
        balancer.on_break = self.margin.broke  # the balancer sees each break's loads; the meter counts them

    def configure(self, settings: MetricsSettings) -> None:
        """Take new metrics settings (on start and on every reload): the kept-turn sample rate, and a new
        ``maxBackendLabels`` for the replicas under ``other``, which ask for a label again."""
        self.margin.sampler.rate = settings.kept_prefill_sample_rate
        self._scanned = -1

    def backend_label(self, backend: str) -> str:
        """``backend`` as a label value: at most ``maxBackendLabels`` replicas keep their URL, the rest share
        ``other``, so a churning fleet cannot grow the series without bound. When the labels are all taken, those
        of replicas that have left (drained) are given up first, with their series (``_reclaim``)."""
        label = self._labels.get(backend)
        if label is None:
            cap = self.settings().metrics.max_backend_labels
            if len(self._labels) >= cap and self._reclaim() >= cap:
                return OTHER  # not remembered either: a churning fleet grows no table here
            label = self._labels[backend] = backend
            if not self.replicas.known(backend):  # gone already: the next ``_reclaim`` looks again
                self._scanned = -1
        return label

    def _reclaim(self) -> int:
        """Give up the labels of replicas no longer in the set (nor draining) and drop their series: a fleet whose
        pods come back on new addresses keeps per-replica metrics for the replicas it has. Returns the labels kept.
        The labels are scanned only when a replica has left since the last scan (``ReplicaSet.departures``): in a
        fleet above the cap, a request to a replica labelled ``other`` comes here every time."""
        departures = self.replicas.departures
        if departures == self._scanned:  # every label's replica was known then and none has left since
            return len(self._labels)
        self._scanned = departures
        self._shared.clear()  # a label may free: replicas under ``other`` ask again
        gone = {backend for backend in self._labels if not self.replicas.known(backend)}
        if gone:
            for backend in gone:
                del self._labels[backend]
            for family in self._per_backend:
                for values in [v for v in family.children if v[0] in gone]:
                    del family.children[values]
            for key in [key for key in self.series if key[0] in gone]:  # in place: the native lane holds the dict
                del self.series[key]
        return len(self._labels)

    def per_backend(self, value: Callable[[Replica], int], grpc: bool = False,
                    draining: bool = False) -> dict[str, int]:
        """``value`` of each replica (with a gRPC target, when ``grpc``; and of the removed ones still draining
        their requests, when ``draining``) by backend label; ``other`` sums."""
        result: dict[str, int] = {}
        for replica in [*self.replicas.replicas(), *(self.replicas.draining() if draining else ())]:
            if not grpc or replica.grpc_target is not None:
                label = self.backend_label(replica.id)
                result[label] = result.get(label, 0) + value(replica)
        return result

    def ejected(self, backend: str, reason: str) -> None:
        self.ejections.child(self.backend_label(backend), reason).inc()

    def probe_failed(self, backend: str, reason: str) -> None:
        self.probe_failures.child(self.backend_label(backend), reason).inc()

    def retried(self, backend: str) -> None:
        self.retries.child(self.backend_label(backend)).inc()

    def answered(self) -> int:
        """Proxied requests answered so far, over every replica and code (what a drain reports it finished)."""
        return sum(child.value for child in self.requests.children.values())

    def observe(self, backend: str, code: int | str, seconds: float) -> None:
        """Count one finished request; a replica's series are looked up once per (replica, code)."""
        children = self.series.get((backend, code))
        if children is None:
            children = self._series(backend, code)
        answered_in(children, seconds)

    def _series(self, backend: str, code: int | str) -> tuple[CounterChild, HistogramChild]:
        """The series a request to ``backend`` answered with ``code`` counts into, remembered: for good when the
        replica has a label of its own; while no replica has left, when it shares ``other`` (a label may free)."""
        shared = self._shared.get((backend, code))
        if shared is not None and self._scanned == self.replicas.departures:
            return shared
        label = self.backend_label(backend)
        children = self.requests.child(label, str(code)), self.duration.child(label)
        if label == backend:
            self.series[(backend, code)] = children
        else:  # ``other``: ``backend_label`` has just looked the labels over, or knows none has freed
            if len(self._shared) >= SHARED_KEPT:
                self._shared.clear()
            self._shared[(backend, code)] = children
        return children


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
        "started_at": live.started_at,
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
        "rl": live.rl.status() if live.rl is not None else None,
        "margin": live.margin.status(),
        "data_path": live.data_path(),
    }


def _backend(replica: Replica, ready: bool, ready_grpc: bool, now: float, wall: float) -> dict:
    """One replica in /status: ``ready`` over HTTP, ``ready_grpc`` over gRPC, ``protocols`` the listeners it can
    serve at all; ``grpc_healthy`` null for a replica with no gRPC target (nothing probes it there);
    ``ejected_until`` is Unix time, null when not ejected."""
    ejected = replica.ejected_until > now
    protocols = [*([] if grpc_only(replica.id) else ["http"]), *(["grpc"] if replica.grpc_target else [])]
    return {"url": replica.id, "inflight": replica.inflight, "fleet_inflight": replica.inflight + replica.external,
            "protocols": protocols, "grpc": replica.grpc_target,
            "ready": ready, "ready_grpc": ready_grpc, "healthy": replica.healthy,
            "grpc_healthy": replica.grpc_healthy if replica.grpc_target else None,  # null: it serves no gRPC
            "ejected_until": round(wall + replica.ejected_until - now, 3) if ejected else None,
            "consecutive_failures": replica.failures}


class MarginMeter:
    """The cost and benefit of moving sessions ("Is the margin paying?"): prefill by moved and sampled kept
    turns, time to first byte by outcome, the gap and pin age at each break. Kept as histograms and counters
    for Prometheus, and as lifetime sums for /status (and through it the resource's status)."""

    def __init__(self, registry: CollectorRegistry):
        self.ttfb = Spread("rolloutrouter_time_to_first_byte_seconds", "Time from dispatch to the first byte of "
                           "the replica's response body (a stream's first event; gRPC: the first message), by "
                           "routing outcome (kept, broken, new, repinned, unkeyed).", ["outcome"], LATENCY_BUCKETS)
        registry.register(self.ttfb)
        # Observed at each break (a margin may break a tenth of the turns): plain numbers too (tallies.py).
        gap = Spread("rolloutrouter_break_gap", "Load gap (pinned replica's in-flight minus the lowest) the margin "
                     "saw at each break.", [], GAP_BUCKETS)
        age = Spread("rolloutrouter_break_pin_age_seconds", "How long a broken pin had been on its replica.", [],
                     AGE_BUCKETS)
        registry.register(gap)
        registry.register(age)
        self.gap, self.age = gap.child(), age.child()
        # Counted per measured turn (every moved turn, a share of kept ones): plain numbers too (tallies.py).
        self.repin_tokens = Tally("rolloutrouter_repin_prefill_tokens", "Prompt tokens the new replica prefilled "
                                  "(prompt_tokens - cached_tokens of its answer) for moved turns, by why moved: "
                                  "margin, removed, ejected, unhealthy, down, no_grpc.", ["reason"])
        self.repin_turns = Tally("rolloutrouter_repin_prefill_turns", "Moved turns whose answer reported "
                                 "prefill, by why moved.", ["reason"])
        kept_tokens = Tally("rolloutrouter_kept_prefill_tokens", "Prompt tokens prefilled by the sampled "
                            "kept turns (settings.metrics.keptPrefillSampleRate).", [])
        kept_turns = Tally("rolloutrouter_kept_prefill_turns", "Sampled kept turns whose answer reported "
                           "prefill.", [])
        self.unmeasured = Tally("rolloutrouter_prefill_unmeasured", "Measured turns whose answer had no usage "
                                "with prompt_tokens_details.cached_tokens (vLLM needs --enable-prompt-tokens-"
                                "details; a stream needs stream_options.include_usage), by outcome.", ["outcome"])
        for family in (self.repin_tokens, self.repin_turns, kept_tokens, kept_turns, self.unmeasured):
            registry.register(family)
        self.kept_tokens, self.kept_turns = kept_tokens.child(), kept_turns.child()  # exported from zero on
        self._ttfb = {outcome: self.ttfb.child(outcome) for outcome in OUTCOMES}  # also /status's TTFB sums
        # A kept turn not measured has no ``Turn`` on the native lane (``attempts.taken``): its first byte goes here.
        self.kept_first_byte: HistogramChild = self._ttfb["kept"]
        # kept-turn sampling (settings.metrics.keptPrefillSampleRate, which ``Metrics.configure`` sets here: read per
        # request from the settings, it cost two pydantic lookups); the native lane's sticky hit samples it too
        self.sampler = Sampler()
        self.sample = self.sampler.sample  # whether this kept turn's answer is read
        self.prefill: dict[str, list[int]] = {"moved": [0, 0], "kept": [0, 0]}  # [turns, tokens]
        self.breaks: list[float] = [0, 0.0]  # [count, gap sum]

    def broke(self, gap: float, age: float | None) -> None:
        self.gap.observe(gap)
        self.breaks[0] += 1
        self.breaks[1] += gap
        if age is not None:
            self.age.observe(age)

    def turn(self, turn: Turn) -> None:
        """A turn the replica accepted: its time to first byte and, when measured, its prefill."""
        if turn.first_byte is not None:
            self._ttfb[turn.outcome].observe(turn.first_byte)
        if turn.measure:
            self._measured(turn)

    def _measured(self, turn: Turn) -> None:
        """A measured turn's prefill, or that its answer did not say."""
        if turn.prefill is None:
            self.unmeasured.child(turn.outcome).value += 1
            return
        kept = turn.outcome == "kept"
        if kept:
            self.kept_tokens.value += turn.prefill
            self.kept_turns.value += 1
        else:
            self.repin_tokens.child(turn.reason or turn.outcome).value += turn.prefill
            self.repin_turns.child(turn.reason or turn.outcome).value += 1
        totals = self.prefill["kept" if kept else "moved"]
        totals[0] += 1
        totals[1] += turn.prefill

    def status(self) -> dict:
        """/status "margin": lifetime sums a reader (or the operator, over several routers) can divide."""
        sums = {outcome: [sum(child.counts), child.sum] for outcome, child in self._ttfb.items()}
        moved = [sum(sums[o][0] for o in MOVED), sum(sums[o][1] for o in MOVED)]
        return {
            "repin_prefill_tokens": self.prefill["moved"][1], "repin_prefill_turns": self.prefill["moved"][0],
            "kept_prefill_tokens": self.prefill["kept"][1], "kept_prefill_turns": self.prefill["kept"][0],
            "ttfb": {"moved": _mean_of(moved),
                     **{outcome: _mean_of(sums[outcome]) for outcome in OUTCOMES}},
            "breaks": int(self.breaks[0]),
            "break_gap_mean": round(self.breaks[1] / self.breaks[0], 3) if self.breaks[0] else None,
        }


def _mean_of(sums: list[float]) -> dict:
    """A TTFB sum as /status shows it: turns, total seconds and mean."""
    count, seconds = int(sums[0]), sums[1]
    return {"turns": count, "seconds": round(seconds, 6), "mean": round(seconds / count, 6) if count else None}

"""The operator's Prometheus metrics: what someone running it wants to alert on.

Handlers stay thin: they open ``reconcile(handler)`` around their work and
hand every status document they write to ``status_written``; counting and
labelling happen here. Metrics live in their own registry (with the usual
process collectors) and are served by ``serve`` on ``--metrics-port``.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import kopf
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from rollout_router.kube.client import ApiError

from .kube import RetryableError

PREFIX = "rolloutrouter_operator"
SUCCESS, INVALID_SPEC, API_ERROR, ERROR = "success", "invalid_spec", "api_error", "error"
CONDITIONS, STATES = ("Ready", "Degraded"), ("True", "False", "Unknown")
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

RECONCILES = Counter(f"{PREFIX}_reconciles", "Handler runs by handler (create, update, resume, delete) and outcome "
                     "(success, invalid_spec, api_error: retried with backoff, error: unexpected, retried).",
                     ["handler", "outcome"], registry=REGISTRY)
RECONCILE_SECONDS = Histogram(f"{PREFIX}_reconcile_duration_seconds", "Time one handler run took, by handler.",
                              ["handler"], registry=REGISTRY)
STATUS_POLLS = Counter(f"{PREFIX}_status_polls", "Reads of one router pod's /status, by result (ok, unreachable).",
                       ["result"], registry=REGISTRY)
for _result in ("ok", "unreachable"):
    STATUS_POLLS.labels(_result)  # both series exist from the start, so rate() and alerts see zeros
STATUS_POLL_ERRORS = Counter(f"{PREFIX}_status_poll_errors", "Status polls of a RolloutRouter that failed on an "
                             "API error (listing its pods, or writing its status); the next tick tries again.", registry=REGISTRY)
LAST_POLL = Gauge(f"{PREFIX}_last_status_poll_timestamp_seconds",
                  "Unix time the last status poll completed (router pods read, status written).", registry=REGISTRY)


@dataclass
class Run:
    """One handler run; the handler sets ``outcome`` when it returns without succeeding (an invalid spec)."""

    outcome: str = SUCCESS


@contextlib.contextmanager
def reconcile(handler: str) -> Iterator[Run]:
    """Time and count one handler run; an exception is counted by kind and re-raised for kopf to retry."""
    run = Run()
    started = time.monotonic()
    try:
        yield run
    except (kopf.TemporaryError, RetryableError, ApiError):
        run.outcome = API_ERROR
        raise
    except Exception:
        run.outcome = ERROR
        raise
    finally:
        RECONCILE_SECONDS.labels(handler).observe(time.monotonic() - started)
        RECONCILES.labels(handler, run.outcome).inc()


class _Conditions(Collector):
    """``rolloutrouter_operator_resources{condition, status}``: how many RolloutRouters are Ready/Degraded."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], dict[str, str]] = {}  # (namespace, name) -> condition -> status

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(f"{PREFIX}_resources", "RolloutRouters by condition and its status, as last "
                                   "written by this operator.", labels=["condition", "status"])
        for condition in CONDITIONS:
            for state in STATES:
                count = sum(1 for c in self.seen.values() if c.get(condition, "Unknown") == state)
                family.add_metric([condition, state], count)
        yield family


RESOURCES = _Conditions()
REGISTRY.register(RESOURCES)


def status_written(namespace: str, name: str, document: dict) -> None:
    """Record a status document the operator wrote: its conditions, and the router pods it read."""
    RESOURCES.seen[(namespace, name)] = {c["type"]: c["status"] for c in document.get("conditions", [])}
    affinity = document.get("affinity")
    if affinity is None:  # an invalid spec: nothing was polled
        return
    STATUS_POLLS.labels("ok").inc(affinity["routersRead"])
    STATUS_POLLS.labels("unreachable").inc(len(affinity["unreachable"]))
    LAST_POLL.set_to_current_time()


def status_poll_failed() -> None:
    STATUS_POLL_ERRORS.inc()


def forget(namespace: str, name: str) -> None:
    """A deleted RolloutRouter no longer counts."""
    RESOURCES.seen.pop((namespace, name), None)


def serve(host: str, port: int) -> int:
    """Serve /metrics in a background thread; a port already taken fails the start, loudly.

    Returns the bound port (the kernel's pick for port 0).
    """
    server, _ = start_http_server(port, addr=host, registry=REGISTRY)
    return server.server_port

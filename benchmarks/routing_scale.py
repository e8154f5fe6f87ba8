"""Routing cost against fleet size: one routing decision (route + lease + release) at 16 and at 1,024 replicas.

The router's own path (``Balancer.acquire`` over the live ``ReplicaSet``), for new sessions (a least-loaded
placement), sticky hits (affinity kept) and unkeyed requests, under the default policy (affinity, margin 2)
and every other policy the router ships; sticky hits under the default policy while half the fleet is marked
down (it refused connections: out of rotation for ``downSeconds``); a 5xx answer's passive-health check while
``maxEjectionPercent`` (50) of the fleet is ejected already; and the count each answered request adds to the metrics
(``Metrics.observe``, requests spread over every replica: at 1,024 replicas most share the ``other`` label of
``maxBackendLabels``, 64). Microseconds per decision or count, median of 5 runs; the ratio column is 1,024 against 16.

    .venv/bin/python benchmarks/routing_scale.py
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from rollout_router.balancer import Balancer
from rollout_router.health.outliers import OutlierDetector
from rollout_router.observability import Metrics
from rollout_router.policy import LiveConfig
from rollout_router.policy.registry import SELECTABLE
from rollout_router.replicas import ReplicaSet
from rollout_router.settings import HealthSettings, RouterSettings

SIZES = (16, 1024)
N = 20_000


def fleet(size: int, down: bool = False) -> ReplicaSet:
    """``size`` replicas (``down``: every other one marked down for longer than the runs take)."""
    replicas = ReplicaSet()
    for i in range(size):
        replicas.add(f"http://10.0.{i // 256}.{i % 256}:8000")
        if down and i % 2:
            replicas.mark_down(f"http://10.0.{i // 256}.{i % 256}:8000", 3600)
    return replicas


def median_us(work: Callable[[int], None], warm: int = 0) -> float:
    """Microseconds per operation: ``work(run)`` does N of them; the median of five timed runs after ``warm``
    untimed ones."""
    runs = []
    for run in range(warm + 5):
        started = time.perf_counter()
        work(run)
        runs.append((time.perf_counter() - started) / N * 1e6)
    return statistics.median(runs[warm:])


def row(policy: str, request: str, costs: list[float]) -> None:
    print(f"{policy:<18}{request:<14}" + "".join(f"{c:>10.2f}" for c in costs) + f"{costs[-1] / costs[0]:>7.2f}x")


def per_decision(policy: str, size: int, keys: list[str | None], down: bool = False) -> float:
    """Microseconds per decision over ``keys`` (the first, untimed run pins them: sticky hits find their pins)."""
    balancer = Balancer(fleet(size, down), policy, LiveConfig(margin=2, max_sessions=1_000_000))

    def decide(_: int) -> None:
        for key in keys:
            balancer.acquire(key)[1].release()
    return median_us(decide, warm=1)


def main() -> None:
    cases: dict[str, list[str | None]] = {"sticky hit": [f"s{i % 256}" for i in range(N)], "unkeyed": [None] * N}
    print(f"{'policy':<18}{'request':<14}" + "".join(f"{f'{n} us':>10}" for n in SIZES) + f"{'ratio':>8}")
    for policy in SELECTABLE:  # every policy the router ships
        for name, keys in cases.items():
            row(policy, name, [per_decision(policy, size, keys) for size in SIZES])
        row(policy, "new session", [per_decision_new(policy, size) for size in SIZES])  # every key new in every run
    row("affinity", "half down", [per_decision("affinity", size, cases["sticky hit"], down=True) for size in SIZES])
    row("(health)", "5xx, cap full", [per_server_error(size) for size in SIZES])
    row("(metrics)", "answered", [per_count(size) for size in SIZES])


def per_server_error(size: int) -> float:
    """Microseconds per ``OutlierDetector.answered`` of a 503 from a replica past its 5xx streak that cannot be
    ejected: half the fleet is (``maxEjectionPercent``), so each such answer asks whether there is room."""
    replicas = fleet(size)
    settings = HealthSettings()
    outliers = OutlierDetector(replicas, lambda: settings, lambda replica, reason: None)
    failing = replicas.replicas()
    for replica in failing[: size // 2]:
        replicas.eject(replica, 3600)
    failing = failing[size // 2:]
    for replica in failing:  # streaks at the limit already (the warning that a replica stays is logged there)
        replica.server_errors = settings.consecutive_5xx
    answers = [failing[i % len(failing)] for i in range(N)]

    def answer(_: int) -> None:
        for replica in answers:
            outliers.answered(replica, 503)
    return median_us(answer)


def per_count(size: int) -> float:
    """Microseconds per ``Metrics.observe`` of a 200, the requests going to every replica in turn (the first,
    untimed run: every replica asks for its label once)."""
    replicas = fleet(size)
    settings = RouterSettings()
    metrics = Metrics(Balancer(replicas, "affinity", LiveConfig()), replicas, lambda: settings, lambda: None,
                      time.monotonic)
    ids = [replica.id for replica in replicas.replicas()]
    answered = [ids[i % size] for i in range(N)]

    def count(_: int) -> None:
        for replica_id in answered:
            metrics.observe(replica_id, 200, 0.01)
    return median_us(count, warm=1)


def per_decision_new(policy: str, size: int) -> float:
    balancer = Balancer(fleet(size), policy, LiveConfig(margin=2, max_sessions=1_000_000))
    keys = [[f"n{run}-{i}" for i in range(N)] for run in range(5)]

    def decide(run: int) -> None:
        for key in keys[run]:
            balancer.acquire(key)[1].release()
    return median_us(decide)


if __name__ == "__main__":
    main()

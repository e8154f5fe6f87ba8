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

from rollout_router.balancer import Balancer
from rollout_router.health.outliers import OutlierDetector
from rollout_router.observability import Metrics
from rollout_router.policy import LiveConfig
from rollout_router.policy.registry import SELECTABLE
from rollout_router.replicas import ReplicaSet
from rollout_router.settings import HealthSettings, RouterSettings

SIZES = (16, 1024)
N = 20_000


def per_decision(policy: str, size: int, keys: list[str | None], down: bool = False) -> float:
    """Microseconds per decision, the median of five timed runs over ``keys`` (``down``: with every other replica
    marked down for longer than the runs take)."""
    replicas = ReplicaSet()
    for i in range(size):
        replicas.add(f"http://10.0.{i // 256}.{i % 256}:8000")
        if down and i % 2:
            replicas.mark_down(f"http://10.0.{i // 256}.{i % 256}:8000", 3600)
    balancer = Balancer(replicas, policy, LiveConfig(margin=2, max_sessions=1_000_000))
    for key in keys:  # warm: sticky hits find their pins
        balancer.acquire(key)[1].release()
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for key in keys:
            balancer.acquire(key)[1].release()
        runs.append((time.perf_counter() - started) / len(keys) * 1e6)
    return statistics.median(runs)


def main() -> None:
    cases: dict[str, list[str | None]] = {"sticky hit": [f"s{i % 256}" for i in range(N)], "unkeyed": [None] * N}
    print(f"{'policy':<18}{'request':<14}" + "".join(f"{f'{n} us':>10}" for n in SIZES) + f"{'ratio':>8}")
    for policy in SELECTABLE:  # every policy the router ships
        rows: dict[str, list[str | None]] = {**cases, "new session": [f"n{i}" for i in range(N)]}
        for name, keys in rows.items():
            if name == "new session":  # every key new in every run
                costs = [per_decision_new(policy, size) for size in SIZES]
            else:
                costs = [per_decision(policy, size, keys) for size in SIZES]
            print(f"{policy:<18}{name:<14}" + "".join(f"{c:>10.2f}" for c in costs) + f"{costs[-1] / costs[0]:>7.2f}x")
    costs = [per_decision("affinity", size, cases["sticky hit"], down=True) for size in SIZES]
    print(f"{'affinity':<18}{'half down':<14}" + "".join(f"{c:>10.2f}" for c in costs) + f"{costs[-1] / costs[0]:>7.2f}x")
    costs = [per_server_error(size) for size in SIZES]
    print(f"{'(health)':<18}{'5xx, cap full':<14}" + "".join(f"{c:>10.2f}" for c in costs) + f"{costs[-1] / costs[0]:>7.2f}x")
    costs = [per_count(size) for size in SIZES]
    print(f"{'(metrics)':<18}{'answered':<14}" + "".join(f"{c:>10.2f}" for c in costs) + f"{costs[-1] / costs[0]:>7.2f}x")


def per_server_error(size: int) -> float:
    """Microseconds per ``OutlierDetector.answered`` of a 503 from a replica past its 5xx streak that cannot be
    ejected: half the fleet is (``maxEjectionPercent``), so each such answer asks whether there is room."""
    replicas = ReplicaSet()
    for i in range(size):
        replicas.add(f"http://10.0.{i // 256}.{i % 256}:8000")
    settings = HealthSettings()
    outliers = OutlierDetector(replicas, lambda: settings, lambda replica, reason: None)
    failing = replicas.replicas()
    for replica in failing[: size // 2]:
        replicas.eject(replica, 3600)
    failing = failing[size // 2:]
    for replica in failing:  # streaks at the limit already (the warning that a replica stays is logged there)
        replica.server_errors = settings.consecutive_5xx
    answers = [failing[i % len(failing)] for i in range(N)]
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for replica in answers:
            outliers.answered(replica, 503)
        runs.append((time.perf_counter() - started) / N * 1e6)
    return statistics.median(runs)


def per_count(size: int) -> float:
    """Microseconds per ``Metrics.observe`` of a 200, the requests going to every replica in turn."""
    replicas = ReplicaSet()
    ids = [f"http://10.0.{i // 256}.{i % 256}:8000" for i in range(size)]
    for replica_id in ids:
        replicas.add(replica_id)
    settings = RouterSettings()
    metrics = Metrics(Balancer(replicas, "affinity", LiveConfig()), replicas, lambda: settings, lambda: None,
                      time.monotonic)
    answered = [ids[i % size] for i in range(N)]
    runs = []
    for _ in range(6):  # the first run warms: every replica asks for its label once
        started = time.perf_counter()
        for replica_id in answered:
            metrics.observe(replica_id, 200, 0.01)
        runs.append((time.perf_counter() - started) / N * 1e6)
    return statistics.median(runs[1:])


def per_decision_new(policy: str, size: int) -> float:
    replicas = ReplicaSet()
    for i in range(size):
        replicas.add(f"http://10.0.{i // 256}.{i % 256}:8000")
    balancer = Balancer(replicas, policy, LiveConfig(margin=2, max_sessions=1_000_000))
    runs = []
    for run in range(5):
        keys = [f"n{run}-{i}" for i in range(N)]
        started = time.perf_counter()
        for key in keys:
            balancer.acquire(key)[1].release()
        runs.append((time.perf_counter() - started) / N * 1e6)
    return statistics.median(runs)


if __name__ == "__main__":
    main()

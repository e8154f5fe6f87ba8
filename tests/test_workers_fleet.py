"""Router pods running ``serve --workers 2`` in one fleet (``--peer-selector``): each worker of each pod is a member.

Two stand-in pods (pod objects in the emulated API server, with the container ports ``fleet-0`` and ``fleet-1``
the operator renders; a router process on the pod's 127.x address plays each): every worker sees the four
members, whatever pod and worker a turn enters by it reaches its session's owner worker, so every turn of a
session lands on one replica, and the pods' /status documents add up to one router's counts.
"""
from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from rollout_router.localfleet import Service, spawn, spawn_replica, stop, wait_healthy
from tests.k8s.cluster import cluster  # noqa: F401  (fixture)
from tests.k8s.pods import add_pod
from tests.k8s.stack import loopback_address
from tests.support import wait_until
from tests.test_fleet import REPLICA_ARGS, quick_turn, status
from tests.test_multicore import worker_status
from tests.test_workers_peers import call

ADMIN = 18081  # each pod's --admin-port; its workers' admin ports are the two after it
LABELS = {"app": "rr-workers"}
SESSIONS, TURNS = 48, 3  # 48 keys over 4 owners: each owns some (all but once in ~10^5 runs)


@pytest.fixture
def pods(cluster, monkeypatch) -> Iterator[list[Service]]:
    """Two router pods of two workers each, in front of two replicas; stopped after the test."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    processes: list[subprocess.Popen] = []
    try:
        replicas = [wait_healthy(spawn_replica(i, REPLICA_ARGS, into=processes).bound(), "/health") for i in range(2)]
        hosts = [loopback_address() for _ in range(2)]
        for index, host in enumerate(hosts):
            add_pod(cluster, f"router-{index}", LABELS, host,
                    ports={"admin": ADMIN, "fleet-0": ADMIN + 1, "fleet-1": ADMIN + 2})
        starting = [spawn(["serve", "--workers", "2", "--log-level", "warning", "--admin-host", host,
                           "--admin-port", str(ADMIN), "--peer-selector", "app=rr-workers",
                           "--peer-namespace", cluster.namespace,
                           *(arg for replica in replicas for arg in ("--backend", replica.url))], host, into=processes)
                    for host in hosts]
        routers = [Service(s.bound(60).url, s.process, None, f"http://{host}:{ADMIN}")
                   for s, host in zip(starting, hosts)]
        yield [wait_healthy(router, "/readyz") for router in routers]
    finally:
        for process in processes:
            stop(process)


def members(pods: list[Service]) -> list[str]:
    """The workers' admin URLs, as the other pods find them (pod IP, ``fleet-<i>`` port)."""
    return [f"{pod.admin_url.rpartition(':')[0]}:{ADMIN + 1 + index}" for pod in pods for index in range(2)]


def test_every_worker_of_every_pod_is_a_member_and_each_session_stays_on_one_replica(pods):
    urls = members(pods)
    for url in urls:
        wait_until(lambda url=url: sorted(worker_status(url)["fleet"]["members"]) == sorted(urls),
                   f"{url} to see the 4 workers of the 2 pods")
    seen: dict[str, set[str | None]] = {}
    for turn in range(TURNS):
        for index in range(SESSIONS):  # each turn by the other pod than the last, on a new connection
            key = f"conversation-{index}"
            seen.setdefault(key, set()).add(quick_turn(pods[(index + turn) % 2], key).replica)
    assert all(len(replica) == 1 for replica in seen.values()), seen
    documents = [worker_status(url) for url in urls]
    assert all(d["sessions"] > 0 for d in documents), "every worker owns sessions"
    assert all(d["fleet"]["forwarded"] > 0 for d in documents), "every worker took turns it forwarded"
    public = [status(pod) for pod in pods]
    assert [p["workers"] for p in public] == [2, 2]
    assert sum(p["new_sessions"] for p in public) == SESSIONS
    assert sum(p["affinity_kept"] for p in public) == SESSIONS * (TURNS - 1)
    assert sum(p["total_inflight"] for p in public) == 0
    code, body = call(pods[0].admin_url, "GET", "/fleet/v1/info")  # the parent is no member: it says where they are
    assert code == 404 and "container port fleet-<i>" in body["error"]["message"], body

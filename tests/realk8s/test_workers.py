"""A router pod given two cores runs two router processes (``serve --workers 2``) that act as one router: the
operator's default when the CPU limit is above one core (docs/fleet.md, "Several cores"), without session
ownership and with it, where every worker of every router pod is a member of the pods' fleet. A real API server,
Deployment controller and scheduler; the node agent runs the pods.
"""
from __future__ import annotations

import pytest

from rollout_router.listening import address

from .cluster import eventually
from .test_fleet import fleet_totals, roll_routers, routers
from .workloads import chat, router_status, routers_serving, rr_table, vllm_fleet

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(600)]


def rollout_router(cpu: str, ownership: bool = False, pods: int = 1) -> dict:
    return {"apiVersion": "rolloutrouter.dev/v1alpha1", "kind": "RolloutRouter", "metadata": {"name": "rollouts"},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "affinityBreakMargin": 4,
                     "router": {"sessionOwnership": ownership, "replicas": pods,
                                "resources": {"limits": {"cpu": cpu, "memory": "1Gi"}}}}}


def test_a_router_pod_with_two_cores_runs_two_workers_that_act_as_one_router(cluster, operator_release, namespace):
    vllm_fleet(cluster, namespace, 3)
    cluster.apply(rollout_router("2"), namespace)
    [pod] = routers_serving(cluster, namespace, 3)
    command = pod["spec"]["containers"][0]["command"]
    assert command[command.index("--workers") + 1] == "2"
    assert router_status(pod)["workers"] == 2
    used = [chat(pod, f"conversation-{i}", turns=4) for i in range(8)]  # each turn a connection of its own
    assert all(len(set(replicas)) == 1 for replicas in used), used  # one router's pins, whichever worker
    status = router_status(pod)
    assert status["affinity_kept"] == 8 * 3 and status["affinity_broken"] == 0 and status["total_inflight"] == 0
    table = eventually(lambda: (lambda t: t if t.get("KEPT") == "24" else None)(rr_table(cluster, namespace)),
                       60, "kubectl get rr shows the two workers' kept turns summed")
    assert table["READY"] == "1/1" and table["BACKENDS"] == "3/3"


def test_two_router_pods_of_two_workers_each_are_one_fleet_of_four(cluster, operator_release, namespace):
    vllm_fleet(cluster, namespace, 3)
    cluster.apply(rollout_router("2", ownership=True, pods=2), namespace)
    pods = routers_serving(cluster, namespace, 3, routers=2)
    container = pods[0]["spec"]["containers"][0]
    assert container["command"][container["command"].index("--workers") + 1] == "2"
    assert "--peer-selector" in container["command"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}.items() >= {"fleet-0": 8082,
                                                                                 "fleet-1": 8083}.items()
    wait_for_four(pods)
    used: dict[str, set[str]] = {}
    for turn in range(4):  # each turn by the other pod, on a connection of its own
        for index in range(8):
            used.setdefault(f"conversation-{index}", set()).update(chat(pods[(index + turn) % 2], f"conversation-{index}",
                                                                        turns=1))
    assert all(len(replicas) == 1 for replicas in used.values()), used
    statuses = [router_status(pod) for pod in pods]
    assert [s["workers"] for s in statuses] == [2, 2]
    assert sum(s["affinity_kept"] for s in statuses) == 8 * 3 and sum(s["new_sessions"] for s in statuses) == 8
    assert sum(s["fleet"]["forwarded"] for s in statuses) > 0 and sum(s["total_inflight"] for s in statuses) == 0
    eventually(lambda: (lambda t: t if t.get("KEPT") == "24" else None)(rr_table(cluster, namespace)),
               60, "kubectl get rr shows the four workers' kept turns summed")
    pins = {key: replicas.pop() for key, replicas in used.items()}

    # A rolling update: each pod's workers leave together and hand their pins to the other pods' workers (never
    # to each other), so every session keeps its replica on the new pods and none is placed anew.
    roll_routers(cluster, namespace)
    new = eventually(lambda: (lambda p: p if len(p) == 2 else None)(routers(cluster, namespace)), 120,
                     "two ready router pods")
    assert not {p["metadata"]["uid"] for p in new} & {p["metadata"]["uid"] for p in pods}
    wait_for_four(new)
    after = {key: chat(new[index % 2], key, turns=1)[0] for index, key in enumerate(pins)}
    totals = fleet_totals(new)
    print(f"\nrolling update of pods of workers: the new pods' counters {totals}")
    assert after == pins, (after, pins)
    assert totals["replaced"] == 0 and totals["handoffs"] >= len(pins), totals


def wait_for_four(pods: list[dict]) -> None:
    """Until each pod's workers see the 2 pods' 4 workers, by the ids the pods' fleet-<i> ports give them."""
    members = sorted(f"http://{address(p['status']['podIP'], port)}" for p in pods for port in (8082, 8083))
    for pod in pods:
        eventually(lambda pod=pod: sorted(router_status(pod)["fleet"]["members"]) == members, 60,
                   "each pod's workers see the 4 workers of the 2 pods")

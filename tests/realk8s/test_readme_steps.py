"""The README's Kubernetes steps, typed as a user would, against a real API server.

Helm installs the operator (a pod with the chart's ServiceAccount and RBAC); a vLLM Deployment of
fake replicas runs on the node agent; ``kubectl apply -f docs/examples/rolloutrouter.yaml`` makes the
operator create the router, whose pod the Deployment controller and scheduler place; traffic goes
through the router pod with the openai client. Each test has its own namespace.
"""
from __future__ import annotations

import json
import os
import signal

import pytest

from rollout_router.advice import MARGIN

from .cluster import eventually
from .workloads import ROUTER_SELECTOR, chat, deploy_rollouts, router_status, rr_table

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(600)]


def test_kubectl_get_rr_prints_the_routers_real_counters(cluster, operator_release, namespace):
    router = deploy_rollouts(cluster, namespace)
    replicas = [chat(router, f"conversation-{i}", turns=4) for i in range(6)]
    assert all(len(set(used)) == 1 for used in replicas), replicas  # the advised margin, light load: every pin kept
    status = router_status(router)
    assert status["affinity_kept"] == 6 * 3 and status["total_inflight"] == 0  # 3 sticky turns per conversation
    table = eventually(lambda: (lambda t: t if t.get("KEPT") == "18" else None)(rr_table(cluster, namespace)),
                       60, "kubectl get rr shows the router's kept counter")
    print("\n" + cluster.kubectl("get", "rr", "-n", namespace).stdout)
    assert table["MARGIN"] == str(MARGIN) and table["BACKENDS"] == "3/3" and table["READY"] == "1/1"
    assert table["BROKEN"] == str(status["affinity_broken"]) == "0"


def test_margin_patch_reaches_the_running_router_and_keeps_its_pins(cluster, operator_release, namespace):
    router = deploy_rollouts(cluster, namespace)
    sessions = {f"pinned-{i}": chat(router, f"pinned-{i}", turns=2)[-1] for i in range(8)}
    cluster.kubectl("patch", "rr", "rollouts", "-n", namespace, "--type=merge",
                    "-p", json.dumps({"spec": {"affinityBreakMargin": 7}}))
    eventually(lambda: router_status(router)["affinity_break_margin"] == 7, 60, "router applies margin 7")
    after = cluster.ready_pods(namespace, ROUTER_SELECTOR)
    assert [p["metadata"]["uid"] for p in after] == [router["metadata"]["uid"]]  # no new pod
    assert after[0]["status"]["containerStatuses"][0]["restartCount"] == 0
    assert {s: chat(router, s, turns=1)[0] for s in sessions} == sessions  # every pin survived the reload
    assert rr_table(cluster, namespace)["MARGIN"] == "7"


def test_discovery_follows_scaling_unready_pods_and_router_pod_deletion(cluster, operator_release, namespace):
    router = deploy_rollouts(cluster, namespace)
    cluster.kubectl("scale", "deployment/vllm", "-n", namespace, "--replicas=4")
    eventually(lambda: router_status(router)["backends_ready"] == 4, 90, "router sees the 4th replica")
    cluster.kubectl("scale", "deployment/vllm", "-n", namespace, "--replicas=2")
    eventually(lambda: len(router_status(router)["backends"]) == 2, 90, "router drops the removed replicas")
    # A hung replica: its readiness probe times out, the pod turns unready, the router stops using it.
    hung = cluster.ready_pods(namespace, "app=vllm")[0]
    pid = int(hung["status"]["containerStatuses"][0]["containerID"].removeprefix("process://"))
    os.kill(pid, signal.SIGSTOP)
    try:
        eventually(lambda: router_status(router)["backends_ready"] == 1, 60, "router drops the unready replica")
        assert hung["status"]["podIP"] not in json.dumps([b for b in router_status(router)["backends"] if b["ready"]])
        assert all(len(set(chat(router, f"after-hang-{i}", turns=2))) == 1 for i in range(3))
    finally:
        os.kill(pid, signal.SIGCONT)
    eventually(lambda: router_status(router)["backends_ready"] == 2, 60, "the replica is back once it answers")
    assert router_status(router)["total_inflight"] == 0
    # Delete the router pod: the Deployment makes a new one, which finds the fleet on its own.
    cluster.kubectl("delete", "pod", router["metadata"]["name"], "-n", namespace, "--wait=true")
    new = cluster.wait_ready_pods(namespace, ROUTER_SELECTOR, 1, timeout=120)[0]
    assert new["metadata"]["uid"] != router["metadata"]["uid"]
    eventually(lambda: router_status(new)["backends_ready"] == 2, 60, "the new router sees both replicas")
    chat(new, "on-the-new-router", turns=2)
    assert router_status(new)["total_inflight"] == 0


def test_kubectl_delete_rr_removes_every_child(cluster, operator_release, namespace):
    deploy_rollouts(cluster, namespace)
    kinds = "deployment,replicaset,pod,service,configmap,serviceaccount,role,rolebinding"
    children = cluster.get(kinds, "-n", namespace, "-l", "app.kubernetes.io/instance=rollouts")["items"]
    assert {c["kind"] for c in children} >= {"Deployment", "ReplicaSet", "Pod", "Service", "ConfigMap",
                                              "ServiceAccount", "Role", "RoleBinding"}
    cluster.kubectl("delete", "rr", "rollouts", "-n", namespace, "--wait=true")
    eventually(lambda: not cluster.get(kinds, "-n", namespace, "-l", "app.kubernetes.io/instance=rollouts")["items"],
               120, "every child of the RolloutRouter is gone")
    assert len(cluster.ready_pods(namespace, "app=vllm")) == 3  # the fleet is not the router's


def test_garbage_collector_alone_removes_the_children(cluster, operator_release, namespace):
    """With the operator stopped and the finalizer removed, only the real GC can delete the children."""
    deploy_rollouts(cluster, namespace)
    cluster.kubectl("scale", "deployment", "-n", operator_release, "-l", "app.kubernetes.io/component=operator",
                    "--replicas=0")
    try:
        eventually(lambda: not cluster.get("pods", "-n", operator_release, "-l",
                                           "app.kubernetes.io/component=operator")["items"], 120, "operator stopped")
        cluster.kubectl("patch", "rr", "rollouts", "-n", namespace, "--type=merge",
                        "-p", '{"metadata":{"finalizers":null}}')
        cluster.kubectl("delete", "rr", "rollouts", "-n", namespace)
        kinds = "deployment,replicaset,pod,service,configmap,serviceaccount,role,rolebinding"
        eventually(lambda: not cluster.get(kinds, "-n", namespace, "-l", "app.kubernetes.io/instance=rollouts")["items"],
                   120, "the garbage collector deletes every child")
    finally:
        cluster.kubectl("scale", "deployment", "-n", operator_release, "-l", "app.kubernetes.io/component=operator",
                        "--replicas=1")
        cluster.wait_ready_pods(operator_release, "app.kubernetes.io/component=operator", 1)

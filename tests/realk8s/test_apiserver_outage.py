"""The API server away while traffic flows, on the real control plane (issue 10).

Two ways it goes away: restarted (SIGTERM, refused connections, started again with the same flags; etcd
keeps the state), and unreachable for minutes (SIGSTOP: the kernel still accepts connections but nothing
answers, so every client's request and watch hangs; SIGCONT afterwards). Throughout, the routers keep
serving with their discovered replicas and pins and the operator keeps serving its metrics; afterwards
the same pods (never restarted) resume: the routers' watches see a scale-up, the operator reconciles a
patch, and ``kubectl get rr`` shows the routers' counters again. The emulator tier injects the finer
faults (500/503/429, conflicts, dropped watches: tests/test_operator_faults.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.request
from collections.abc import Iterator

import pytest

from .cluster import eventually
from .controlplane import ControlPlane
from .workloads import ROUTER_SELECTOR, chat, deploy_rollouts, router_status, rr_table

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(900)]
OPERATOR = "app.kubernetes.io/component=operator"
RESTART_SECONDS = 10.0  # traffic while the API server is down, before it is started again
UNREACHABLE_SECONDS = float(os.environ.get("REALK8S_OUTAGE_SECONDS", "120"))


@contextlib.contextmanager
def api_server_away(plane: ControlPlane, how: str) -> Iterator[None]:
    if how == "restart":
        plane.stop_apiserver()
        try:
            yield
        finally:
            plane.start_apiserver()
    else:
        plane.freeze_apiserver(True)
        try:
            yield
        finally:
            plane.freeze_apiserver(False)


def traffic_for(router: dict, pins: dict[str, str], seconds: float) -> int:
    """Rounds of one turn per pinned session until ``seconds`` have passed; every turn stays on its pin."""
    deadline, rounds = time.monotonic() + seconds, 0
    while rounds == 0 or time.monotonic() < deadline:
        assert {session: chat(router, session, turns=1)[0] for session in pins} == pins
        rounds += 1
    return rounds


def operator_metrics(pod: dict) -> str:
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8080/metrics", timeout=5) as response:
        return response.read().decode()


def same_pod_never_restarted(cluster, pod: dict, selector: str) -> bool:
    """The pod is the only ready one of ``selector``, the same object, its container never restarted."""
    pods = cluster.ready_pods(pod["metadata"]["namespace"], selector)
    return ([p["metadata"]["uid"] for p in pods] == [pod["metadata"]["uid"]]
            and pods[0]["status"]["containerStatuses"][0]["restartCount"] == 0)


@pytest.mark.parametrize("how, seconds", [("restart", RESTART_SECONDS), ("unreachable", UNREACHABLE_SECONDS)])
def test_routers_and_operator_ride_out_the_api_server_going_away(cluster, operator_release, namespace, how,
                                                                 seconds):
    router = deploy_rollouts(cluster, namespace)
    operator = cluster.wait_ready_pods(operator_release, OPERATOR, 1)[0]
    pins = {f"{how}-{i}": chat(router, f"{how}-{i}", turns=2)[-1] for i in range(6)}
    kept_before = router_status(router)["affinity_kept"]

    with api_server_away(cluster.plane, how):
        started = time.monotonic()
        rounds = traffic_for(router, pins, seconds)
        during = router_status(router)
        assert during["backends_ready"] == 3 and len(during["backends"]) == 3  # discovered replicas kept
        assert "rolloutrouter_operator_reconciles_total" in operator_metrics(operator)  # the operator still serves
        print(f"\nAPI server {how}: {rounds} rounds of {len(pins)} sessions in {time.monotonic() - started:.0f} s")

    cluster.plane.check_alive()
    assert router_status(router)["affinity_kept"] == kept_before + rounds * len(pins)
    # The node agent writes pod status again; nothing was restarted or replaced.
    eventually(lambda: same_pod_never_restarted(cluster, router, ROUTER_SELECTOR), 90, "the same router pod")
    eventually(lambda: same_pod_never_restarted(cluster, operator, OPERATOR), 90, "the same operator pod")
    # The router's pod watch resumed: it sees a new replica.
    cluster.kubectl("scale", "deployment/vllm", "-n", namespace, "--replicas=4")
    eventually(lambda: router_status(router)["backends_ready"] == 4, 120, "the router sees the 4th replica")
    # The operator's watch resumed: it reconciles a patch, which reaches the running router.
    cluster.kubectl("patch", "rr", "rollouts", "-n", namespace, "--type=merge",
                    "-p", json.dumps({"spec": {"affinityBreakMargin": 7}}))
    eventually(lambda: router_status(router)["affinity_break_margin"] == 7, 120, "the router applies margin 7")
    assert traffic_for(router, pins, 0) == 1  # the pins survived all of it
    # The operator's status updates resumed: kubectl get rr shows the router's counters as they are now.
    kept = router_status(router)["affinity_kept"]
    table = eventually(lambda: (lambda t: t if t["KEPT"] == str(kept) else None)(rr_table(cluster, namespace)), 90,
                       f"kubectl get rr shows KEPT {kept}")
    assert table["MARGIN"] == "7" and table["BACKENDS"] == "4/4" and table["READY"] == "1/1"
    assert router_status(router)["total_inflight"] == 0

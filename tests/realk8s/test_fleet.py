"""Many router pods as one router on the real control plane (issue 11): ``router.replicas: 3`` with session
ownership (the default), a rolling update of the routers under traffic, and a router pod deleted.

The checks of the quick tier (tests/test_fleet.py), made here through the router pods the Deployment runs:
whichever pod a turn enters by, the session's owner decides it, so every session keeps its replica and the
pods' counters add up to a single router's; a pod that is stopped (a rolling update, a deleted pod) leaves the
fleet first and hands its pins to the pods that stay, so no session is placed anew (``replaced`` stays 0) and
the handoffs cover every session of the pods that left. No kube-proxy runs, so the client picks a ready router
pod itself, as the Service would, and tries another one if the pod it picked is going away.
"""
from __future__ import annotations

import hashlib
import json
import threading

import openai
import pytest

from rollout_router.fleet.ownership import owner

from .cluster import eventually
from .workloads import ROUTER_SELECTOR, chat, deploy_rollouts, router_admin_url, router_status

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(900)]
SESSIONS = [f"fleet-{i}" for i in range(18)]
FLEET = ("forwarded", "handoffs", "ownerUnreachable", "replaced", "lookups")


def routers(cluster, namespace: str) -> list[dict]:
    return sorted(cluster.ready_pods(namespace, ROUTER_SELECTOR), key=lambda p: p["metadata"]["name"])


def converged(cluster, namespace: str, count: int) -> list[dict]:
    """``count`` ready router pods, each of which has exactly those pods as its fleet's members."""
    def check() -> list[dict] | None:
        pods = routers(cluster, namespace)
        ids = sorted(router_admin_url(p) for p in pods)
        if len(pods) == count and all(sorted(router_status(p)["fleet"]["members"]) == ids for p in pods):
            return pods
        return None
    return eventually(check, 120, f"{count} router pods that agree on their members")


def turn(cluster, namespace: str, session: str, entry: int) -> str:
    """One turn entering by the ``entry``-th ready router pod (the next one if that pod is going away)."""
    for _ in range(5):
        pods = routers(cluster, namespace)
        try:
            return chat(pods[entry % len(pods)], session, turns=1)[0]
        except (openai.APIConnectionError, openai.InternalServerError):
            entry += 1  # a pod that stopped: the Service would have sent the next connection elsewhere
    raise AssertionError(f"session {session}: no router pod took the turn")


def roll_routers(cluster, namespace: str) -> None:
    """A rolling update of the ``rollouts`` router pods (a new pod annotation), waited for to its end."""
    cluster.kubectl("patch", "rr", "rollouts", "-n", namespace, "--type=merge",
                    "-p", json.dumps({"spec": {"router": {"podAnnotations": {"rolled": "1"}}}}))
    # The operator applies the new template in its own time: wait for it before waiting for the rollout.
    eventually(lambda: (cluster.get("deployment", "rollouts-router", "-n", namespace)["spec"]["template"]
                        ["metadata"].get("annotations") or {}).get("rolled") == "1", 60,
               "the operator to apply the new pod template")
    cluster.kubectl("rollout", "status", "deployment/rollouts-router", "-n", namespace, "--timeout=300s")


def fleet_totals(pods: list[dict]) -> dict[str, int]:
    statuses = [router_status(p) for p in pods]
    totals = {name: sum(s["fleet"][name] for s in statuses) for name in FLEET}
    totals["affinity_kept"] = sum(s["affinity_kept"] for s in statuses)
    totals["total_inflight"] = sum(s["total_inflight"] for s in statuses)
    return totals


def test_three_router_pods_act_as_one_through_a_rolling_update_and_a_deleted_pod(cluster, operator_release,
                                                                                    namespace):
    deploy_rollouts(cluster, namespace, routers=3)
    pods = converged(cluster, namespace, 3)
    # Three pods are one router: each session's turns enter by every pod in turn and stay on one replica.
    pins = {s: turn(cluster, namespace, s, i) for i, s in enumerate(SESSIONS)}
    for rotation in (1, 2):
        assert {s: turn(cluster, namespace, s, i + rotation) for i, s in enumerate(SESSIONS)} == pins
    totals = fleet_totals(pods)
    assert totals["affinity_kept"] == 2 * len(SESSIONS)  # a single router's count, summed over the pods
    assert totals["forwarded"] > 0 and totals["ownerUnreachable"] == totals["replaced"] == 0
    assert totals["total_inflight"] == 0
    eventually(lambda: cluster.get("rr", "rollouts", "-n", namespace)["status"].get("fleet", {}).get("forwarded")
               == totals["forwarded"], 60, "status.fleet sums the pods' forwarded counts")

    # A rolling update of the routers (a new pod template), with sessions sending turns all along.
    results: list[tuple[str, str]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def traffic() -> None:
        rounds = 0
        while not done.is_set() and rounds < 200:
            try:
                results.extend((s, turn(cluster, namespace, s, i + rounds)) for i, s in enumerate(SESSIONS))
            except (AssertionError, OSError, openai.OpenAIError) as error:
                errors.append(error)
                return
            rounds += 1

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        roll_routers(cluster, namespace)
        new = converged(cluster, namespace, 3)
    finally:
        done.set()
        worker.join(timeout=300)
    assert not worker.is_alive() and not errors, errors  # every turn during the update was answered
    assert not {p["metadata"]["uid"] for p in new} & {p["metadata"]["uid"] for p in pods}  # every pod replaced
    changed = {s for s, replica in results if replica != pins[s]}
    rolled = fleet_totals(new)
    print(f"\nrolling update: {len(results)} turns, {len(changed)} of {len(SESSIONS)} sessions re-placed; "
          f"the new pods' counters {rolled}")
    assert not changed, changed  # every turn during the update went to its session's replica
    # The resource's sums never go backwards: the old pods' counts stay in them (status.ledger).
    eventually(lambda: cluster.get("rr", "rollouts", "-n", namespace)["status"]["affinity"]["kept"]
               >= totals["affinity_kept"] + rolled["affinity_kept"], 60,
               "status.affinity.kept to keep the replaced pods' counts beside the new pods'")
    # Each old pod handed its pins over as it left: every session reached a new pod by a handoff, none anew.
    assert rolled["replaced"] == 0 and rolled["handoffs"] >= len(SESSIONS), rolled
    assert {s: turn(cluster, namespace, s, i + 1) for i, s in enumerate(SESSIONS)} == pins  # the new pods agree

    # A router pod deleted: it leaves the fleet, its sessions go to the others with their pins; the Deployment
    # replaces it, and the new pod takes its sessions from the others.
    victim = new[0]
    ids = [router_admin_url(p) for p in new]
    doomed = {s for s in SESSIONS if owner(s, ids) == router_admin_url(victim)}
    before = fleet_totals(new[1:])
    cluster.kubectl("delete", "pod", victim["metadata"]["name"], "-n", namespace, "--wait=true")
    after_pods = converged(cluster, namespace, 3)
    after = {s: turn(cluster, namespace, s, i) for i, s in enumerate(SESSIONS)}
    moved = {s for s in SESSIONS if after[s] != pins[s]}
    totals = fleet_totals(after_pods)
    survivors = [p for p in after_pods if p["metadata"]["uid"] in {q["metadata"]["uid"] for q in new[1:]}]
    replaced, handoffs = totals["replaced"] - before["replaced"], totals["handoffs"] - before["handoffs"]
    print(f"router pod deleted: {len(doomed)} of its sessions, {len(moved)} re-placed elsewhere; "
          f"replaced counted {replaced}, handoffs {handoffs}; the pods' counters {totals}")
    assert doomed and not moved, moved  # every session kept its replica, the deleted pod's too
    assert replaced == 0 and handoffs >= len(doomed)
    assert len(survivors) == 2 and totals["total_inflight"] == 0


def entry_pod(session: str, pods: list[dict]) -> dict:
    """The pod a front end hashing X-Session-ID consistently sends ``session`` to (its own hash of pod names)."""
    return max(pods, key=lambda p: hashlib.sha256(f"{p['metadata']['name']} {session}".encode()).digest())


def test_entry_ownership_pods_forward_nothing_and_pins_follow_the_entry_pod(cluster, operator_release, namespace):
    """``sessionOwner: Entry`` behind a hashing front end (the client hashes each session to a pod): nothing is
    forwarded, and when a pod is deleted the sessions that enter elsewhere bring their pins along."""
    deploy_rollouts(cluster, namespace, routers=3)
    cluster.kubectl("patch", "rr", "rollouts", "-n", namespace, "--type=merge",
                    "-p", json.dumps({"spec": {"router": {"sessionOwner": "Entry"}}}))
    eventually(lambda: "--ownership" in cluster.get("deployment", "rollouts-router", "-n", namespace)["spec"]
               ["template"]["spec"]["containers"][0]["command"], 60, "the operator to render --ownership entry")
    cluster.kubectl("rollout", "status", "deployment/rollouts-router", "-n", namespace, "--timeout=300s")
    pods = converged(cluster, namespace, 3)
    assert all(router_status(p)["fleet"]["ownership"] == "entry" for p in pods)
    pins = {s: chat(entry_pod(s, pods), s, turns=2)[0] for s in SESSIONS}
    assert {s: chat(entry_pod(s, pods), s, turns=1)[0] for s in SESSIONS} == pins
    totals = fleet_totals(pods)
    assert totals["forwarded"] == totals["handoffs"] == totals["ownerUnreachable"] == totals["replaced"] == 0
    assert totals["lookups"] == len(SESSIONS) and totals["affinity_kept"] == 2 * len(SESSIONS)

    victim = pods[0]
    moved = {s for s in SESSIONS if entry_pod(s, pods) is victim}
    cluster.kubectl("delete", "pod", victim["metadata"]["name"], "-n", namespace, "--wait=true")
    after_pods = converged(cluster, namespace, 3)
    after = {s: chat(entry_pod(s, after_pods), s, turns=1)[0] for s in SESSIONS}
    totals = fleet_totals(after_pods)
    print(f"entry ownership, router pod deleted: {len(moved)} of its sessions; the pods' counters {totals}")
    assert moved and after == pins  # every session kept its replica, the deleted pod's too
    assert totals["replaced"] == totals["ownerUnreachable"] == 0 and totals["handoffs"] >= len(moved)
    survivors = [p for p in after_pods if p["metadata"]["uid"] in {q["metadata"]["uid"] for q in pods[1:]}]
    assert len(survivors) == 2 and all(router_status(p)["fleet"]["forwarded"] == 0 for p in survivors)
    assert totals["total_inflight"] == 0

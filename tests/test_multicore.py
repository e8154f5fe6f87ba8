"""``serve --workers 2``: two router processes behind one port act as one router (real processes, loopback).

The kernel spreads connections over the workers (SO_REUSEPORT); each session key has one owner worker, which
the other asks for the replica of each of its turns (or, when it cannot ask, relays the turn through), and each
worker's margin sees the other's requests in flight. The public admin
port answers for both; SIGTERM drains both and leaves no process.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from rollout_router import listening
from rollout_router.localfleet import Service, command, spawn, spawn_replica, stop, wait_healthy
from rollout_router.multicore_admin import rl_summed, summed, summed_metrics
from rollout_router_operator.status import parse_report
from tests.support import wait_until
from tests.test_fleet import (
    REPLICA_ARGS,
    Turn,
    fleet_load,
    grpc_replicas,  # noqa: F401  (a fixture)
    grpc_turn,
    quick_turn,
    status,
)
from tests.test_workers_peers import call

SESSIONS, TURNS = 16, 4


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[Service]]:
    processes: list[subprocess.Popen] = []
    try:
        starting = [spawn_replica(index, REPLICA_ARGS, into=processes) for index in range(2)]
        yield [wait_healthy(s.bound(), "/health") for s in starting]
    finally:
        for process in processes:
            stop(process)


@pytest.fixture
def router(replicas: list[Service]) -> Iterator[Service]:
    """``serve --workers 2`` in front of the replicas; stopped after the test."""
    processes: list[subprocess.Popen] = []
    try:
        yield start([arg for replica in replicas for arg in ("--backend", replica.url)], processes)
    finally:
        for process in processes:
            stop(process)


def start(args: list[str], processes: list[subprocess.Popen]) -> Service:
    """``serve --workers 2 ARGS``, recorded in ``processes`` before it can be interrupted; once every worker is
    ready (the public admin port's /readyz: the traffic port's is the one worker a connection reaches, which
    can see its sibling before the sibling sees it)."""
    starting = spawn(["serve", "--workers", "2", "--log-level", "warning", *args], "127.0.0.1", into=processes)
    router = wait_healthy(starting.bound(60), "/readyz")
    assert router.admin_url is not None
    wait_until(lambda: call(router.admin_url, "GET", "/readyz")[0] == 200, "every worker ready")
    return router


def workers(router: Service) -> list[str]:
    """The workers' own admin URLs: the fleet members the public /status names."""
    members = status(router)["fleet"]["members"]
    assert len(members) == 2, members
    return members


def worker_status(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/status", timeout=5) as answer:
        return json.load(answer)


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listing:
        return [int(child) for child in listing.read().split()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def test_every_turn_of_a_session_stays_on_one_replica_whichever_worker_it_enters(router):
    urls = workers(router)
    opening = open_decision_channels(router, urls)
    before = status(router)
    seen: dict[str, set[str | None]] = {}
    for _ in range(TURNS):
        for index in range(SESSIONS):  # a new connection per turn: the kernel picks a worker each time
            key = f"conversation-{index}"
            seen.setdefault(key, set()).add(quick_turn(router, key).replica)
    assert all(len(replica) == 1 for replica in seen.values()), seen
    documents = [worker_status(url) for url in urls]
    assert all(d["sessions"] > 0 for d in documents), "both workers own sessions"
    public = status(router)
    assert public["workers"] == 2 and public["sessions"] == SESSIONS + opening
    assert public["new_sessions"] == SESSIONS + opening and public["affinity_kept"] == SESSIONS * (TURNS - 1)
    assert public["fleet"]["delegated"] == sum(d["fleet"]["delegated"] for d in documents)
    assert public["fleet"]["delegated"] > before["fleet"]["delegated"], "turns their sibling decided"
    report = parse_report(json.dumps(public).encode())  # what the operator's status sums per pod
    assert (report["new_sessions"], report["affinity_kept"]) == (SESSIONS + opening, SESSIONS * (TURNS - 1))
    path, earlier = public["data_path"], before["data_path"]
    if path["http"] == "native":  # each worker's lane sent every turn, its own and those its sibling decided
        # (a lane counts a request once its answer has ended, which the client may see a moment before)
        path = wait_until(lambda: (lambda now: now if now["lane_requests"] - earlier["lane_requests"] ==
                                   SESSIONS * TURNS else None)(status(router)["data_path"]),
                          "every turn counted by the workers' lanes", timeout=5)
        assert path["lane_handovers"] == earlier["lane_handovers"], (earlier, path)
        # a kept turn entering its owner worker is a sticky hit its lane routes in C (the fleet's decided_here)
        assert path["lane_sticky"]["routed"] > earlier["lane_sticky"]["routed"], (earlier, path)


def open_decision_channels(router: Service, urls: list[str]) -> int:
    """One-turn sessions until each worker has sent a turn its sibling decided: a worker opens its channel to
    the sibling on the first such turn, which it relays meanwhile (``DecisionClient``). Returns how many."""
    opened = 0

    def both_asked() -> bool:
        nonlocal opened
        quick_turn(router, f"opening-{opened}")
        opened += 1
        return all(worker_status(url)["fleet"]["delegated"] > 0 for url in urls)
    wait_until(both_asked, "both workers' decision channels open")
    return opened


def test_a_session_released_at_the_public_admin_port_is_gone_from_both_workers(router):
    keys = [f"finished-{index}" for index in range(8)]
    for key in keys:
        quick_turn(router, key)
    assert all(worker_status(url)["sessions"] > 0 for url in workers(router)), "both workers own sessions"
    for key in keys:
        code, answer = call(router.admin_url, "DELETE", f"/v1/sessions/{key}")
        assert code == 200 and isinstance(answer, dict) and list(answer["routers"].values()).count("released") == 1
    public = status(router)
    assert public["sessions"] == 0 and public["released"] == len(keys)
    assert call(router.admin_url, "DELETE", f"/v1/sessions/{keys[0]}")[0] == 404


def test_a_worker_is_not_ready_before_it_sees_its_sibling(replicas):
    """Ready alone, a worker would relay a key its sibling owns: the key's next turn, entering the sibling, would
    go to the owner's replica and the session would sit on two. So its /readyz waits for the sibling."""
    admins = [listening.bound_socket("127.0.0.1", 0, reuse_port=True) for _ in range(2)]  # held, as the parent does
    urls = [f"http://127.0.0.1:{sock.getsockname()[1]}" for sock in admins]
    processes: list[subprocess.Popen] = []

    def worker(index: int) -> None:
        spawn(["serve", "--worker", "--log-level", "warning", "--admin-port", urls[index].rpartition(":")[2],
               "--advertise", urls[index], "--peer", urls[1 - index],
               *(arg for replica in replicas for arg in ("--backend", replica.url))], "127.0.0.1", into=processes
              ).bound(60)

    try:
        worker(0)
        code, body = call(urls[0], "GET", "/readyz")
        assert code == 503 and "sees 1 of the 2 workers" in body["error"]["message"], body
        worker(1)
        for url in urls:
            wait_until(lambda url=url: call(url, "GET", "/readyz")[0] == 200, f"{url} ready once it sees its sibling")
            assert len(worker_status(url)["fleet"]["members"]) == 2
    finally:
        for process in processes:
            stop(process)
        for sock in admins:
            sock.close()


def test_each_workers_margin_sees_the_others_requests_in_flight(router):
    urls = workers(router)
    held = [Turn(router, f"held-{index}") for index in range(8)]
    assert all(turn.status == 200 for turn in held)
    local = wait_until(lambda: [sum(b["inflight"] for b in worker_status(u)["backends"]) for u in urls],
                       "the held turns counted")
    assert sum(local) == len(held) and all(local), local  # each worker relays those of the keys it owns
    for url in urls:  # and each counts the other's too: its policy's fleet-wide load
        wait_until(lambda url=url: fleet_load(Service(router.url, router.process, None, url)) == len(held),
                   f"{url} to see {len(held)} in flight")
    for turn in held:
        turn.release()
    for url in urls:  # told how each ended, the owner released its lease: nothing stays counted in flight
        wait_until(lambda url=url: sum(b["inflight"] for b in worker_status(url)["backends"]) == 0,
                   f"{url}'s leases released")


def test_sigterm_drains_both_workers_and_leaves_no_process(router):
    pids = children(router.process.pid)
    assert len(pids) == 2
    turn = Turn(router, "drained", max_tokens=40)  # about a second of decoding at 20 ms a step
    assert turn.status == 200
    router.process.send_signal(signal.SIGTERM)
    body = turn.finish()
    turn.release()
    assert body.rstrip().endswith(b"data: [DONE]"), body[-300:]  # the turn in flight finished
    assert router.process.wait(timeout=40) == 0
    assert not any(alive(pid) for pid in pids)


def test_sigint_stops_both_workers_at_once_and_leaves_no_process(router):
    pids = children(router.process.pid)
    router.process.send_signal(signal.SIGINT)  # the parent alone, as a supervisor would; Ctrl-C signals all
    assert router.process.wait(timeout=40) == 0
    assert not any(alive(pid) for pid in pids)


def test_workers_refuse_the_config_files_fleet_section(tmp_path):
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"fleet": {"peers": []}}))
    done = subprocess.run([*command("serve", "--workers", "2", "--config", str(config))], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("rollout-router serve: --workers 2: cannot be combined with the config's fleet "
                                   "section (each worker is a router of its own to the fleet; docs/fleet.md, "
                                   "'Several cores'): use --peer-selector, or --workers 1")


def test_a_busy_admin_port_is_one_line_before_any_worker_starts():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(command("serve", "--workers", "2", "--port", "0", "--admin-port", str(port)),
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"rollout-router serve: --admin-port {port}: cannot listen on "
                                                f"127.0.0.1:{port}: already in use (another process listens there; "
                                                "pick another port, or 0 for any)"]


def test_a_worker_that_dies_takes_the_pod_down(router):
    first, second = children(router.process.pid)
    os.kill(first, signal.SIGKILL)
    assert router.process.wait(timeout=40) == 1  # never silently serving on fewer cores
    assert not alive(second)


def test_grpc_calls_of_a_session_stay_on_one_replica_whichever_worker_they_enter(grpc_replicas):
    processes: list[subprocess.Popen] = []
    try:
        router = start([*(a for r in grpc_replicas for a in ("--backend", r.backend)), "--grpc-port", "0"], processes)
        seen = {f"grpc-{index}": {grpc_turn(router, f"grpc-{index}") for _ in range(3)} for index in range(12)}
        assert all(len(replicas) == 1 for replicas in seen.values()), seen  # a new channel (connection) per call
        # each worker sent some call on to its sibling, the owner (counted once the relayed call has ended, which
        # can be just after the client read its last message)
        fleets: dict[str, dict] = {}

        def both_forwarded() -> bool:
            fleets.update({url: worker_status(url)["fleet"] for url in workers(router)})
            return all(fleet["forwarded"] > 0 for fleet in fleets.values())

        try:
            wait_until(both_forwarded, "both workers to have forwarded a call to their sibling", timeout=10)
        except AssertionError:
            raise AssertionError(fleets) from None
    finally:
        for process in processes:
            stop(process)


def test_the_public_admin_port_wants_the_workers_token(replicas, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    processes: list[subprocess.Popen] = []
    try:
        router = start(["--backend", replicas[0].url, "--admin-token-file", str(token)], processes)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{router.admin_url}/status", timeout=5)
        assert refused.value.code == 401
        request = urllib.request.Request(f"{router.admin_url}/status", headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert json.load(answer)["workers"] == 2
        with urllib.request.urlopen(f"{router.admin_url}/healthz", timeout=5) as answer:  # probes want none
            assert json.load(answer)["status"] == "ok"
    finally:
        for process in processes:
            stop(process)


def test_status_documents_add_up_counts_and_keep_one_workers_view():
    one = {"new_sessions": 3, "started_at": 1767225600.5, "backends_ready": 2, "policy": "affinity", "full_determinism": False,
           "backends": [{"url": "a", "inflight": 1, "fleet_inflight": 3}],
           "margin": {"ttfb": {"kept": {"turns": 1, "seconds": 1.0, "mean": 1.0}}}, "rl": {"version": 4}}
    two = {"new_sessions": 4, "started_at": 1767225601.25, "backends_ready": 2, "policy": "affinity", "full_determinism": False,
           "backends": [{"url": "a", "inflight": 2, "fleet_inflight": 3}],
           "margin": {"ttfb": {"kept": {"turns": 3, "seconds": 5.0, "mean": 1.667}}}, "rl": {"version": 4}}
    assert summed([one, two]) == {
        "new_sessions": 7, "started_at": 1767225600.5, "backends_ready": 2, "policy": "affinity", "full_determinism": False,
        "backends": [{"url": "a", "inflight": 3, "fleet_inflight": 3}],
        "margin": {"ttfb": {"kept": {"turns": 4, "seconds": 6.0, "mean": 1.5}}}, "rl": {"version": 4}}


def test_metrics_add_up_series_over_the_workers():
    text = ("# HELP rolloutrouter_forwarded_total Turns forwarded.\n# TYPE rolloutrouter_forwarded_total counter\n"
            "rolloutrouter_forwarded_total {}\n"
            "# HELP rolloutrouter_fleet_members Members.\n# TYPE rolloutrouter_fleet_members gauge\n"
            "rolloutrouter_fleet_members 2.0\n")
    merged = summed_metrics([text.format(3.0), text.format(4.0)]).decode()
    assert "rolloutrouter_forwarded_total 7.0" in merged and "rolloutrouter_fleet_members 2.0" in merged


def test_the_pods_rl_section_adds_each_workers_queue_and_cleared_pins_and_keeps_the_fleets_state_once():
    def rl(queued: int, cleared: int) -> dict:
        return {"rl": {"paused": True, "mode": "queue", "epoch": [3, 1], "weightVersion": "7", "queued": queued,
                       "queue": {"queued": queued, "dispatched": 0, "full": 0, "timeout": 0},
                       "pinsCleared": cleared, "updates": 2, "last": None, "versions": {"r1": "7"}}}
    pod = rl_summed([rl(2, 5), rl(1, 4)])["rl"]
    assert (pod["queued"], pod["queue"]["queued"], pod["pinsCleared"]) == (3, 3, 9)
    assert (pod["paused"], pod["epoch"], pod["weightVersion"], pod["updates"]) == (True, [3, 1], "7", 2)

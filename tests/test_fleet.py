"""Many routers, one policy: real router processes sharing sessions in front of simulated vLLM replicas.

Three routers behave as one: each session's turns are decided by its owner
whichever router they enter by, and the margin compares fleet-wide loads, so
the exact replica sequences (and the counters) are a single router's.
"""
from __future__ import annotations

import http.client
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from rollout_router.fleet.ownership import owner
from rollout_router.localfleet import (
    Service,
    fleet_config,
    fleet_members,
    spawn,
    spawn_fleet_router,
    spawn_replica,
    start_router_fleet,
    stop,
    tell_peers,
    wait_healthy,
)
from tests.support import keys_spread, wait_until
from tests.test_workers_peers import call

# Held turns generate for minutes (until released); quick turns take a few engine steps.
REPLICA_ARGS = ["--step-base-ms", "20"]
HELD_TOKENS, QUICK_TOKENS = 5000, 2
COUNTERS = ("new_sessions", "affinity_kept", "affinity_broken", "repinned_replica_gone", "unkeyed")


def status(service: Service) -> dict:
    with urllib.request.urlopen(f"{service.admin_url}/status", timeout=5) as answer:
        return json.load(answer)


class Turn:
    """A streamed chat completion through a router, held in flight (its head read) until ``release``."""

    def __init__(self, router: Service, key: str | None, max_tokens: int = HELD_TOKENS):
        url = urlsplit(router.url)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"turn of {key}"}],
                "max_tokens": max_tokens, "stream": True}
        self.conn.request("POST", "/v1/chat/completions", json.dumps(body),
                          {"Content-Type": "application/json", **({"X-Session-ID": key} if key else {})})
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.replica = self.response.getheader("X-RolloutRouter-Replica")

    def finish(self) -> bytes:
        return self.response.read()

    def release(self) -> None:
        self.response.close()
        self.conn.close()


def quick_turn(router: Service, key: str) -> Turn:
    turn = Turn(router, key, QUICK_TOKENS)
    body = turn.finish()
    turn.release()
    assert turn.status == 200 and body.rstrip().endswith(b"data: [DONE]"), body[-300:]
    return turn


def fleet_load(router: Service) -> int:
    """The in-flight requests over all replicas as this router's policy sees them (its own + the others')."""
    return sum(b["fleet_inflight"] for b in status(router)["backends"])


def synced(routers: list[Service], load: int) -> None:
    """Wait until every router sees ``load`` requests in flight fleet-wide."""
    wait_until(lambda: all(fleet_load(r) == load for r in routers), f"every router to see {load} in flight")


def letters(replicas: list[str | None]) -> str:
    names: dict[str | None, str] = {}
    return "".join(names.setdefault(r, "ABCD"[len(names)]) for r in replicas)


@pytest.fixture(scope="module")
def replicas():
    starting = [spawn_replica(index, REPLICA_ARGS) for index in range(4)]
    try:
        services = [wait_healthy(s.bound(), "/health") for s in starting]
        yield services
    finally:
        for s in starting:
            stop(s.process)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def grpc_replicas():
    """Two simulated replicas that also serve vLLM's gRPC API."""
    starting = [spawn_replica(20 + index, grpc=True) for index in range(2)]
    try:
        yield [wait_healthy(s.bound(), "/health") for s in starting]
    finally:
        for s in starting:
            stop(s.process)


def grpc_turn(router: Service, key: str, metadata: tuple[tuple[str, str], ...] = ()) -> str:
    """One streamed Generate call with session ``key`` through ``router``, read to its end; the replica it went to."""
    assert router.grpc_target is not None
    with grpc.insecure_channel(router.grpc_target) as channel:
        request = pb.GenerateRequest(text="hello there", stream=True, sampling_params=pb.SamplingParams(max_tokens=3))
        call = pb_grpc.VllmEngineStub(channel).Generate(request, metadata=(("x-session-id", key), *metadata))
        assert list(call)[-1].WhichOneof("response") == "complete"
        return dict(call.initial_metadata())["x-rolloutrouter-replica"]


def converged(routers: list[Service], size: int) -> None:
    ids = sorted(r.admin_url for r in routers if r.process.poll() is None)
    assert len(ids) == size
    wait_until(lambda: all(fleet_members(r) == ids for r in routers if r.process.poll() is None),
               f"every router to see the {size} members")


def set_margin(routers: list[Service], replicas: list[Service], workdir: Path, margin: int | None,
               fleet: bool) -> None:
    settings = {"affinityBreakMargin": margin}
    if fleet:
        tell_peers(routers, replicas, workdir, settings)
    else:
        (workdir / "single.json").write_text(json.dumps({**settings, "backends": [r.url for r in replicas]}))
        routers[0].process.send_signal(signal.SIGHUP)
    wait_until(lambda: all(status(r)["affinity_break_margin"] == margin for r in routers), "the margin to apply")


def session(entries: list[Service], filler: Service, key: str, everyone: list[Service]) -> str:
    """Three held turns of ``key``, one held request without a key, a fourth turn: the turns' replicas."""
    held: list[Turn] = []
    try:
        for turn in range(3):
            held.append(Turn(entries[turn], key))
            assert held[-1].status == 200
            synced(everyone, len(held))
        held.append(Turn(filler, None))
        synced(everyone, 4)
        held.append(Turn(entries[3], key))
        assert all(t.status == 200 for t in held)
        return letters([t.replica for t in (*held[:3], held[4])])
    finally:
        for turn in held:
            turn.release()
        synced(everyone, 0)


EXPECTED = {None: "AAAA", 1: "AABB", 0: "ABCC"}


def test_three_routers_give_a_single_routers_sequences_and_counters(replicas, workdir):
    routers = start_router_fleet(3, replicas, workdir)
    (workdir / "single.json").write_text(json.dumps({"backends": [r.url for r in replicas]}))
    single = spawn(["serve", "--log-level", "warning", "--config", str(workdir / "single.json")], "127.0.0.1").bound()
    try:
        converged(routers, 3)
        for margin, expected in EXPECTED.items():
            set_margin(routers, replicas, workdir, margin, fleet=True)
            set_margin([single], replicas, workdir, margin, fleet=False)
            for offset in range(3):  # every turn enters by another router, in three rotations
                entries = [routers[(offset + turn) % 3] for turn in range(4)]
                key = f"margin-{margin}-rotation-{offset}"
                assert session(entries, routers[(offset + 1) % 3], key, routers) == expected, (margin, offset)
                assert session([single] * 4, single, key, [single]) == expected
        fleet = [status(r) for r in routers]
        alone = status(single)
        for counter in COUNTERS:
            assert sum(s[counter] for s in fleet) == alone[counter], counter
        assert sum(s["fleet"]["forwarded"] for s in fleet) > 0
        assert sum(s["fleet"]["ownerUnreachable"] for s in fleet) == 0
        assert alone["fleet"] is None and all(s["total_inflight"] == 0 for s in fleet)
    finally:
        for router in (*routers, single):
            router.stop()


def test_a_killed_routers_sessions_alone_are_placed_anew(replicas, workdir):
    routers = start_router_fleet(3, replicas, workdir)
    try:
        converged(routers, 3)
        ids = [r.admin_url for r in routers]
        keys = keys_spread(lambda key: owner(key, ids), ids, "kill", 6)
        first = {key: quick_turn(routers[(i + 1) % 3], key).replica for i, key in enumerate(keys)}  # not the owner
        doomed = [key for key in keys if owner(key, ids) == ids[2]]
        survivors = routers[:2]
        results: list[tuple[float, str, int, str | None]] = []
        killed_at: list[float] = []

        def traffic() -> None:
            for round_ in range(6):
                for i, key in enumerate(keys):
                    started = time.monotonic()
                    try:
                        turn = quick_turn(survivors[(i + round_) % 2], key)
                        results.append((started, key, turn.status, turn.replica))
                    except (AssertionError, OSError) as error:
                        results.append((started, key, 0, repr(error)))

        worker = threading.Thread(target=traffic)
        worker.start()
        wait_until(lambda: len(results) >= len(keys), "traffic to be under way")
        routers[2].process.send_signal(signal.SIGKILL)
        killed_at.append(time.monotonic())
        worker.join(timeout=120)
        assert not worker.is_alive()
        failed = [r for r in results if r[0] > killed_at[0] and r[2] != 200]
        assert not failed, failed  # nothing that started after the kill saw an error
        for _started, key, _, replica in results:
            if key not in doomed:
                assert replica == first[key], key  # the survivors' sessions kept their pins
        converged(survivors, 2)
        counts = [status(r) for r in survivors]
        assert sum(s["fleet"]["replaced"] for s in counts) == len(doomed)
        assert sum(s["fleet"]["handoffs"] for s in counts) == 0
        wait_until(lambda: all(s["total_inflight"] == 0 for s in map(status, survivors)), "no request in flight")
        synced(survivors, 0)  # the killed router's counts left with it
    finally:
        for router in routers:
            router.stop()


def ready(router: Service) -> bool:
    """Whether the router's traffic port says it takes traffic (what a Service's endpoints follow)."""
    try:
        with urllib.request.urlopen(f"{router.url}/readyz", timeout=5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def service_turn(routers: list[Service], entry: int, key: str) -> Turn:
    """A quick turn entering by the ``entry``-th router, or the next ready one, as a Service would pick it; a
    router that stopped between its readiness and the connection (refused: nothing sent) means the next one."""
    for offset in range(len(routers)):
        router = routers[(entry + offset) % len(routers)]
        if router.process.poll() is None and ready(router):
            try:
                return quick_turn(router, key)
            except ConnectionRefusedError:
                continue
    raise AssertionError(f"no router took a turn of {key}")


def fleet_sum(routers: list[Service], name: str) -> int:
    """A counter summed over the routers (``/status``, or its ``fleet`` object for the fleet's own)."""
    statuses = [status(r) for r in routers]
    return sum(s[name] if name in s else s["fleet"][name] for s in statuses)


def test_a_router_that_gets_sigterm_hands_its_sessions_over(replicas, workdir):
    routers = start_router_fleet(3, replicas, workdir)
    try:
        converged(routers, 3)
        ids = [r.admin_url for r in routers]
        keys = keys_spread(lambda key: owner(key, ids), ids, "leave", 6)
        first = {key: quick_turn(routers[(i + 1) % 3], key).replica for i, key in enumerate(keys)}  # not the owner
        leaving, survivors = routers[2], routers[:2]
        mine = [key for key in keys if owner(key, ids) == leaving.admin_url]
        placed = fleet_sum(survivors, "new_sessions")
        results: list[tuple[str, int, str | None]] = []
        errors: list[BaseException] = []

        def traffic() -> None:  # every turn enters by a ready router, the leaving one too until it is not
            for round_ in range(6):
                for i, key in enumerate(keys):
                    try:
                        turn = service_turn(routers, i + round_, key)
                        results.append((key, turn.status, turn.replica))
                    except (AssertionError, OSError) as error:
                        errors.append(error)

        held = Turn(leaving, mine[0], max_tokens=100)  # in flight on the leaving router (its owner) at SIGTERM
        assert held.status == 200 and held.replica == first[mine[0]]
        worker = threading.Thread(target=traffic)
        worker.start()
        wait_until(lambda: len(results) >= len(keys), "traffic to be under way")
        leaving.process.send_signal(signal.SIGTERM)
        wait_until(lambda: not ready(leaving) and status(leaving)["fleet"]["leaving"], "the router to be leaving")
        assert leaving.process.poll() is None  # it waits for the request it is serving
        body = held.finish()
        held.release()
        assert body.rstrip().endswith(b"data: [DONE]"), body[-300:]  # finished, not cut off
        assert leaving.process.wait(timeout=30) == 0
        worker.join(timeout=120)
        assert not worker.is_alive() and not errors, errors  # no turn saw an error
        assert len(results) == 6 * len(keys)
        assert all(code == 200 and replica == first[key] for key, code, replica in results), results
        converged(survivors, 2)
        for i, key in enumerate(keys):  # a last round, with the leaving router gone
            assert quick_turn(survivors[i % 2], key).replica == first[key], key
        assert fleet_sum(survivors, "new_sessions") == placed  # none of its sessions was placed anew
        assert fleet_sum(survivors, "replaced") == 0
        assert fleet_sum(survivors, "handoffs") == len(mine)  # each of its sessions arrived once, with its pin
        wait_until(lambda: fleet_sum(survivors, "total_inflight") == 0, "no request in flight")
        synced(survivors, 0)  # its counts left with it
    finally:
        for router in routers:
            router.stop()


def test_a_rolling_update_keeps_every_pin(replicas, workdir):
    """Add a router, then SIGTERM the oldest, three times over: every session keeps its replica throughout."""
    everyone = start_router_fleet(2, replicas, workdir)
    try:
        converged(everyone, 2)
        keys = [f"roll-{i}" for i in range(16)]
        first = {key: quick_turn(everyone[i % 2], key).replica for i, key in enumerate(keys)}

        def turns(routers: list[Service]) -> None:
            placed = fleet_sum(routers, "new_sessions")
            for i, key in enumerate(keys):
                assert service_turn(routers, i, key).replica == first[key], key
            assert fleet_sum(routers, "new_sessions") == placed  # no session was placed anew
            assert fleet_sum(routers, "replaced") == 0

        for _ in range(3):
            everyone.append(spawn_fleet_router(len(everyone), replicas, workdir))
            tell_peers(everyone, replicas, workdir)
            live = [r for r in everyone if r.process.poll() is None]
            converged(live, 3)
            turns(live)
            oldest = live[0]
            oldest.process.send_signal(signal.SIGTERM)
            assert oldest.process.wait(timeout=30) == 0
            tell_peers(everyone, replicas, workdir)
            converged(live[1:], 2)
            turns(live[1:])
    finally:
        for router in everyone:
            router.stop()


def test_an_added_router_takes_its_sessions_with_their_pins(replicas, workdir):
    routers = start_router_fleet(2, replicas, workdir)
    try:
        converged(routers, 2)
        keys = [f"grow-{i}" for i in range(24)]
        first = {key: quick_turn(routers[i % 2], key).replica for i, key in enumerate(keys)}
        routers.append(spawn_fleet_router(2, replicas, workdir))
        tell_peers(routers, replicas, workdir)
        converged(routers, 3)
        ids = [r.admin_url for r in routers]
        moved = [key for key in keys if owner(key, ids) == ids[2]]
        assert moved
        for i, key in enumerate(keys):
            assert quick_turn(routers[i % 3], key).replica == first[key], key
        counts = [status(r) for r in routers]
        assert counts[2]["fleet"]["handoffs"] == len(moved)
        assert sum(s["fleet"]["replaced"] for s in counts) == 0
        assert sum(s["affinity_kept"] for s in counts) == len(keys)  # every second turn kept its replica
    finally:
        for router in routers:
            router.stop()


def test_pins_pushed_by_a_view_that_lacks_the_owner_go_on_to_the_owner(replicas, workdir):
    """A rolling update's race: the leaving router ``a`` has not seen the new router ``c`` yet, so it pushes every
    pin to ``b``; ``b`` sees ``c`` and names it as the owner of the pins ``c`` owns, and ``a`` pushes them there.
    They land where their owner is, before any turn asks: taken by ``b``, they would be where ``c`` asks only
    by chance (a new pod's worker never asks its sibling, which joined with it: tests/test_fleet_units.py)."""
    a, b = start_router_fleet(2, replicas, workdir)
    c = spawn_fleet_router(2, replicas, workdir)
    routers = [a, b, c]
    try:
        fleet_config(workdir / "router-1.json", replicas, [a.admin_url, c.admin_url])
        fleet_config(workdir / "router-2.json", replicas, [a.admin_url, b.admin_url])
        for router in (b, c):
            router.process.send_signal(signal.SIGHUP)
        wait_until(lambda: fleet_members(b) == fleet_members(c) == sorted(r.admin_url for r in routers),
                   "b and c to see all three")
        wait_until(lambda: fleet_members(a) == sorted([a.admin_url, b.admin_url]), "a to see b alone")
        keys = [k for k in (f"redirect-{n}" for n in range(2000))
                if owner(k, [a.admin_url, b.admin_url]) == a.admin_url
                and owner(k, [b.admin_url, c.admin_url]) == c.admin_url][:6]
        first = {key: quick_turn(a, key).replica for key in keys}  # a owns them in its view: pinned there
        placed = fleet_sum([b, c], "new_sessions")
        a.process.send_signal(signal.SIGTERM)
        assert a.process.wait(timeout=30) == 0
        assert status(c)["fleet"]["handoffs"] == len(keys) and status(b)["fleet"]["handoffs"] == 0
        for i, key in enumerate(keys):
            assert quick_turn([b, c][i % 2], key).replica == first[key], key
        assert fleet_sum([b, c], "new_sessions") == placed and fleet_sum([b, c], "replaced") == 0
    finally:
        for router in routers:
            router.stop()


def test_a_released_session_is_forgotten_by_every_router_whichever_the_delete_reaches(replicas, workdir):
    """``DELETE /v1/sessions/KEY`` reaches one router of many (a Service picks it): the pin at the key's owner
    goes, and so does one left at another router (here pushed there, as a leaving router would)."""
    routers = start_router_fleet(3, replicas, workdir)
    try:
        converged(routers, 3)
        ids = [r.admin_url for r in routers]
        key = next(k for k in (f"finished-{n}" for n in range(1000)) if owner(k, ids) == ids[1])
        replica = quick_turn(routers[0], key).replica  # forwarded to its owner and pinned there
        pushed = call(routers[2].admin_url, "POST", "/fleet/v1/adopt",
                      {"pins": [{"key": key, "replica": replica, "idleSeconds": 0}]})
        assert pushed == (200, {"adopted": 1, "kept": 0, "elsewhere": {}})
        assert [status(r)["sessions"] for r in routers] == [0, 1, 1]
        code, answer = call(routers[0].admin_url, "DELETE", f"/v1/sessions/{key}")
        assert code == 200, answer
        assert answer == {"session": key, "released": True,
                          "routers": {ids[0]: "not pinned", ids[1]: "released", ids[2]: "released"}}
        assert [status(r)["sessions"] for r in routers] == [0, 0, 0]
        assert [status(r)["released"] for r in routers] == [0, 1, 1]
        code, answer = call(routers[2].admin_url, "DELETE", f"/v1/sessions/{key}")
        assert code == 404 and answer["error"]["param"] == "key", answer
        assert answer["error"]["message"].endswith("not pinned on any of the 3 routers that answered")
        placed = status(routers[1])["new_sessions"]
        quick_turn(routers[2], key)
        assert status(routers[1])["new_sessions"] == placed + 1  # the next turn is a new session at its owner
        code, answer = call(routers[1].admin_url, "POST", "/fleet/v1/release", {"key": ""})
        assert code == 400 and answer["error"]["param"] == "key", answer
    finally:
        for router in routers:
            router.stop()


def line_until(answer: http.client.HTTPResponse, loads: dict, lines: int = 50) -> bool:
    """Whether one of the watch's next ``lines`` lines (heartbeats may come first) carries ``loads``."""
    return any(json.loads(answer.readline())["loads"] == loads for _ in range(lines))


def test_a_peer_watches_the_loads_as_a_line_per_change_and_a_heartbeat(replicas, workdir):
    """How members follow each other: one answer of JSON lines, a line when the loads change and heartbeats."""
    [router] = start_router_fleet(1, replicas, workdir)  # a fleet section, no peer yet: the routes are on
    url = urlsplit(router.admin_url)
    try:
        for query, param in (("watch=abc&heartbeat=1", "watch"), ("watch=0.1", "heartbeat"),
                             ("watch=5&heartbeat=1", "watch"), ("watch=0.1&heartbeat=60", "heartbeat"),
                             ("watch=0.1&heartbeat=1&since=3", "since")):
            with pytest.raises(urllib.error.HTTPError) as invalid:
                urllib.request.urlopen(f"{router.admin_url}/fleet/v1/loads?{query}", timeout=5)
            assert invalid.value.code == 400 and json.load(invalid.value)["error"]["param"] == param, query
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        conn.request("GET", "/fleet/v1/loads?watch=0.02&heartbeat=0.3")
        answer = conn.getresponse()
        assert answer.status == 200 and answer.getheader("Content-Type") == "application/x-ndjson"
        assert answer.getheader("Transfer-Encoding") == "chunked"
        assert json.loads(answer.readline())["loads"] == {}
        held = Turn(router, "watched")  # in flight until released: the loads change, a line says so
        assert line_until(answer, {held.replica: 1})
        held.release()  # the stream cut off: the request ends
        assert line_until(answer, {})
        quiet, started = 0, time.monotonic()
        while time.monotonic() - started < 1.0:  # nothing changes: heartbeats (0.3 s), not a line per look (0.02 s)
            assert json.loads(answer.readline())["loads"] == {}
            quiet += 1
        assert 1 <= quiet <= 6, quiet
        conn.close()
        assert quick_turn(router, "after").status == 200  # the router outlived its watcher
    finally:
        router.stop()


def test_grpc_calls_are_forwarded_to_the_owner(workdir, grpc_replicas):
    routers = start_router_fleet(2, grpc_replicas, workdir, grpc=True)
    try:
        converged(routers, 2)
        ids = [r.admin_url for r in routers]
        key = next(f"grpc-{i}" for i in range(100) if owner(f"grpc-{i}", ids) == ids[1])
        seen = {grpc_turn(router, key) for router in routers}  # one call enters by the owner's peer, one by the owner
        entry, owning = status(routers[0]), status(routers[1])
        assert len(seen) == 1 and entry["fleet"]["forwarded"] == 1 and owning["fleet"]["forwarded"] == 0
        assert owning["new_sessions"] == 1 and owning["affinity_kept"] == 1 and entry["new_sessions"] == 0
    finally:
        for router in routers:
            router.stop()


FORGED = "http://127.0.0.1:1"  # a hop mark naming no router of the fleet (never connected to)


def test_a_clients_own_hop_mark_does_not_make_a_router_decide_a_key_it_does_not_own(workdir, grpc_replicas):
    routers = start_router_fleet(2, grpc_replicas, workdir, grpc=True)
    try:
        converged(routers, 2)
        ids = [r.admin_url for r in routers]
        key = next(k for k in (f"forged-{n}" for n in range(1000)) if owner(k, ids) == ids[1])
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        ask = urllib.request.Request(f"{routers[0].url}/v1/chat/completions", data=body.encode(), headers={
            "Content-Type": "application/json", "X-Session-ID": key, "X-RolloutRouter-Forwarded-By": FORGED})
        with urllib.request.urlopen(ask, timeout=10) as answer:
            assert answer.status == 200
        grpc_turn(routers[0], key, (("x-rolloutrouter-forwarded-by", FORGED),))
        entry, owning = status(routers[0]), status(routers[1])
        assert entry["fleet"]["forwarded"] == 2 and entry["sessions"] == 0  # both went to the owner
        assert (owning["new_sessions"], owning["affinity_kept"], owning["sessions"]) == (1, 1, 1)
    finally:
        for router in routers:
            router.stop()


def test_fleet_routes_want_the_admin_token_and_ownership(workdir, replicas):
    token = workdir / "token"
    token.write_text("s3cret\n")
    (workdir / "alone.json").write_text(json.dumps({"backends": [r.url for r in replicas]}))
    alone = spawn(["serve", "--config", str(workdir / "alone.json")], "127.0.0.1").bound()
    fleet_config(workdir / "router-0.json", replicas, [])
    member = spawn(["serve", "--config", str(workdir / "router-0.json"), "--admin-token-file", str(token)],
                   "127.0.0.1").bound()
    try:
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{alone.admin_url}/fleet/v1/loads", timeout=5)
        assert missing.value.code == 404 and b"ownership is off" in missing.value.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{member.admin_url}/fleet/v1/info", timeout=5)
        assert refused.value.code == 401
        ask = urllib.request.Request(f"{member.admin_url}/fleet/v1/info", headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(ask, timeout=5) as answer:
            info = json.load(answer)
        assert info == {"id": member.admin_url, "http": member.url, "grpc": None, "leaving": False}
        for route, body, param in (("handoff", [1], "key"), ("leave", {"id": "nope"}, "id"),
                                   ("leave", {"id": "http://10.0.0.9:8081", "done": "yes"}, "done"),
                                   ("adopt", {"pins": {}}, "pins"),
                                   ("adopt", {"pins": [{"key": "k", "replica": "http://r", "idleSeconds": 0},
                                                       {"key": "k", "replica": "http://r", "idleSeconds": -1}]},
                                    "pins[1]"),
                                   ("adopt", {"pins": [{"key": "k", "replica": "http://r", "idleSeconds": 0}],
                                              "redirect": "yes"}, "redirect"),
                                   ("adopt", {"pins": [], "from": 7}, "from")):
            bad = urllib.request.Request(f"{member.admin_url}/fleet/v1/{route}", data=json.dumps(body).encode(),
                                         method="POST", headers={"Authorization": "Bearer s3cret"})
            with pytest.raises(urllib.error.HTTPError) as invalid:
                urllib.request.urlopen(bad, timeout=5)
            assert invalid.value.code == 400 and json.load(invalid.value)["error"]["param"] == param, route
        ask = urllib.request.Request(f"{member.admin_url}/status", headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(ask, timeout=5) as answer:
            assert json.load(answer)["fleet"]["handoffs"] == 0  # nothing of a refused batch was adopted
    finally:
        alone.stop()
        member.stop()

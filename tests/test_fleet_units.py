"""Units of the fleet: rendezvous ownership, member history, membership, summed loads, handoff."""
from __future__ import annotations

import asyncio
import contextlib
import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_router.balancer import Balancer
from rollout_router.fleet.client import PeerError, Unreachable
from rollout_router.fleet.handoff import Handoff
from rollout_router.fleet.loadview import PeerLoads, vllm_load
from rollout_router.fleet.membership import PODS, STATIC, Member, Membership
from rollout_router.fleet.node import advertised
from rollout_router.fleet.ownership import History, owner
from rollout_router.fleet.peerpods import PodPeers, admin_urls
from rollout_router.policy import LiveConfig
from rollout_router.proxy import admin
from rollout_router.replicas import ReplicaSet

ROUTERS = [f"http://10.0.0.{i}:8081" for i in range(1, 9)]
KEYS = [f"session-{i}" for i in range(2000)]


def test_owner_is_the_same_whatever_the_order_of_members():
    for key in KEYS[:200]:
        assert owner(key, ROUTERS) == owner(key, list(reversed(ROUTERS))) == owner(key, set(ROUTERS))


def test_keys_spread_over_members():
    counts = {router: 0 for router in ROUTERS[:4]}
    for key in KEYS:
        counts[owner(key, ROUTERS[:4])] += 1
    assert min(counts.values()) > len(KEYS) / 4 * 0.8  # within 20% of an even share


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=2, max_value=8), st.data())
def test_removing_a_member_moves_only_its_keys_and_adding_one_moves_keys_only_to_it(size, data):
    members = ROUTERS[:size]
    gone = data.draw(st.sampled_from(members))
    rest = [m for m in members if m != gone]
    for key in KEYS[:300]:
        before, after = owner(key, members), owner(key, rest)
        assert after == before or before == gone  # removal: only the removed member's keys move
        assert before == after or before == gone  # adding `gone` back: keys move only to it


def test_history_names_the_previous_owner_after_joining_and_after_a_member_leaves():
    me, a, b = ROUTERS[:3]
    history = History(me, window=60.0)
    assert history.previous_owners("k", 0.0) == []  # alone: nobody to ask
    history.update({me, a}, now=1.0)  # found a, then b: the keys that came to us were a's or b's before
    history.update({me, a, b}, now=1.5)
    mine = [k for k in KEYS[:300] if owner(k, {me, a, b}) == me]
    assert mine and all(history.previous_owners(k, 2.0)[-1] == owner(k, {a, b}) for k in mine)
    history.update({me, a}, now=3.0)  # b left: its keys came to us or to a
    from_b = [k for k in KEYS[:300] if owner(k, {me, a, b}) == b and owner(k, {me, a}) == me]
    assert from_b and all(history.previous_owners(k, 4.0)[0] == b for k in from_b)
    assert history.previous_owners(from_b[0], 100.0) == []  # past the window: no pin can have survived
    stable = History(me, window=60.0)
    stable.update({me, a}, now=0.0)
    assert stable.previous_owners(mine[0], 61.0) == []  # a fleet that did not change: nobody is asked


def test_membership_members_answer_and_leave_after_the_timeout():
    me, a, b = ROUTERS[:3]
    membership = Membership(me)
    added, dropped = membership.set_source(STATIC, [a, me + "/"])
    assert added == {a} and dropped == [] and membership.members() == {me}  # not a member before it answers
    membership.set_source(PODS, [a, b])
    member = membership.get(a)
    assert member is not None
    member.http = "http://10.0.0.2:8080"
    assert membership.answered(a, now=1.0) and membership.members() == {me, a}
    assert membership.failed(a, now=1.5, timeout=1.0) is None  # silent, but not for long
    assert membership.failed(a, now=2.0, timeout=1.0) is member and membership.members() == {me}
    _, dropped = membership.set_source(PODS, [])
    assert [m.id for m in dropped] == [b] and set(membership.peers) == {a}  # still named by the static source


def test_peer_loads_add_up_into_the_replica_index():
    replicas = ReplicaSet()
    for name in ("r1", "r2"):
        replicas.add(name)
    loads = PeerLoads(replicas)
    loads.change({}, {"r1": 3})
    loads.change({}, {"r1": 1, "r2": 2, "r3": 5})  # r3 is not here (yet)
    lease = replicas.acquire("r2")
    assert dict(replicas.loads()) == {"r1": 4, "r2": 3} and replicas.loads().min() == 3
    replicas.add("r3")
    assert replicas.loads()["r3"] == 5
    loads.change({"r1": 3}, {})  # a member left
    assert dict(replicas.loads()) == {"r1": 1, "r2": 3, "r3": 5}
    lease.release()
    loads.clear()
    assert dict(replicas.loads()) == {"r1": 0, "r2": 0, "r3": 0} and replicas.external() == {}


def test_vllm_load_sums_running_and_waiting():
    text = ('# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\nvllm:num_requests_running_x 9\n'
            'vllm:kv_cache_usage_perc 0.5\n')
    assert vllm_load(text) == 5
    assert vllm_load("vllm:num_requests_waiting 1\n") == 1
    assert vllm_load("other 1\n") is None


def test_advertised_replaces_the_any_address_with_the_pod_ip(monkeypatch):
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    assert advertised("0.0.0.0", 8081) == "http://10.1.2.3:8081"
    assert advertised("127.0.0.1", 9) == "http://127.0.0.1:9"


@pytest.mark.parametrize(("pod_ip", "member"), [("10.1.2.3", "http://10.1.2.3:8081"),
                                                ("fd00::7", "http://[fd00::7]:8081")])
def test_a_pod_names_itself_as_its_peers_find_it(monkeypatch, pod_ip, member):
    """The id a router pod advertises and the URL its peers build from its pod status must be the same string."""
    monkeypatch.setenv("POD_IP", pod_ip)
    pod = {"status": {"podIP": pod_ip, "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
           "spec": {"containers": [{"ports": [{"name": "admin", "containerPort": 8081}]}]}}
    assert [advertised("::", 8081)] == admin_urls(pod) == [member]


def test_a_pod_running_workers_names_each_as_the_worker_names_itself(monkeypatch):
    """``serve --workers 2`` in a pod: the members are its fleet-0 and fleet-1 ports (by index, whatever their order
    in the spec), not its admin port (the parent's), and each is the id that worker advertises (multicore)."""
    monkeypatch.setenv("POD_IP", "fd00::7")
    ports = [{"name": "admin", "containerPort": 8081}, {"name": "fleet-1", "containerPort": 8083},
             {"name": "fleet-0", "containerPort": 8082}, {"name": "fleetx", "containerPort": 9}]
    pod = {"metadata": {"name": "router-0"}, "spec": {"containers": [{"ports": ports}]},
           "status": {"podIP": "fd00::7", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    assert admin_urls(pod) == [advertised("::", 8082), advertised("::", 8083)] == \
        ["http://[fd00::7]:8082", "http://[fd00::7]:8083"]
    pods = PodPeers()
    assert pods.reset([pod]) == {"http://[fd00::7]:8082", "http://[fd00::7]:8083"}
    assert pods.apply("DELETED", pod) == set()


def _balancer() -> tuple[Balancer, list[float]]:
    now = [0.0]
    replicas = ReplicaSet(lambda: now[0])
    for name in ("r1", "r2"):
        replicas.add(name)
    return Balancer(replicas, "affinity", LiveConfig(), lambda: now[0]), now


async def test_handoff_takes_the_pin_from_the_previous_owner():
    me, a = ROUTERS[:2]
    balancer, now = _balancer()
    history = History(me, 60.0)
    history.update({me, a}, 0.0)
    key = next(k for k in KEYS if owner(k, {me, a}) == me)
    asked: list[tuple[str, str]] = []

    async def ask(previous: str, key: str, timeout: float | None) -> tuple[str, float] | None:
        asked.append((previous, key))
        await asyncio.sleep(0)
        return "r2", 1.0

    handoff = Handoff(history, balancer, ask, lambda: now[0])
    assert handoff.needed(key)
    await asyncio.gather(handoff.fetch(key), handoff.fetch(key))  # concurrent requests: one question
    assert asked == [(a, key)] and balancer.pinned(key) == "r2" and handoff.handoffs == 1
    assert not handoff.needed(key)
    decision, lease = balancer.acquire(key)
    lease.release()
    assert decision.replica == "r2" and balancer.policy.counters.affinity_kept == 1


async def test_handoff_counts_a_replaced_session_only_when_the_previous_owner_is_gone():
    me, a = ROUTERS[:2]
    balancer, now = _balancer()
    history = History(me, 60.0)
    history.update({me, a}, 0.0)
    keys = [k for k in KEYS if owner(k, {me, a}) == me][:3]
    answers: dict[str, object] = {keys[0]: None, keys[1]: PeerError("401"), keys[2]: Unreachable("refused")}

    async def ask(previous: str, key: str, timeout: float | None) -> tuple[str, float] | None:
        answer = answers[key]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    handoff = Handoff(history, balancer, ask, lambda: now[0])
    for key in keys:
        await handoff.fetch(key)
    assert handoff.replaced == 1 and handoff.handoffs == 0 and a in handoff.gone


async def test_a_released_session_names_the_routers_that_did_not_answer_instead_of_calling_it_unpinned():
    me, a, b, c = ROUTERS[:4]
    balancer, _ = _balancer()
    down = ROUTERS[4]  # a candidate not answering its polls: not live here, asked all the same
    answers: dict[str, object] = {a: {"key": "k", "released": False}, b: Unreachable("refused"),
                                  c: PeerError("404: no such route (an older router)"), down: Unreachable("refused")}

    class Client:
        async def call(self, method: str, url: str, body: object = None) -> object:
            peer, _, route = url.rpartition("/fleet/v1/")
            assert (method, route, body) == ("POST", "release", {"key": "k"})
            answer = answers[peer]
            if isinstance(answer, Exception):
                raise answer
            return answer

    peers = {p: Member(p, live=p != down) for p in answers}
    fleet = SimpleNamespace(self_id=me, client=Client(), membership=SimpleNamespace(peers=peers), siblings=frozenset(),
                            live_peers=lambda: [m for m in peers.values() if m.live])
    context = SimpleNamespace(balancer=balancer, fleet=fleet)
    answer = admin.release_session(context, admin.AdminRequest("DELETE", "/v1/sessions/k", {"key": "k"}))
    assert isinstance(answer, admin.Deferred) and answer.then is not None
    answer = await answer.then()
    message = json.loads(answer.body)["error"]["message"]
    assert answer.status == 503 and a not in message and f"{b} (unreachable: refused)" in message, message
    assert f"{c} (failed: 404" in message
    assert down not in message  # not live here either, and silent: most likely gone, no reason to retry for it
    answers[b] = answers[c] = {"key": "k", "released": False}
    unpinned = await admin.release_session(context, admin.AdminRequest("DELETE", "/", {"key": "k"})).then()
    assert unpinned.status == 404
    assert json.loads(unpinned.body)["error"]["message"].endswith(
        f"is not pinned on any of the 4 routers that answered; {down} did not and is not live")
    answers[down] = {"key": "k", "released": True}  # not live in this router's view, yet it held the pin
    assert (await admin.release_session(context, admin.AdminRequest("DELETE", "/", {"key": "k"})).then()).status == 200
    answers[down] = Unreachable("refused")
    answers[c] = {"key": "k", "released": True}
    released = await admin.release_session(context, admin.AdminRequest("DELETE", "/", {"key": "k"})).then()
    assert released.status == 200
    routers = json.loads(released.body)["routers"]
    assert routers.pop(down).startswith("not live, unreachable: ")
    assert routers == {me: "not pinned", a: "not pinned", b: "not pinned", c: "released"}


def test_pushed_pins_are_adopted_unless_the_pin_here_was_used_since():
    me, a = ROUTERS[:2]
    balancer, now = _balancer()

    async def never(previous: str, key: str, timeout: float | None) -> tuple[str, float] | None:
        raise AssertionError("nobody is asked")

    handoff = Handoff(History(me, 60.0), balancer, never, lambda: now[0])
    now[0] = 100.0
    balancer.adopt("mine", "r1")  # used here at 100 s
    adopted = handoff.receive([("new", "r2", 5.0), ("mine", "r2", 1.0), ("older-here", "r1", 0.0)])
    assert adopted == 2 and handoff.handoffs == 2
    assert balancer.pinned("new") == "r2" and balancer.pinned("mine") == "r1"  # pushed 99 s: older than 100 s
    now[0] = 110.0
    assert handoff.receive([("mine", "r2", 1.0)]) == 1 and balancer.pinned("mine") == "r2"  # pushed 109 s: newer
    assert balancer.last_used("mine") == 110.0 and balancer.last_used("nope") is None
    assert sorted(balancer.pins()) == [("mine", "r2", 110.0), ("new", "r2", 100.0), ("older-here", "r1", 100.0)]


async def test_a_departed_previous_owner_is_not_asked_and_not_a_loss():
    me, a = ROUTERS[:2]
    balancer, now = _balancer()
    history = History(me, 60.0)
    history.update({me, a}, 0.0)
    history.update({me}, 1.0)  # a left
    key = next(k for k in KEYS if owner(k, {me, a}) == a)

    async def refused(previous: str, key: str, timeout: float | None) -> tuple[str, float] | None:
        raise Unreachable("refused")

    handoff = Handoff(history, balancer, refused, lambda: now[0])
    handoff.departed.add(a)
    await handoff.fetch(key)
    assert handoff.replaced == 0 and a not in handoff.gone
    handoff.departed.clear()
    await handoff.fetch(key)
    assert handoff.replaced == 1 and a in handoff.gone  # gone without saying it handed its pins over: lost


async def test_entry_lookup_asks_every_peer_at_once_and_keeps_the_freshest_pin():
    me, a, b, c = ROUTERS[:4]
    balancer, now = _balancer()
    held = {a: ("r1", 30.0), b: ("r2", 2.0)}  # two pins: two routers placed the same new session at once
    asked: list[tuple[str, float | None]] = []
    both_asked = asyncio.Event()

    async def ask(peer: str, key: str, timeout: float | None) -> tuple[str, float] | None:
        asked.append((peer, timeout))
        if len(asked) == 3:
            both_asked.set()
        await both_asked.wait()  # every question is out before any answer: they are asked at once
        if peer == c:
            raise Unreachable("timed out")
        return held.pop(peer, None)

    handoff = Handoff(History(me, 60.0), balancer, ask, lambda: now[0])
    answered = await asyncio.gather(handoff.lookup("k", [a, b, c], 0.5), handoff.lookup("k", [a, b, c], 0.5))
    assert answered == [True, True] and sorted(asked) == [(a, 0.5), (b, 0.5), (c, 0.5)]  # one lookup for both
    assert balancer.pinned("k") == "r2" and handoff.handoffs == 1 and handoff.lookups == 1 and not held
    assert await handoff.lookup("new", [a, b], 0.5) is True  # nobody holds it: a new session, nothing counted
    assert await handoff.lookup("unsure", [a, c], 0.5) is False  # c did not answer: it may have held it
    assert handoff.handoffs == 1 and handoff.replaced == 0 and handoff.lookups == 3


@pytest.mark.parametrize("bad", ["Entry", "owner", None])
def test_fleet_ownership_is_rendezvous_or_entry(bad):
    from rollout_router.settings import SettingsError, parse_settings
    assert parse_settings({"fleet": {}}).fleet.ownership == "rendezvous"  # type: ignore[union-attr]
    assert parse_settings({"fleet": {"ownership": "entry"}}).fleet.ownership == "entry"  # type: ignore[union-attr]
    with pytest.raises(SettingsError, match="fleet.ownership"):
        parse_settings({"fleet": {"ownership": bad}})


def test_a_leaving_member_owns_no_key_but_stays_polled():
    me, a = ROUTERS[:2]
    membership = Membership(me)
    membership.set_source(STATIC, [a])
    member = membership.get(a)
    assert member is not None
    member.http = "http://10.0.0.2:8080"
    membership.answered(a, now=1.0)
    member.leaving = True
    assert membership.members() == {me} and member.live and set(membership.peers) == {a}


def test_surrender_gives_the_pin_up():
    balancer, _ = _balancer()
    decision, lease = balancer.acquire("k")
    lease.release()
    assert balancer.surrender("k") == decision.replica and balancer.pinned("k") is None
    assert balancer.surrender("k") is None


@pytest.mark.parametrize("bad", [["ftp://x"], ["nope"]])
def test_fleet_peers_must_be_urls(bad):
    from rollout_router.settings import SettingsError, parse_settings
    with pytest.raises(SettingsError, match="fleet.peers"):
        parse_settings({"fleet": {"peers": bad}})


def _pod(name: str, ip: str | None, ready: bool = True, port_name: str = "admin") -> dict:
    return {"metadata": {"name": name},
            "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8080},
                                               {"name": port_name, "containerPort": 8081}]}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_router_pods_are_members_while_ready_at_their_admin_port():
    pods = PodPeers()
    assert pods.reset([_pod("a", "10.0.0.1"), _pod("b", "10.0.0.2", ready=False), _pod("c", None),
                       _pod("d", "fd00::4"), _pod("e", "10.0.0.5", port_name="metrics")]) == \
        {"http://10.0.0.1:8081", "http://[fd00::4]:8081"}
    assert pods.apply("MODIFIED", _pod("b", "10.0.0.2")) == \
        {"http://10.0.0.1:8081", "http://10.0.0.2:8081", "http://[fd00::4]:8081"}
    assert pods.apply("DELETED", _pod("a", "10.0.0.1")) == {"http://10.0.0.2:8081", "http://[fd00::4]:8081"}


def test_a_terminating_router_pod_stays_a_candidate_while_it_runs():
    """A router pod being deleted leaves its fleet (pushes its pins, answers for them): its peers must still
    follow it to learn that it is leaving and to ask it first, Ready or not, until it stops running."""
    pods = PodPeers()
    leaving = {**_pod("a", "10.0.0.1", ready=False), "metadata": {"name": "a", "deletionTimestamp": "2026-12-02T00:00:00Z"}}
    assert pods.reset([leaving]) == {"http://10.0.0.1:8081"}
    assert pods.apply("MODIFIED", {**leaving, "status": {**leaving["status"], "phase": "Succeeded"}}) == set()


@pytest.mark.parametrize("ownership", ["rendezvous", "entry"])
async def test_decided_here_is_true_exactly_when_via_owner_decides_here_with_nothing_to_wait_for(ownership):
    """The fast path serves a fleet's request only when ``via_owner`` would neither forward it nor fetch a pin."""
    from rollout_router.fleet.node import Fleet
    from rollout_router.settings import parse_settings
    me, a = ROUTERS[:2]
    balancer, now = _balancer()
    fleet_settings = parse_settings({"fleet": {"ownership": ownership}}).fleet
    assert fleet_settings is not None
    fleet = Fleet(balancer.replicas, balancer, lambda: now[0], fleet_settings, lambda: None, me,
                  "http://127.0.0.1:1", None, lambda: None)
    assert fleet.ownership == ownership
    fleet.membership.set_source(STATIC, [a])
    fleet.membership.answered(a, now=0.0)
    fleet.history.update({me}, 0.0)
    fleet.history.update({me, a}, 0.0)  # a joined a moment ago: keys may have pins at their previous owner
    for key in KEYS[:20]:  # half pinned here
        lease = balancer.acquire(key)[1]
        lease.release()
    waited: list[str] = []

    async def attempt(member) -> bool:
        waited.append("forward")
        return True

    async def fetch(key: str, believed: str | None = None) -> None:
        waited.append("fetch")

    async def lookup(key: str, peers: list[str], timeout: float) -> bool:
        waited.append("lookup")
        return True

    fleet.handoff.fetch, fleet.handoff.lookup = fetch, lookup  # type: ignore[method-assign]
    seen = set()
    for key in KEYS[:40]:
        for hopped in (False, True):
            for leaving in (False, True):
                fleet.leaving = leaving
                waited.clear()
                decided = fleet.decided_here(key, hopped)
                forwarded = await fleet.via_owner(key, hopped, attempt)
                assert decided == (not forwarded and not waited), (key, hopped, leaving, waited)
                seen.add(decided)
    assert seen == {True, False}


def _worker_fleet(siblings: list[str]):
    from rollout_router.fleet.node import Fleet
    from rollout_router.settings import FleetSettings
    balancer, now = _balancer()
    return Fleet(balancer.replicas, balancer, lambda: now[0], FleetSettings(), lambda: None, ROUTERS[0],
                 "http://127.0.0.1:1", None, lambda: None, siblings=siblings)


def test_a_worker_is_ready_once_it_sees_its_siblings_whatever_other_pods_it_sees():
    """Four workers of other pods seen are no quorum: the worker waits for its own pod's (``Fleet.quorate``)."""
    me, sibling, others = ROUTERS[0], ROUTERS[1], ROUTERS[2:6]
    fleet = _worker_fleet([sibling + "/"])
    fleet.history.update({me, *others}, 0.0)
    assert not fleet.quorate() and fleet.siblings_seen() == 0
    fleet.history.update({me, sibling, *others}, 1.0)
    assert fleet.quorate() and fleet.siblings_seen() == 1


async def test_a_leaving_worker_hands_its_pins_to_other_pods_never_to_its_siblings(monkeypatch):
    """The workers of a pod leave together: a pin handed to a sibling after it pushed its own would be lost."""
    from rollout_router.fleet import leaving
    me, sibling, others = ROUTERS[0], ROUTERS[1], ROUTERS[2:4]
    fleet = _worker_fleet([sibling])
    fleet.history.update({me, sibling, *others}, 0.0)
    for key in KEYS[:200]:
        fleet.balancer.acquire(key)[1].release()
    handed: dict[str, int] = {}

    async def push_to(_fleet, peer: str, pins: list, final: bool = False) -> dict:
        handed[peer] = len(pins)
        return {}
    monkeypatch.setattr(leaving, "push_to", push_to)
    await leaving.push(fleet)
    assert set(handed) == set(others) and sum(handed.values()) == 200


def test_a_worker_asks_who_owned_a_key_before_its_pod_joined_not_a_sibling_that_joined_with_it():
    """A new pod's workers join at once: the runner-up of a key is its owner among the pods that were there."""
    me, sibling, before = ROUTERS[0], ROUTERS[1], ROUTERS[2:5]
    history = History(me, 60.0, frozenset({sibling}))
    history.update({me, sibling, *before}, 0.0)
    keys = KEYS[:200]
    assert any(owner(key, {sibling, *before}) == sibling for key in keys)  # what a head count would have asked
    assert all(history.previous_owners(key, 1.0) == [owner(key, before)] for key in keys)


async def test_a_pin_a_leaving_peer_is_pushing_here_is_asked_of_it_first():
    """The race of a rolling update: the old router ``c`` is leaving and pushing its pins to this new one; a turn
    arrives here first. Its previous owners (the set before ``c`` left names this router, the runner-up is
    ``n1``) do not hold the pin: only ``c`` does, until its push lands. Asked first, ``c`` hands it over; asked
    not at all, the turn was placed anew and the push that landed after it was dropped."""
    me, c, n1 = ROUTERS[:3]
    balancer, now = _balancer()
    history = History(me, 60.0)
    history.update({me, c, n1}, 0.0)
    history.update({me, n1}, 1.0)  # c said it is leaving
    key = next(k for k in KEYS if owner(k, {me, c, n1}) == me and owner(k, {c, n1}) == c)
    held = {c: {key: "r2"}, n1: {}}
    asked: list[str] = []

    async def ask(peer: str, key: str, timeout: float | None) -> tuple[str, float] | None:
        asked.append(peer)
        replica = held[peer].pop(key, None)
        return None if replica is None else (replica, 1.0)

    handoff = Handoff(history, balancer, ask, lambda: now[0], leaving=lambda: [c])
    now[0] = 2.0
    assert handoff.needed(key)
    await handoff.fetch(key)
    decision, lease = balancer.acquire(key)  # the turn is routed: by the pin, or placed anew without one
    lease.release()
    assert handoff.receive([(key, "r2", 1.0)]) == 0  # c's push lands: the pin here is newer
    assert asked == [c] and decision.replica == "r2" and handoff.handoffs == 1 and handoff.replaced == 0


async def test_a_leaving_peer_that_never_owned_the_key_and_does_not_answer_is_no_loss():
    me, c, n1 = ROUTERS[:3]
    balancer, now = _balancer()
    history = History(me, 60.0)
    history.update({me, n1}, 0.0)
    key = next(k for k in KEYS if owner(k, {me, n1}) == me)

    async def ask(peer: str, key: str, timeout: float | None) -> tuple[str, float] | None:
        if peer == c:
            raise Unreachable("refused")
        return None

    handoff = Handoff(history, balancer, ask, lambda: now[0], leaving=lambda: [c])
    await handoff.fetch(key)
    assert handoff.replaced == 0 and c in handoff.gone


async def test_a_router_is_settled_once_the_pods_are_listed_and_each_was_polled_once():
    """Ready only after hearing from its fleet: before, it would place the sessions it owns with no pins."""
    import socket

    from rollout_router.fleet.node import Fleet
    from rollout_router.settings import FleetSettings
    with socket.socket() as closed:  # a loopback port nobody listens on: the poll is refused
        closed.bind(("127.0.0.1", 0))
        peer = f"http://127.0.0.1:{closed.getsockname()[1]}"
    balancer, now = _balancer()
    fleet = Fleet(balancer.replicas, balancer, lambda: now[0], FleetSettings(), lambda: None,
                  "http://127.0.0.1:2", "http://127.0.0.1:3", None, lambda: None, peer_selector="app=router")
    try:
        assert not fleet.settled()  # the pods not listed yet
        fleet.set_peers(PODS, [peer])
        assert not fleet.settled() and fleet.unasked() == 1
        async with asyncio.timeout(10):
            while not fleet.settled():
                await asyncio.sleep(0.01)
        assert fleet.unasked() == 0 and fleet.members() == {"http://127.0.0.1:2"}
        fleet.set_peers(PODS, [peer, peer.replace("127.0.0.1", "127.0.0.2")])
        assert fleet.settled() and fleet.unasked() == 1  # a pod joining later keeps it ready
    finally:
        await fleet.stop()


async def test_a_pin_pushed_to_a_peer_whose_view_names_another_owner_goes_on_to_that_owner():
    """A rolling update of pods of workers: the leaving worker sees the new pod's first worker ``c1`` but not yet
    ``c2``, and pushes ``c1`` a pin ``c2`` owns. ``c2`` would not ask ``c1`` (it joined with it), so ``c1`` does not
    take it but names ``c2``, and the leaving worker, holding the pin until then, pushes it there."""
    from rollout_router.fleet import leaving
    a, c1, c2 = ROUTERS[:3]
    key = next(k for k in KEYS if owner(k, {c1, c2}) == c2)
    pusher, receiver = _worker_fleet([]), _worker_fleet([])
    pusher.self_id, pusher.leaving = a, True
    receiver.self_id = receiver.history.self_id = c1
    pusher.history.update({a, c1}, 0.0)  # c2 not seen yet
    receiver.history.update({c1, c2}, 0.0)
    receiver.membership.set_source(STATIC, [c2])
    receiver.membership.peers[c2].live = True
    pusher.balancer.adopt(key, "r2")
    bodies: list[tuple[str, dict]] = []

    async def call(method: str, url: str, body: dict | None = None, timeout: float | None = None) -> dict:
        bodies.append((url, body or {}))
        pins = [(p["key"], p["replica"], p["idleSeconds"]) for p in (body or {})["pins"]]
        if url.startswith(c1):
            adopted, elsewhere = receiver.adopt(pins, a, body["redirect"])
            return {"adopted": adopted, "elsewhere": elsewhere}
        assert url.startswith(c2)
        return {"adopted": len(pins), "elsewhere": {}}
    pusher.client.call = call  # type: ignore[method-assign]
    assert await leaving.push(pusher) == 0  # handed over, to the owner
    assert [url for url, _ in bodies] == [f"{c1}/fleet/v1/adopt", f"{c2}/fleet/v1/adopt"]
    assert receiver.balancer.pinned(key) is None and receiver.handoff.handoffs == 0  # c1 never held it
    assert pusher.balancer.pinned(key) is None and pusher.pushed == 1
    adopted, elsewhere = receiver.adopt([(key, "r2", 0.0)], a, False)  # the last round: c1 must take it
    assert adopted == 1 and not elsewhere and receiver.balancer.pinned(key) == "r2"


async def another_router(app) -> tuple:
    """``app`` (aiohttp) on a loopback port, standing in for another router: its runner and its port."""
    from aiohttp import web
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


async def test_a_peer_that_answers_one_document_is_one_item_of_the_watch_then_its_end():
    """A router of an earlier version ignores ``?watch``: its one answer is read as one line, and the watch ends
    (``Fleet._poll`` asks again a poll interval later, as it polled before)."""
    from aiohttp import web

    from rollout_router.fleet.client import PeerClient

    async def loads(request: web.Request) -> web.Response:
        return web.json_response({"id": "old", "loads": {"r1": 2}})
    app = web.Application()
    app.router.add_get("/fleet/v1/loads", loads)
    runner, port = await another_router(app)
    client = PeerClient(lambda: None, 5.0)
    try:
        documents = [d async for d in client.watch(f"http://127.0.0.1:{port}/fleet/v1/loads?watch=0.1&heartbeat=1")]
        assert documents == [{"id": "old", "loads": {"r1": 2}}]
        await runner.cleanup()
        with pytest.raises(Unreachable):
            [d async for d in client.watch(f"http://127.0.0.1:{port}/fleet/v1/loads?watch=0.1&heartbeat=1")]
    finally:
        await client.close()
        await runner.cleanup()


async def test_a_pin_pulled_while_its_push_was_redirected_is_not_pushed_a_second_copy():
    """Between the rounds of a push the new owner may pull the pin itself (it asks leaving routers first): the
    next round pushes only what is still held here, so no second router holds it."""
    from rollout_router.fleet import leaving
    a, c1, c2 = ROUTERS[:3]
    key = next(k for k in KEYS if owner(k, {c1, c2}) == c2)
    pusher = _worker_fleet([])
    pusher.self_id, pusher.leaving = a, True
    pusher.history.update({a, c1}, 0.0)
    pusher.balancer.adopt(key, "r2")
    urls: list[str] = []

    async def call(method: str, url: str, body: dict | None = None, timeout: float | None = None) -> dict:
        urls.append(url)
        assert pusher.balancer.surrender(key) == "r2"  # c2's pull, answered while c1 was saying whose it is
        return {"adopted": 0, "elsewhere": {key: c2}}
    pusher.client.call = call  # type: ignore[method-assign]
    assert await leaving.push(pusher) == 0
    assert urls == [f"{c1}/fleet/v1/adopt"] and pusher.pushed == 0


def test_an_adopt_tells_the_receiver_that_the_pusher_is_leaving():
    me, a = ROUTERS[:2]
    receiver = _worker_fleet([])
    receiver.history.update({me, a}, 0.0)
    receiver.membership.set_source(STATIC, [a])
    receiver.membership.peers[a].live = True
    receiver.adopt([("k", "r1", 0.0)], a, True)
    assert receiver.membership.peers[a].leaving and a not in receiver.members()


def _fleet_of_one_peer():
    """A worker's fleet with one static peer, ``ROUTERS[1]``, that has not answered yet: (fleet, peer, member)."""
    peer = ROUTERS[1]
    fleet = _worker_fleet([])
    fleet.membership.set_source(STATIC, [peer])
    member = fleet.membership.peers[peer]
    member.http = "http://127.0.0.1:1"
    return fleet, peer, member


def test_a_peer_saying_it_is_not_leaving_after_it_left_is_a_new_router_there():
    fleet, peer, member = _fleet_of_one_peer()
    fleet._loads_answered(member, {"loads": {}, "leaving": False})
    fleet._loads_answered(member, {"loads": {}, "leaving": True})
    fleet.peer_leaving(peer, done=True)
    assert member.leaving and peer in fleet.handoff.departed and peer not in fleet.members()
    fleet._loads_answered(member, {"loads": {}, "leaving": False})  # restarted within the peer timeout
    assert not member.leaving and peer not in fleet.handoff.departed and peer in fleet.members()


def test_a_previous_owner_that_missed_one_question_is_asked_again_once_it_answers_a_poll():
    """One timeout (a slow moment, a reset keep-alive connection) made a live peer 'gone' until it left the fleet:
    every session it held was then placed anew and counted replaced, its pins ignored."""
    fleet, peer, member = _fleet_of_one_peer()
    fleet._loads_answered(member, {"loads": {}, "leaving": False})
    fleet.handoff.gone.add(peer)  # as ``Handoff._fetch`` does when asking it fails
    fleet._loads_answered(member, {"loads": {"http://r1:8000": 3}, "leaving": False})
    assert peer not in fleet.handoff.gone and peer in fleet.members()


def test_a_peers_negative_load_counts_as_none():
    fleet, peer, member = _fleet_of_one_peer()
    fleet._loads_answered(member, {"loads": {"http://r1:8000": -1_000_000, "http://r2:8000": 2}, "leaving": False})
    assert member.loads == {"http://r1:8000": 0, "http://r2:8000": 2}


def test_a_peers_load_beyond_what_a_replica_can_hold_is_clamped():
    from rollout_router.fleet.node import MAX_PEER_LOAD
    from rollout_router.replicas import ReplicaSet

    fleet, peer, member = _fleet_of_one_peer()
    fleet._loads_answered(member, {"loads": {"http://r1:8000": 10 ** 30}, "leaving": False})
    assert member.loads == {"http://r1:8000": MAX_PEER_LOAD}
    replicas = ReplicaSet()  # the sum over many such peers still counts
    replicas.add("http://r1:8000")
    replicas.set_external("http://r1:8000", 64 * MAX_PEER_LOAD)
    assert replicas.loads()["http://r1:8000"] == 64 * MAX_PEER_LOAD


@pytest.mark.parametrize("fleet", [{"pollIntervalSeconds": 0.25, "peerTimeoutSeconds": 0.5},
                                   {"pollIntervalSeconds": 0.001}, {"peerTimeoutSeconds": 31}])
def test_fleet_timing_is_checked(fleet):
    from pydantic import ValidationError

    from rollout_router.settings import FleetSettings
    with pytest.raises(ValidationError):
        FleetSettings.model_validate(fleet)


async def test_peers_watching_at_one_interval_share_one_line_a_tick(monkeypatch):
    """A member is watched by every other one: the loads are serialised once a tick for all its watchers, so
    being watched does not cost a member more per peer than writing the line to it."""
    from rollout_router.fleet.client import PeerClient
    from rollout_router.proxy import fleet_routes
    from rollout_router.settings import FleetSettings, RouterSettings
    from tests.support import ScriptedReplica, running_router

    built = []
    real = fleet_routes._loads

    def counted(context, fleet):
        built.append(asyncio.get_running_loop().time())
        return real(context, fleet)
    monkeypatch.setattr(fleet_routes, "_loads", counted)
    replica = await ScriptedReplica("127.0.0.10").start()
    client, watchers, every = PeerClient(lambda: None, 5.0), 8, 0.02
    try:
        async with running_router(RouterSettings(backends=[replica.url],
                                                 fleet=FleetSettings(peers=["http://127.0.3.1:9"]))) as (_, runtime):
            async def heartbeats(count: int) -> None:
                url = f"{runtime.admin_url}/fleet/v1/loads?watch={every}&heartbeat=0.1"
                async with contextlib.aclosing(client.watch(url)) as lines:
                    async for _ in lines:
                        count -= 1
                        if count == 0:
                            return
            await asyncio.gather(*(heartbeats(5) for _ in range(watchers)))  # about 0.4 s of ticks
    finally:
        await client.close()
        await replica.stop()
    ticks = (built[-1] - built[0]) / every
    assert ticks > 10 and len(built) <= ticks + 2 + watchers, (len(built), ticks)  # not watchers x ticks


async def test_a_router_holds_at_most_per_peer_connections_to_another():
    """Calls to one peer beyond ``PER_PEER`` at once wait for a connection instead of opening more: the admin
    listener there keeps room for that many per candidate peer, so a burst of handoffs never fills it."""
    from aiohttp import web

    from rollout_router.fleet.client import PER_PEER, PeerClient
    from tests.support import wait_for

    connections, release = set(), asyncio.Event()  # every connection a call came by

    async def slow(request: web.Request) -> web.Response:
        connections.add(request.transport)
        await release.wait()
        return web.json_response({"ok": True})
    app = web.Application()
    app.router.add_post("/fleet/v1/handoff", slow)
    runner, port = await another_router(app)
    client = PeerClient(lambda: None, 10.0)
    try:
        calls = [asyncio.ensure_future(client.call("POST", f"http://127.0.0.1:{port}/fleet/v1/handoff", {"key": i}))
                 for i in range(3 * PER_PEER)]
        await wait_for(lambda: len(connections) >= PER_PEER)
        release.set()
        assert await asyncio.gather(*calls) == [{"ok": True}] * (3 * PER_PEER)
        assert len(connections) == PER_PEER
    finally:
        release.set()
        await client.close()
        await runner.cleanup()

"""The decision channel between ``serve --workers N`` workers (proxy/decisions.py), over a real Unix socket.

The owner's side is a ``DecisionService`` whose routing is scripted here (what it routes with is the router's
own ``route``, exercised by the workers' tests in test_multicore.py); the framing, the answers, the leases
held and released, the timeouts and the lost channels are the real ones.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest

from rollout_router.core.tallies import HistogramChild
from rollout_router.proxy import decisions
from rollout_router.proxy.attempts import route
from rollout_router.proxy.decisions import DecisionClient, DecisionService, message
from rollout_router.proxy.http.connection.upstream import ReplicaPool
from rollout_router.proxy.http.forwarding.delegated import Delegated, LaneAsked
from rollout_router.proxy.outcome import put_back, routed
from rollout_router.proxy.turns import Turn
from rollout_router.settings import HealthSettings, RouterSettings
from tests.support import ScriptedReplica, running_router, wait_for
from tests.test_http_fast import metrics_text

SIBLING = "http://127.0.0.1:9"


class Lease:
    """One routed replica's hold, as the fake replica set sees it: how many times it was put back."""

    def __init__(self, replica: str) -> None:
        self.id = replica
        self.released = 0


class Replicas:
    """The owner's replica set, counting what is put back."""

    def put(self, lease: Lease) -> None:
        lease.released += 1


class ScriptedService(DecisionService):
    """Routes every key to ``replica`` (None: "decide it yourself"); records what it is told."""

    def __init__(self, replica: str | None = "http://replica-a") -> None:
        super().__init__(type("Context", (), {"replicas": Replicas()})())  # type: ignore[arg-type]  # all it reads
        self.replica = replica
        self.leases: list[Lease] = []
        self.asked: list[tuple[str, str | None]] = []
        self.ended: list[tuple[str | None, bool, int, str | None, bool] | tuple[str, str]] = []

    def decide(self, key, group):
        self.asked.append((key, group))
        if self.replica is None:
            return None
        self.leases.append(Lease(self.replica))
        return routed(key, group, object(), self.leases[-1], Turn("kept", None, True))  # type: ignore[arg-type]

    def finished(self, routing, accepted, status, failure, refused=False):
        put_back(self.context.replicas, routing)
        self.ended.append((routing.key, accepted, status, failure, refused))

    def abandoned(self, routing):
        put_back(self.context.replicas, routing)
        self.ended.append(("abandoned", routing.replica.id))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "owner.sock"


@contextlib.asynccontextmanager
async def channel(path: Path, service: ScriptedService | None = None):
    """A scripted owner listening at ``path`` and an entry's client with the channel to it open."""
    service = service or ScriptedService()
    await service.start(path)
    clock = Clock()
    client = DecisionClient({SIBLING: path}, clock, lambda: 1.0)
    try:
        await opened(client)
        yield service, client, clock
    finally:
        client.close()
        service.close()


async def opened(client: DecisionClient) -> None:
    """The first ask opens the channel (and relays); wait until an ask goes through it."""
    assert client.ask(SIBLING, "warm-up", None, lambda ident, routing: None) is None
    await wait_for(lambda: SIBLING in client._ends)


async def answer_of(client: DecisionClient, key: str, group: str | None = None):
    """(the channel asked on, the decision's id, its routing)."""
    got: asyncio.Future = asyncio.get_running_loop().create_future()
    end = client.ask(SIBLING, key, group, lambda i, routing: got.set_result((i, routing)))
    assert end is not None
    ident, routing = await asyncio.wait_for(got, 5)
    return end, ident, routing


@pytest.mark.parametrize("key", ["conversation\t\n\x00-é-\udcff",  # body-field keys hold what JSON strings can
                                 "\udcff" * 21845, "k" * 65535, "é" * 65536])  # 65,535 bytes and more
def test_messages_frame_any_key_and_absent_fields_however_the_bytes_are_cut(key):
    data = message(decisions.DECIDE, 7, decisions.text(key), None) + message(decisions.NOT_HERE, 8)
    received = []

    class Recorder(decisions.Channel):
        def received(self, kind, ident, fields):
            received.append((kind, ident, fields))

    end = Recorder()
    step = 1 if len(data) < 1000 else 4099  # one byte at a time: every split of a header and a field
    for at in range(0, len(data), step):
        end.data_received(data[at:at + step])
    assert received == [(decisions.DECIDE, 7, [decisions.text(key), None]), (decisions.NOT_HERE, 8, [])]
    assert decisions.untext(received[0][2][0]) == key


async def test_an_owner_routes_the_key_holds_the_lease_and_is_told_how_it_ended(socket_path):
    async with channel(socket_path) as (service, client, _):
        end, ident, routing = await answer_of(client, "conversation-1", "group-1")
        replica, turn = routing
        assert (replica, turn.outcome, turn.reason, turn.measure) == ("http://replica-a", "kept", None, True)
        assert service.asked[-1] == ("conversation-1", "group-1")
        assert service.leases[-1].released == 0  # in flight in the owner's count until it is told
        end.finished(ident, False, 503, "http_5xx")
        await wait_for(lambda: service.ended)
        assert service.ended == [("conversation-1", False, 503, "http_5xx", False)]
        assert service.leases[-1].released == 1
        end.finished(ident, True)  # again, or an id this channel never gave: ignored, the channel stays
        _, _, routing = await answer_of(client, "conversation-2")
        assert routing is not None and len(service.ended) == 1 and end.open()


async def test_an_owner_that_cannot_decide_at_once_sends_the_request_to_relay(socket_path):
    async with channel(socket_path, ScriptedService(replica=None)) as (_, client, _):
        _, _, routing = await answer_of(client, "conversation-1")
        assert routing is None


async def test_without_an_open_channel_the_request_relays_and_the_channel_opens_for_the_next(socket_path):
    clock = Clock()
    client = DecisionClient({SIBLING: socket_path}, clock, lambda: 1.0)
    assert client.ask(SIBLING, "k", None, lambda ident, routing: None) is None  # nobody listens yet
    service = ScriptedService()
    await service.start(socket_path)
    try:
        await asyncio.sleep(0)
        assert client.ask(SIBLING, "k", None, lambda ident, routing: None) is None  # not asked again within 1 s
        clock.now += decisions.RECONNECT_SECONDS
        await opened(client)
        assert client.ask(SIBLING, "unknown", None, lambda ident, routing: None) is not None
        assert client.ask("http://127.0.0.1:10", "k", None, lambda ident, routing: None) is None  # no such sibling
    finally:
        client.close()
        service.close()


async def test_an_answer_not_come_in_time_relays_and_its_late_lease_is_released_at_once(socket_path):
    async with channel(socket_path) as (service, client, clock):
        end = client._ends[SIBLING]
        end.transport.pause_reading()  # the owner's answer waits in the socket, as a busy owner's would
        answers = []
        client.ask(SIBLING, "slow", None, lambda ident, routing: answers.append(routing))
        await wait_for(lambda: service.leases)
        client.sweep()
        assert answers == []  # within the timeout
        clock.now += 1.5
        client.sweep()
        assert answers == [None]  # given up: the request relays
        end.transport.resume_reading()
        await wait_for(lambda: service.ended)
        assert service.ended == [("abandoned", "http://replica-a")] and service.leases[-1].released == 1
        assert answers == [None]


async def test_a_lost_channel_relays_what_was_asked_and_releases_what_was_held(socket_path):
    async with channel(socket_path) as (service, client, _):
        await answer_of(client, "held")  # routed, its request out: the owner holds the lease
        end = client._ends[SIBLING]
        end.transport.pause_reading()
        answers = []
        client.ask(SIBLING, "asked", None, lambda ident, routing: answers.append(routing))
        await wait_for(lambda: len(service.leases) == 2)
        end.transport.abort()  # the entry worker's end goes (as when either worker dies)
        await wait_for(lambda: answers)
        assert answers == [None]
        await wait_for(lambda: all(lease.released == 1 for lease in service.leases))
        assert service.ended == []  # released, not finished: the pins stay as they are
        assert SIBLING not in client._ends


async def test_a_message_the_channel_does_not_know_closes_it(socket_path):
    service = ScriptedService()
    await service.start(socket_path)
    try:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        writer.write(message(ord("X"), 1, b"what") + message(decisions.DECIDE, 2, b"k", None))  # one write
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, with nothing said
        assert service.asked == []  # nothing after the unknown message was read
        writer.close()
    finally:
        service.close()


async def test_the_owner_told_of_an_ending_counts_it_in_passive_health_releases_and_forgets_as_its_own():
    """``DecisionService`` on a real router: what a sibling says of its attempt does what this router's own
    attempt would (``outcome.settled``)."""
    replica = await ScriptedReplica("127.0.0.20").start()
    health = HealthSettings(probe_interval_seconds=None, consecutive_5xx=2, max_ejection_percent=100)
    settings = RouterSettings(backends=[replica.url], health=health)
    try:
        async with running_router(settings) as (_, runtime):
            service = DecisionService(runtime)
            assert service.decide("conversation-1", None) is None  # no fleet: nothing to own, the relay decides
            routed = route(runtime, "conversation-2")
            service.finished(routed, False, 0, None)  # not accepted: the new pin is handed back
            assert runtime.balancer.pinned("conversation-2") is None
            for status in (200, 503, 503):
                routed = route(runtime, "conversation-1")
                assert runtime.replicas.total_inflight() == 1  # the lease a sibling's request holds
                service.finished(routed, status < 400, status, None)
                assert runtime.replicas.total_inflight() == 0
            assert runtime.balancer.pinned("conversation-1") == replica.url  # accepted once: the pin stays
            assert runtime.replicas.why_unroutable(replica.url) == "ejected"  # two 5xx in a row
    finally:
        await replica.stop()


async def test_a_decision_answered_too_late_ends_its_lease_and_leaves_the_pin_the_relayed_turn_uses():
    replica = await ScriptedReplica("127.0.0.20").start()
    try:
        async with running_router(RouterSettings(backends=[replica.url])) as (_, runtime):
            service = DecisionService(runtime)
            late = route(runtime, "conversation")  # a new pin, answered after the sibling gave up waiting,
            relayed = route(runtime, "conversation")  # which relayed the request: decided again, on that pin
            service.abandoned(late)
            assert runtime.replicas.total_inflight() == 1  # the relayed request's lease alone
            put_back(runtime.replicas, relayed)
            assert runtime.balancer.pinned("conversation") == replica.url  # the pin the relayed turn used stays
    finally:
        await replica.stop()



def quiet_metrics() -> object:
    """A stand-in for the router's ``Metrics`` that records nothing: what an answer's record calls."""
    margin = type("MarginMeter", (), {"kept_first_byte": HistogramChild((1.0,))})()
    return type("Metrics", (), {"observe": lambda *a: None, "turn": lambda *a: None, "margin": margin})()

def test_an_abandoned_decision_is_counted_as_such():
    """It stays in the decision counters (the relayed request is decided again), so the overcount is counted."""
    fleet = type("Fleet", (), {"abandoned": 0})()
    replicas, lease = Replicas(), Lease("http://replica-a")
    service = DecisionService(type("Context", (), {"fleet": fleet, "replicas": replicas})())  # type: ignore[arg-type]
    service.abandoned(routed("k", None, object(), lease, Turn("new", None, False)))  # type: ignore[arg-type]
    assert lease.released == 1 and fleet.abandoned == 1


async def test_an_owner_told_its_replica_refused_the_connection_marks_it_down_and_counts_the_retry():
    replica = await ScriptedReplica("127.0.0.20").start()
    settings = RouterSettings(backends=[replica.url], health=HealthSettings(probe_interval_seconds=None))
    try:
        async with running_router(settings) as (_, runtime):
            service = DecisionService(runtime)
            routed = route(runtime, "conversation-1")
            service.finished(routed, False, 0, None, refused=True)
            assert runtime.replicas.why_unroutable(replica.url) == "down"
            assert runtime.replicas.total_inflight() == 0 and runtime.balancer.pinned("conversation-1") is None
            assert f'rolloutrouter_upstream_retries_total{{backend="{replica.url}"}} 1.0' in await metrics_text(runtime)
    finally:
        await replica.stop()


class Entry:
    """What a ``Delegated`` request uses of its listener, its client and the channel it asked on, recorded."""

    def __init__(self) -> None:
        self.context = type("Context", (), {"fleet": type("Fleet", (), {"delegated": 0, "leaving": False})()})()
        self.answering_here, self.relayed, self.told = 1, 0, []  # the fast path counted it in ``answering``
        self.gone, self.loop = False, asyncio.get_running_loop()

    pools = property(lambda self: type("Pools", (), {"get": staticmethod(ReplicaPool)})())
    answering = property(lambda self: self.answering_here)  # ``HttpProxy.answering``, with no lane

    async def handle(self, client, request) -> None:
        self.relayed += 1

    def answer_later(self, request, answering) -> None:
        self.loop.create_task(answering)

    def open(self) -> bool:
        return True

    def finished(self, ident, accepted, status=0, failure=None, refused=False) -> None:
        self.told.append((ident, accepted, status, failure, refused))


async def test_a_delegated_request_whose_replica_refuses_relays_and_is_counted_forwarded_not_delegated_too():
    """Refused, the entry tells the owner (which marks the replica down) and relays the request: the relay
    counts it as forwarded, so it must not be counted as delegated as well."""
    closed = socket.socket()  # bound, not listening: a connection to it is refused
    closed.bind(("127.0.0.1", 0))
    try:
        entry = Entry()
        delegated = Delegated(entry, entry, object())  # type: ignore[arg-type]  # the parts it uses
        delegated.end = entry  # type: ignore[assignment]
        delegated.decided(5, (f"http://127.0.0.1:{closed.getsockname()[1]}", Turn("kept", None, False)))
        await wait_for(lambda: entry.relayed == 1)
        assert entry.told == [(5, False, 0, None, True)] and entry.answering == 0
        assert entry.context.fleet.delegated == 0
    finally:
        closed.close()


async def test_a_delegated_request_whose_client_left_is_answered_here_and_counted_delegated():
    entry = Entry()
    entry.gone = True
    answered = []
    entry.answered = answered.append  # type: ignore[attr-defined]
    entry.context.metrics = quiet_metrics()
    delegated = Delegated(entry, entry, "request")  # type: ignore[arg-type]
    delegated.end = entry  # type: ignore[assignment]
    delegated.decided(6, ("http://127.0.0.1:9", Turn("kept", None, False)))
    assert answered == ["request"] and entry.relayed == 0 and entry.told == [(6, True, 0, None, False)]
    assert entry.context.fleet.delegated == 1 and entry.answering == 0


class LaneClient:
    """What a ``LaneAsked`` request uses of the lane's client connection (``_lane.Client``), recorded."""

    def __init__(self, gone: bool = False) -> None:
        self.gone, self.sent, self.relayed = gone, [], 0

    def routed(self, pool, measure, token) -> None:
        self.sent.append((pool, measure, token))

    def relay(self) -> None:
        self.relayed += 1


def lane_asked(entry: Entry, client: LaneClient) -> LaneAsked:
    asked = LaneAsked(entry, client, lambda replica: f"pool of {replica}")  # type: ignore[arg-type]
    asked.end = entry  # type: ignore[assignment]
    return asked


async def test_a_lane_request_a_sibling_routes_is_sent_by_the_lane_and_its_end_told_to_the_owner():
    entry, client = Entry(), LaneClient()
    entry.context.metrics = quiet_metrics()
    asked = lane_asked(entry, client)
    asked.decided(7, ("http://127.0.0.1:9", Turn("kept", None, False)))
    assert client.sent == [("pool of http://127.0.0.1:9", False, asked)] and entry.told == []
    asked.finish(200, 200, None, True, 0.0, None, 1.0)  # what LaneGlue.finish passes on (200: accepted)
    assert entry.told == [(7, True, 200, None, False)]
    assert entry.context.fleet.delegated == 1 and entry.answering == 0


async def test_a_lane_request_a_sibling_would_not_route_is_relayed_by_the_python_path():
    entry, client = Entry(), LaneClient()
    lane_asked(entry, client).decided(8, None)
    assert client.relayed == 1 and client.sent == [] and entry.answering == 0  # ``handle`` counts it again


async def test_a_lane_request_a_sibling_decided_whose_replica_refuses_tells_the_owner_and_is_not_counted_delegated():
    entry, client = Entry(), LaneClient()
    asked = lane_asked(entry, client)
    asked.decided(9, ("http://127.0.0.1:9", Turn("kept", None, False)))
    asked.refused(ConnectionRefusedError())  # then the lane hands it over, to relay (LaneGlue.hand_over)
    assert entry.told == [(9, False, 0, None, True)] and entry.answering == 0
    assert entry.context.fleet.delegated == 0


async def test_a_lane_request_a_sibling_decided_whose_client_left_is_answered_here_and_counted_delegated():
    entry, client = Entry(), LaneClient(gone=True)
    entry.context.metrics = quiet_metrics()
    lane_asked(entry, client).decided(10, ("http://127.0.0.1:9", Turn("kept", None, False)))
    assert client.sent == [] and entry.told == [(10, True, 0, None, False)]
    assert entry.context.fleet.delegated == 1 and entry.answering == 0

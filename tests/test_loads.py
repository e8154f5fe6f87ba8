"""The load index the router routes from agrees with a plain scan of the replica set, whatever happens."""
from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rollout_router.policy import LoadIndex, Request, create
from rollout_router.policy.hashing import least_loaded, lowest, ordered, tie_break, total
from rollout_router.policy.registry import SELECTABLE, options
from rollout_router.replicas import ReplicaSet

R = [f"http://r{i}" for i in range(5)]

index_ops = st.lists(st.tuples(st.sampled_from(["set", "discard"]), st.sampled_from(R), st.integers(0, 6)),
                     max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=index_ops, key=st.text(max_size=8))
def test_load_index_is_the_mapping_it_was_told_with_its_minimum(ops, key):
    index, model = LoadIndex(), {}
    for op, replica, load in ops:
        names = index.ordered()
        if op == "set":
            joins = replica not in model
            index.set(replica, load)
            model[replica] = load
        else:
            joins = replica in model  # a leave changes membership too
            index.discard(replica)
            model.pop(replica, None)
        assert dict(index) == model and len(index) == len(model)
        assert index.total() == total(model) == sum(model.values())
        assert index.ordered() == tuple(ordered(model)) == tuple(sorted(model))
        assert joins or index.ordered() is names  # same membership: the very same tuple, for caches
        if model:
            assert index.min() == lowest(model) == min(model.values())
            assert index.tied() == sorted(r for r, load in model.items() if load == index.min())
            assert least_loaded(index, key) == tie_break(key, index.tied())
            assert least_loaded(index, key) == least_loaded(model, key)  # the router's choice is the simulator's


moves = st.lists(st.one_of(
    st.tuples(st.sampled_from(["set", "move"]), st.sampled_from(R), st.integers(0, 6)),
    st.tuples(st.just("discard"), st.sampled_from(R), st.just(0)), st.tuples(st.just("read"), st.text(max_size=4),
                                                                            st.just(0)),
), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops=moves)
def test_moves_between_reads_are_filed_when_the_minimum_is_read(ops):
    """Moves are filed by load only when ``min``/``least``/``total`` read the index: whatever moved between reads
    (a replica's start and end of a request, moves back and forth, a leave), a read sees what a scan sees."""
    index, model = LoadIndex(), {}
    for op, arg, load in ops:
        if op == "set":
            index.set(arg, load)
            model[arg] = load
        elif op == "move":
            index.move(arg, load)
            if arg in model:
                model[arg] = load
        elif op == "discard":
            index.discard(arg)
            model.pop(arg, None)
        elif model:
            assert index.min() == min(model.values())
            assert least_loaded(index, arg) == least_loaded(model, arg)
            assert index.total() == sum(model.values())
        assert dict(index) == model  # the mapping itself is never behind
    assert index.total() == sum(model.values())
    if model:
        assert index.min() == min(model.values())


set_ops = st.lists(st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from(R)), st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("down"), st.sampled_from(R)), st.tuples(st.just("tick"), st.integers(1, 3)),
    st.tuples(st.just("eject"), st.sampled_from(R)),
    st.tuples(st.just("remove"), st.sampled_from(R)), st.tuples(st.just("add"), st.sampled_from(R)),
), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops=set_ops)
@example(ops=[("acquire", "http://r0"), ("down", "http://r0"), ("remove", "http://r0"), ("add", "http://r0")])
@example(ops=[("acquire", "http://r0"), ("remove", "http://r0"), ("eject", "http://r0"), ("add", "http://r0")])
def test_replica_set_loads_match_a_scan_of_the_live_replicas(ops):
    now = [0.0]
    replicas = ReplicaSet(clock=lambda: now[0])
    for i, replica in enumerate(R[:3]):
        replicas.add(replica, grpc_target=f"h:{i}" if i % 2 == 0 else None)
    leases = []
    for op, arg in ops:
        if op == "acquire" and arg in replicas:
            leases.append(replicas.acquire(arg))
        elif op == "release" and leases:
            leases.pop(arg % len(leases)).release()
        elif op == "down":
            replicas.mark_down(arg, 2.0)
        elif op == "eject":  # a live replica, or one draining (a lease holds it), then maybe added back
            held = next((lease.replica for lease in leases if lease.replica.id == arg), None)
            if (target := replicas.get(arg) or held) is not None:
                replicas.eject(target, 3.0)
        elif op == "tick":
            now[0] += arg
        elif op == "remove":
            replicas.remove(arg)
        elif op == "add":
            replicas.add(arg, grpc_target="h:9" if arg.endswith(("0", "4")) else None)
        for grpc in (False, True):
            scan = {r.id: r.inflight for r in replicas.replicas()
                    if r.down_until <= now[0] and (r.grpc_target is not None or not grpc)}
            assert dict(replicas.loads(grpc)) == scan
        assert replicas.ejected() == sum(1 for r in replicas.replicas() if r.ejected_until > now[0])


def test_routing_looks_over_the_replicas_marked_down_only_once_a_mark_down_has_ended(monkeypatch):
    """Replicas that refused connections are out of rotation for a while; routing (``loads``, every request) looks
    them over to put back those whose time is over only once one is, not on every request (in an outage of half
    a large fleet that look was most of a decision's cost)."""
    now = [0.0]
    replicas = ReplicaSet(clock=lambda: now[0])
    for i in range(8):
        replicas.add(f"http://r{i}")
    for i in range(4):
        replicas.mark_down(f"http://r{i}", 10.0 + i)
    looks: list[float] = []
    revive = replicas._revive
    monkeypatch.setattr(replicas, "_revive", lambda at: looks.append(at) or revive(at))
    for _ in range(100):
        assert len(replicas.loads()) == 4
    assert looks == []
    now[0] = 10.5
    assert "http://r0" in replicas.loads() and "http://r1" not in replicas.loads()
    assert looks == [10.5]  # the next mark-down ends at 11
    now[0] = 13.0
    assert len(replicas.loads()) == 8 and len(replicas.loads(grpc=False)) == 8
    assert looks == [10.5, 13.0]


@pytest.mark.parametrize("policy", SELECTABLE)
def test_routing_cost_does_not_grow_with_the_fleet(policy):
    """The decision at 1,024 idle replicas touches the same few entries as at 16 (counted, not timed).

    Keyed and unkeyed requests, each key seen twice (a new session, then a sticky hit).
    """
    for size in (16, 1024):
        replicas = ReplicaSet(clock=lambda: 0.0)
        for i in range(size):
            replicas.add(f"http://r{i}")
        routing = create(policy, margin=2) if "margin" in options(policy) else create(policy)
        counting = _CountingIndex(replicas.loads())
        keys = [f"k{i % 25}" for i in range(50)] + [None] * 10
        for key in keys:
            routing.route(Request(key, counting, 0.0))
        assert counting.reads <= len(keys) * 4, (policy, size, counting.reads)


@settings(max_examples=100, deadline=None)
@given(loads=st.dictionaries(st.sampled_from(R), st.integers(0, 6), min_size=1), keys=st.lists(st.text(max_size=4),
                                                                                                 max_size=8))
def test_policies_choose_the_same_from_an_index_as_from_a_plain_mapping(loads, keys):
    """The router (a LoadIndex) and the simulator (a dict) must get the same decision from every policy."""
    index = LoadIndex()
    for replica, load in loads.items():
        index.set(replica, load)
    for name in ("consistent_hash", "round_robin", "power_of_two"):
        live, plain = create(name), create(name)
        for key in [*keys, None]:
            assert live.route(Request(key, index, 0.0)).replica == plain.route(Request(key, loads, 0.0)).replica


class _CountingIndex:
    """A LoadIndex wrapper that counts entries read through the Mapping interface (a full scan reads them all)."""

    def __init__(self, index: LoadIndex):
        self._index, self.reads = index, 0

    def __getitem__(self, replica):
        self.reads += 1
        return self._index[replica]

    def __contains__(self, replica):
        return replica in self._index

    def __iter__(self):
        for replica in self._index:
            self.reads += 1
            yield replica

    def __len__(self):
        return len(self._index)

    def values(self):
        return (self[r] for r in self)

    def items(self):
        return ((r, self[r]) for r in self)

    def min(self):
        return self._index.min()

    def tied(self):
        return self._index.tied()

    def total(self):
        return self._index.total()

    def ordered(self):
        return self._index.ordered()

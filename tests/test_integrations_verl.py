"""AffinityLoadBalancer against the contract of verl's load balancer, in this process.

The contract is what verl's ``RequestLoadBalancer`` protocol and ``GlobalRequestLoadBalancer``
promise to their callers (verl 0.9.1): a server per request id, sticky across turns; least-loaded
placement of new ids; counted in-flight requests released floor-zero; servers added and removed
at run time, a pin to a removed server re-placed; an empty pool failing with verl's own message;
``clear_sticky_cache`` dropping pins and reporting loads. On top of it: the margin rule, rendezvous
placement under full determinism, LRU and idle bounds, and the counters in ``get_status``.
test_integrations_verl_ray.py drives the same class through verl's own code over Ray.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from rollout_router.integrations.verl import NO_SERVERS, AffinityLoadBalancer


def balancer(*server_ids: str, **options) -> AffinityLoadBalancer:
    """A balancer over ``server_ids``; each handle is a distinct object, as verl's actor handles are."""
    return AffinityLoadBalancer({sid: object() for sid in server_ids}, **options)


def acquire(lb: AffinityLoadBalancer, request_id: str) -> str:
    return lb.acquire_server(request_id=request_id)[0]


def test_acquire_returns_the_registered_handle_and_counts_it_in_flight():
    handles = {"s0": object(), "s1": object()}
    lb = AffinityLoadBalancer(handles)
    server_id, handle = lb.acquire_server(request_id="traj-1")
    assert handle is handles[server_id]
    assert lb.get_inflight_count(server_id) == 1
    assert lb.get_total_inflight() == 1
    assert lb.get_status()["servers"] == {sid: int(sid == server_id) for sid in handles}


def test_new_trajectories_spread_and_go_to_the_least_loaded_server():
    lb = balancer("s0", "s1", "s2")
    assert sorted(acquire(lb, f"traj-{i}") for i in range(3)) == ["s0", "s1", "s2"]
    busy = acquire(lb, "traj-0")  # a second turn in flight on traj-0's server
    quiet = {"s0", "s1", "s2"} - {busy}
    assert acquire(lb, "traj-new") in quiet


def test_turns_of_a_trajectory_stay_on_its_server_by_default():
    lb = balancer("s0", "s1", "s2", "s3")
    first = acquire(lb, "conv")
    for _ in range(5):  # every turn kept in flight: its server is now far busier than the rest
        assert acquire(lb, "conv") == first
    assert lb.get_status()["affinity_kept"] == 5
    assert lb.get_status()["affinity_broken"] == 0


def test_release_decrements_floor_zero_and_ignores_unknown_servers():
    lb = balancer("s0", "s1")
    server = acquire(lb, "a")
    lb.release_server(server_id=server, request_id="a")
    lb.release_server(server_id=server)  # one release too many stays at zero
    lb.release_server(server_id="gone")
    assert lb.get_status()["servers"] == {"s0": 0, "s1": 0}
    assert lb.get_total_inflight() == 0


def test_release_server_keeps_the_pin_for_the_next_turn():
    lb = balancer("s0", "s1")
    first = acquire(lb, "conv")
    acquire(lb, "conv")
    lb.release_server(server_id=first, request_id="conv")  # conv's server: 1 in flight, the other 0
    assert acquire(lb, "conv") == first
    assert lb.get_status()["sessions"] == 1


@pytest.mark.parametrize(("margin", "moves"), [(0, True), (1, False)])
def test_a_pin_is_broken_only_beyond_the_margin(margin, moves):
    lb = balancer("s0", "s1", affinity_break_margin=margin)
    first = acquire(lb, "conv")
    second = acquire(lb, "conv")  # its server has 1 in flight, the other 0: a skew of 1
    assert (second != first) is moves
    status = lb.get_status()
    assert (status["affinity_kept"], status["affinity_broken"]) == ((0, 1) if moves else (1, 0))
    assert status["affinity_break_margin"] == margin
    if moves:
        assert acquire(lb, "conv") == second  # re-pinned: the next turn follows it


def test_full_determinism_places_by_id_and_server_set_only():
    ids = [f"traj-{i}" for i in range(40)]
    in_order = balancer("s0", "s1", "s2", full_determinism=True, affinity_break_margin=0)
    reordered = balancer("s2", "s0", "s1", full_determinism=True)
    for rid in ids[:10]:  # load reordered's servers unevenly before it sees the same ids
        acquire(reordered, f"noise-{rid}")
    placed = {rid: acquire(in_order, rid) for rid in ids}
    assert {rid: acquire(reordered, rid) for rid in reversed(ids)} == placed
    assert len(set(placed.values())) == 3
    for rid in ids:  # every pin is kept whatever the skew: the margin is ignored
        assert acquire(in_order, rid) == placed[rid]
    assert in_order.get_status()["affinity_broken"] == 0


def test_added_servers_take_new_trajectories_and_readding_keeps_counts():
    lb = balancer("s0")
    first = acquire(lb, "a")
    lb.add_servers({"s1": object()})
    assert lb.get_status()["servers"] == {"s0": 1, "s1": 0}
    assert acquire(lb, "b") == "s1"
    lb.add_servers({"s0": object()})  # re-registering a live server loses no in-flight count
    assert lb.get_inflight_count(first) == 1
    assert sorted(lb.get_all_servers()) == ["s0", "s1"]


def test_removed_server_is_gone_and_its_trajectories_are_repinned():
    lb = balancer("s0", "s1", "s2")
    pinned = acquire(lb, "sticky")
    lb.release_server(server_id=pinned)
    lb.remove_servers([pinned])
    status = lb.get_status()
    assert pinned not in status["servers"]
    assert pinned not in status["registered_handles"]
    assert pinned not in lb.get_all_servers()
    assert status["active_servers"] == 2
    assert acquire(lb, "sticky") in set(status["servers"])
    assert lb.get_status()["repinned_replica_gone"] == 1
    lb.release_server(server_id=pinned)  # a late release for the removed server is ignored
    assert lb.get_total_inflight() == 1


def test_empty_pool_fails_with_the_message_verls_async_client_retries_on():
    lb = balancer("s0")
    lb.remove_servers(["s0"])
    with pytest.raises(RuntimeError, match=NO_SERVERS):
        lb.acquire_server(request_id="r")
    assert NO_SERVERS == "No available servers in load balancer"
    lb.add_servers({"s1": object()})
    assert acquire(lb, "r") == "s1"


def test_clear_sticky_cache_drops_every_pin_and_keeps_loads_and_counters():
    lb = balancer("s0", "s1")
    pinned = acquire(lb, "conv")
    acquire(lb, "conv")
    acquire(lb, "other")  # conv's server: 2 in flight, the other 1
    result = lb.clear_sticky_cache()
    assert result["cleared_entries"] == 2
    assert result["server_loads"] == lb.get_status()["servers"]
    assert sum(result["server_loads"].values()) == 3
    assert lb.get_status()["sessions"] == 0
    assert acquire(lb, "conv") != pinned  # unpinned: placed by load alone
    status = lb.get_status()
    assert (status["affinity_kept"], status["new_sessions"], status["sessions"]) == (1, 3, 1)
    assert lb.clear_sticky_cache()["cleared_entries"] == 1


def test_release_session_ends_a_trajectory_at_once():
    lb = balancer("s0", "s1")
    acquire(lb, "conv")
    assert lb.release_session("conv") is True
    assert lb.release_session("conv") is False
    status = lb.get_status()
    assert (status["sessions"], status["released"]) == (0, 1)
    assert lb.clear_sticky_cache()["cleared_entries"] == 0


def test_the_pin_table_is_bounded_least_recently_used_first():
    lb = balancer("s0", "s1", max_cache_size=2)
    for rid in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" arrives
        acquire(lb, rid)
    status = lb.get_status()
    assert (status["sessions"], status["evicted_lru"]) == (2, 1)
    assert lb.clear_sticky_cache()["cleared_entries"] == 2
    assert lb.get_status()["released"] == 2  # exactly "a" and "c" were still pinned


def test_idle_trajectories_expire_on_the_clock_it_is_given():
    now = [100.0]
    lb = balancer("s0", "s1", idle_timeout_seconds=60, clock=lambda: now[0])
    first = acquire(lb, "conv")
    acquire(lb, "busy")
    acquire(lb, "busy")  # busy's server is the other one, with 2 in flight
    lb.release_server(server_id=first)
    now[0] += 30
    assert acquire(lb, "conv") == first  # within the timeout: kept
    lb.release_server(server_id=first)
    now[0] += 61
    acquire(lb, "conv")
    status = lb.get_status()
    assert (status["expired_idle"], status["new_sessions"], status["affinity_kept"]) == (1, 3, 2)


def test_routing_needs_no_payload_from_verl():
    lb = balancer("s0")
    assert lb.require_acquire_fields() == ["request_group_id"]  # an id only: never the prompt
    assert lb.require_release_fields() == []
    assert acquire(lb, "r") == "s0"
    assert lb.acquire_server("r2", prompt_ids=[1, 2])[0] == "s0"  # extra fields are accepted


def test_constructed_the_ways_verl_constructs_it():
    servers = {"s0": object(), "s1": object()}
    from_yaml = AffinityLoadBalancer(servers, {"router_class": "x.Y", "affinity_break_margin": 3,
                                               "max_cache_size": 50, "idle_timeout_seconds": 600, "max_groups": 10_000})
    assert from_yaml.settings == {"affinity_break_margin": 3, "full_determinism": False,
                                  "max_cache_size": 50, "idle_timeout_seconds": 600, "max_groups": 10_000}
    configured = AffinityLoadBalancer.configured(affinity_break_margin=2, max_cache_size=500)
    from_cls = configured(servers=servers, max_cache_size=10_000)  # what verl passes a subclass
    assert (from_cls.settings["affinity_break_margin"], from_cls.settings["max_cache_size"]) == (2, 500)
    assert issubclass(configured, AffinityLoadBalancer)
    assert configured.__module__ == AffinityLoadBalancer.__module__
    assert AffinityLoadBalancer(servers).settings["affinity_break_margin"] is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"affinity_break_margn": 2}, "affinity_break_margn"),
        ({"affinity_break_margin": -1}, "affinity_break_margin"),
        ({"affinity_break_margin": "2"}, "affinity_break_margin"),
        ({"full_determinism": "false"}, "full_determinism"),
        ({"max_cache_size": 0}, "max_cache_size"),
        ({"idle_timeout_seconds": 0}, "idle_timeout_seconds"),
    ],
)
def test_bad_options_fail_at_construction_naming_the_option(config, message):
    with pytest.raises(ValueError, match=message):
        AffinityLoadBalancer({"s0": object()}, {"router_class": "x.Y", **config})


def test_configured_rejects_unknown_options_at_once():
    with pytest.raises(ValueError, match="margin"):
        AffinityLoadBalancer.configured(margin=2)


def test_importing_the_adapter_pulls_in_neither_verl_nor_ray():
    code = ("import sys, rollout_router.integrations.verl; "
            "print(sorted(m for m in ('verl', 'ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_grpo_siblings_with_a_request_group_id_share_a_server():
    lb = balancer("s0", "s1", "s2", "s3", affinity_break_margin=4)
    placed = [lb.acquire_server(f"sample-{i}", request_group_id="uid-7")[0] for i in range(4)]  # all in flight
    assert len(set(placed)) == 1  # skew 3 <= 4: together
    spilled = lb.acquire_server("sample-4", request_group_id="uid-7")[0]  # skew 4 <= 4: still together
    beyond = lb.acquire_server("sample-5", request_group_id="uid-7")[0]  # skew 5 > 4: spills
    assert spilled == placed[0] and beyond != placed[0]
    plain = {lb.acquire_server(f"other-{i}")[0] for i in range(3)}  # no group id: least-loaded, spread
    assert len(plain) > 1
    status = lb.get_status()
    assert (status["group_colocated"], status["group_spilled"]) == (4, 1)
    assert lb.clear_sticky_cache()["cleared_entries"] == 9 and len(lb._policy.groups) == 0


def test_a_later_turn_follows_its_own_pin_not_its_group():
    lb = balancer("s0", "s1", affinity_break_margin=None)
    first = lb.acquire_server("a", request_group_id=3)[0]  # an int uid is a key too
    lb.release_server(first)
    assert lb.acquire_server("a", request_group_id=3)[0] == first
    assert lb.get_status()["group_colocated"] == 0  # a turn, not a new member


@pytest.mark.parametrize("bad", [0, "10", True])
def test_max_groups_is_checked(bad):
    with pytest.raises(ValueError, match="max_groups"):
        balancer("s0", max_groups=bad)

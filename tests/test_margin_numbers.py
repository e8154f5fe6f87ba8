"""verl accepts any finite margin >= 0 (``inflight[pinned] <= min + margin``: 2.5 keeps a pin at skew 2 and moves
it at 3); so do the policy, the verl adapter, the router's config and flag, and the RolloutRouter resource. Errors
name what the user wrote: ``--affinity-break-margin``, ``affinityBreakMargin``, verl's ``affinity_break_margin``."""
from __future__ import annotations

import math

import pytest
import yaml

from rollout_router.integrations.verl import AffinityLoadBalancer
from rollout_router.policy import Outcome, Request, create
from rollout_router.settings import PolicySettings, SettingsError, parse_settings
from rollout_router.usage import margin as _margin
from rollout_router_operator.render import InvalidSpec, render
from tests.test_render import by_kind, resource


@pytest.mark.parametrize(("skew", "outcome"), [(2, Outcome.KEPT), (3, Outcome.BROKEN)])
def test_a_fractional_margin_keeps_at_skew_2_and_breaks_at_3(skew, outcome):
    policy = create("affinity", margin=2.5)
    policy.route(Request("conv", {"a": 0, "b": 0}, now=0.0))
    pinned = policy.table.get("conv", 0.0)
    other = "b" if pinned == "a" else "a"
    assert policy.route(Request("conv", {pinned: skew, other: 0}, now=1.0)).outcome is outcome


@pytest.mark.parametrize(("servers", "moves"), [(2, False), (3, True)])  # skew 2 kept, 3 moved
def test_the_verl_adapter_takes_a_fractional_margin(servers, moves):
    lb = AffinityLoadBalancer({"s0": object(), "s1": object()}, affinity_break_margin=2.5)
    first = lb.acquire_server(request_id="conv")[0]
    lb.release_server(server_id=first, request_id="conv")  # its turn is done; the tool runs
    for index in range(servers):  # meanwhile other trajectories pinned to the same server keep it busy
        lb._policy.table.pin(f"other-{index}", first, lb._clock())
        lb.acquire_server(request_id=f"other-{index}")
    assert lb.get_status()["servers"][first] == servers
    assert (lb.acquire_server(request_id="conv")[0] != first) is moves


@pytest.mark.parametrize("bad", [-0.5, math.inf, math.nan, "2", True])
def test_the_verl_adapter_refuses_other_margins_by_its_key(bad):
    with pytest.raises(ValueError, match="affinity_break_margin"):
        AffinityLoadBalancer({"s0": object()}, affinity_break_margin=bad)


def test_the_flag_and_the_config_take_numbers_and_keep_whole_ones_whole():
    assert (_margin("2.5"), _margin("2"), _margin("2.0"), _margin("null")) == (2.5, 2, 2, None)
    assert parse_settings({"affinityBreakMargin": 2.5}, PolicySettings).affinity_break_margin == 2.5
    whole = parse_settings({"affinityBreakMargin": 2.0}, PolicySettings).affinity_break_margin
    assert whole == 2 and isinstance(whole, int)
    assert parse_settings({"affinityBreakMargin": 2.5}, PolicySettings).live_config().margin == 2.5


@pytest.mark.parametrize("bad", [-0.5, "2", True])
def test_config_errors_name_the_key_as_written(bad):
    with pytest.raises(SettingsError, match="affinityBreakMargin"):
        parse_settings({"affinityBreakMargin": bad}, PolicySettings)


def test_the_resource_takes_a_fractional_margin():
    kinds = by_kind(render(resource({"affinityBreakMargin": 2.5})))
    assert yaml.safe_load(kinds["ConfigMap"]["data"]["config.yaml"])["affinityBreakMargin"] == 2.5
    with pytest.raises(InvalidSpec, match="spec.affinityBreakMargin"):
        render(resource({"affinityBreakMargin": -0.5}))

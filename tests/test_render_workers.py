"""The router Deployment's ``--workers``: the CPU limit rounded down, ``spec.router.workers`` when set, 1 by default
under ``sessionOwner: Entry``; with session ownership each worker's admin port is a container port ``fleet-<i>``
(where the other pods find it as a member) and the NetworkPolicy admits the other router pods on every port."""
from __future__ import annotations

import pytest

from rollout_router_operator.render import ROUTER_ADMIN_PORT, InvalidSpec, render, router_labels
from tests.test_render import by_kind, resource


def command(router: dict) -> list[str]:
    deployment = by_kind(render(resource({"router": router})))["Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["command"]


def workers(router: dict) -> int:
    args = command(router)
    return int(args[args.index("--workers") + 1]) if "--workers" in args else 1


@pytest.mark.parametrize(("cpu", "expected"), [
    (None, 1), (1, 1), ("1", 1), ("1500m", 1), ("2", 2), (2, 2), ("2.5", 2), ("4000m", 4), ("500m", 1), ("0.5", 1),
    ("96", 64)])
def test_the_cpu_limit_rounded_down_is_the_default_without_session_ownership(cpu, expected):
    limits = {"memory": "1Gi", **({"cpu": cpu} if cpu is not None else {})}
    assert workers({"sessionOwnership": False, "resources": {"limits": limits}}) == expected


def test_one_worker_leaves_the_command_as_it_was():
    assert "--workers" not in command({"sessionOwnership": False, "resources": {"limits": {"cpu": "1"}}})


def container(router: dict) -> dict:
    return by_kind(render(resource({"router": router})))["Deployment"]["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(("cpu", "expected"), [(None, 1), ("1500m", 1), ("2", 2), ("4", 4)])
def test_session_ownership_runs_the_workers_the_cpu_limit_allows_each_at_a_fleet_port(cpu, expected):
    limits = {"memory": "1Gi", **({"cpu": cpu} if cpu is not None else {})}
    rendered = container({"resources": {"limits": limits}})
    assert workers({"resources": {"limits": limits}}) == expected and "--peer-selector" in rendered["command"]
    fleet = [(p["name"], p["containerPort"]) for p in rendered["ports"] if p["name"].startswith("fleet-")]
    assert fleet == ([(f"fleet-{i}", ROUTER_ADMIN_PORT + 1 + i) for i in range(expected)] if expected > 1 else [])


def test_entry_ownership_keeps_one_worker_unless_the_spec_asks_for_more():
    assert workers({"sessionOwner": "Entry", "resources": {"limits": {"cpu": "4"}}}) == 1
    assert workers({"sessionOwner": "Entry", "workers": 2}) == 2


def test_without_session_ownership_no_fleet_port_is_rendered():
    rendered = container({"sessionOwnership": False, "resources": {"limits": {"cpu": "4"}}})
    assert "--workers" in rendered["command"] and not [p for p in rendered["ports"] if p["name"].startswith("fleet-")]


def test_the_network_policy_admits_the_router_pods_on_every_port_when_they_run_workers():
    """A worker's private traffic ports (forwarded turns) are free ports picked as it starts: no port list."""
    def router_rule(router: dict) -> dict:
        manifests = render(resource({"router": router, "networkPolicy": {"enabled": True}}))
        rules = by_kind(manifests)["NetworkPolicy"]["spec"]["ingress"]
        [rule] = [r for r in rules if r["from"] == [{"podSelector": {"matchLabels": router_labels("rr1")}}]]
        return rule
    assert "ports" not in router_rule({"workers": 2})
    assert {p["port"] for p in router_rule({"workers": 1})["ports"]} == {8080, ROUTER_ADMIN_PORT}


def test_the_spec_field_overrides_the_cpu_limit():
    assert workers({"sessionOwnership": False, "workers": 3}) == 3
    assert workers({"sessionOwnership": False, "workers": 1, "resources": {"limits": {"cpu": "4"}}}) == 1


@pytest.mark.parametrize(("router", "says"), [
    ({"sessionOwnership": False, "workers": 0}, "spec.router.workers"),
    ({"sessionOwnership": False, "resources": {"limits": {"cpu": "two"}}}, "spec.router.resources.limits.cpu"),
])
def test_workers_a_pod_cannot_run_are_an_invalid_spec(router, says):
    with pytest.raises(InvalidSpec, match=says):
        render(resource({"router": router}))

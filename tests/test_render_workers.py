"""The router Deployment's ``--workers``: the CPU limit rounded down without session ownership across pods,
``spec.router.workers`` when set, never above 1 with session ownership (the workers of several pods do not
share sessions yet; ``serve`` refuses ``--workers`` with ``--peer-selector``)."""
from __future__ import annotations

import pytest

from rollout_router_operator.render import InvalidSpec, render
from tests.test_render import by_kind, resource


def command(router: dict) -> list[str]:
    deployment = by_kind(render(resource({"router": router})))["Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["command"]


def workers(router: dict) -> int:
    args = command(router)
    return int(args[args.index("--workers") + 1]) if "--workers" in args else 1


@pytest.mark.parametrize(("cpu", "expected"), [
    (None, 1), (1, 1), ("1", 1), ("1500m", 1), ("2", 2), (2, 2), ("2.5", 2), ("4000m", 4), ("500m", 1), ("0.5", 1)])
def test_the_cpu_limit_rounded_down_is_the_default_without_session_ownership(cpu, expected):
    limits = {"memory": "1Gi", **({"cpu": cpu} if cpu is not None else {})}
    assert workers({"sessionOwnership": False, "resources": {"limits": limits}}) == expected


def test_one_worker_leaves_the_command_as_it_was():
    assert "--workers" not in command({"sessionOwnership": False, "resources": {"limits": {"cpu": "1"}}})


def test_session_ownership_keeps_one_worker_whatever_the_cpu_limit():
    args = command({"resources": {"limits": {"cpu": "4"}}})
    assert "--workers" not in args and "--peer-selector" in args


def test_the_spec_field_overrides_the_cpu_limit():
    assert workers({"sessionOwnership": False, "workers": 3}) == 3
    assert workers({"sessionOwnership": False, "workers": 1, "resources": {"limits": {"cpu": "4"}}}) == 1


@pytest.mark.parametrize(("router", "says"), [
    ({"workers": 2}, "workers above 1 needs sessionOwnership false"),
    ({"sessionOwnership": False, "workers": 0}, "spec.router.workers"),
    ({"sessionOwnership": False, "resources": {"limits": {"cpu": "two"}}}, "spec.router.resources.limits.cpu"),
])
def test_workers_a_pod_cannot_run_are_an_invalid_spec(router, says):
    with pytest.raises(InvalidSpec, match=says):
        render(resource({"router": router}))

"""verl's own balancer beside the simulator's: the pinned 0.9.1 wheel's ``GlobalRequestLoadBalancer`` (random
tie-break, verl #7613) drives a 16-replica step of the seed study and makes the decisions ``VerlBalancer`` makes.

The wheel's class is a plain Python class (verl wraps it in ``ray.remote`` itself); here it is called directly, one
``acquire_server`` per turn and one ``release_server`` when the turn's last token is out, as verl's
``LLMServerClient`` does. Both draw their ties from a ``random.Random`` seeded alike, in registration order.
"""
from __future__ import annotations

import dataclasses
import random

from rollout_router.policy.base import Decision, Outcome, Policy, Request
from rollout_router.sim.engine import run_step
from rollout_router.sim.verl import generate_verl
from rollout_router.sim.verlbalancer import VerlBalancer
from rollout_router.sim.verlgrid import SEED_POINT, every_arm
from tests.test_integrations_verl_real import verl_router


class Wheel(Policy):
    """The wheel's balancer as the simulator calls a policy (``engine.run_step``: ``route``, ``on_release``)."""

    name = "verl-wheel"

    def __init__(self, replicas: list[str], max_sessions: int):
        super().__init__()
        self.balancer = verl_router.GlobalRequestLoadBalancer({r: r for r in replicas}, max_cache_size=max_sessions)
        self.decisions: list[tuple[str, str]] = []

    def route(self, request: Request) -> Decision:
        server, _ = self.balancer.acquire_server(request.key)
        self.decisions.append((request.key, server))
        return Decision(server, Outcome.KEPT)

    def on_release(self, replica: str, key: str, now: float) -> None:
        self.balancer.release_server(replica, key)


class Recording(VerlBalancer):
    decisions: list[tuple[str, str]]

    def route(self, request: Request) -> Decision:
        decision = super().route(request)
        self.decisions.append((request.key, decision.replica))
        return decision


def test_the_wheels_balancer_and_the_simulators_make_the_same_decisions_at_16_replicas():
    point = dataclasses.replace(SEED_POINT, batch=16)  # the seed's fleet at 16 replicas, 16 trajectories each
    preset = point.verl_preset()
    arm = every_arm(preset.sticky_entries)["verl_sticky_random"]
    trajs = generate_verl(preset, 0, 0)
    names = [f"r{i:02d}" for i in range(preset.replicas)]

    random.seed(7)  # the wheel draws its ties from the random module
    wheel = Wheel(names, preset.sticky_entries)
    theirs = run_step(preset.engine_preset(), trajs, arm, preset.cost, policy=wheel)

    ours_policy = Recording(margin=None, tie="random", max_sessions=preset.sticky_entries, seed=7)
    ours_policy.decisions = []
    ours = run_step(preset.engine_preset(), generate_verl(preset, 0, 0), arm, preset.cost, policy=ours_policy)

    assert len(wheel.decisions) > 2 * len(trajs) and preset.replicas == 16
    assert wheel.decisions == ours_policy.decisions
    assert theirs.step_seconds == ours.step_seconds and theirs.hit_tokens == ours.hit_tokens
    assert len({server for _, server in wheel.decisions}) == 16  # every replica took sessions

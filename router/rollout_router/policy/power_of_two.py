"""Power of two choices: sample two replicas, take the less loaded; no affinity.

Sampling uses this policy's own ``random.Random(seed)``, never global state,
so a run is reproducible.
"""
from __future__ import annotations

import random

from .base import Decision, Outcome, Policy, Request
from .hashing import ordered
from .unkeyed import require


class PowerOfTwoPolicy(Policy):
    name = "power_of_two"

    def __init__(self, seed: int = 0):
        super().__init__()
        self._rng = random.Random(seed)

    def route(self, request: Request) -> Decision:
        loads = require(request.loads)
        replicas = ordered(loads)
        if len(replicas) == 1:
            choice = replicas[0]
        else:  # sampling indices draws what sampling the names would, without copying them
            i, j = self._rng.sample(range(len(replicas)), 2)
            a, b = replicas[i], replicas[j]
            choice = b if loads[b] < loads[a] else a
        self.counters.count(Outcome.UNKEYED)
        return Decision(choice, Outcome.UNKEYED)

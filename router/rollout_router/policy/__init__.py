"""Routing policies: pure decision logic shared by the router, simulator and tests.

``base`` holds the interface; ``unkeyed`` what every policy does without a
session key or a replica; each policy lives in its own file; ``registry`` names
them.
"""
from ..core.loads import LoadIndex
from ..core.pins import SessionTable
from .affinity import AffinityPolicy
from .base import Counters, Decision, LiveConfig, NoReplicaError, Outcome, Policy, PolicyOptions, Request
from .hashing import least_loaded, lowest, rendezvous, stable_hash
from .least_loaded import LeastLoadedPolicy
from .registry import POLICIES, create
from .round_robin import RoundRobinPolicy
from .sessions import SessionPolicy

__all__ = [
    "AffinityPolicy", "Counters", "Decision", "LeastLoadedPolicy", "LiveConfig", "LoadIndex", "NoReplicaError", "Outcome",
    "POLICIES", "Policy", "PolicyOptions", "Request", "RoundRobinPolicy", "SessionPolicy", "SessionTable", "create",
    "least_loaded", "lowest", "rendezvous", "stable_hash",
]

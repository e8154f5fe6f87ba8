"""verl in-process: a load balancer verl runs in place of its ``GlobalRequestLoadBalancer``.

verl (0.9.0 and later; tested against 0.9.1) shares one load-balancer actor between all agent-loop
workers. It asks that actor for a server per request (``acquire_server``) and gives the server back
when the turn ends (``release_server``); every turn of one trajectory reuses the trajectory's
``request_id``, which is our session key. ``AffinityLoadBalancer`` keeps verl's interface and state
(servers, in-flight counts) and lets RolloutRouter's affinity policy decide: it keeps a pin while
the pinned server is within ``affinity_break_margin`` in-flight requests of the least-loaded one
and re-pins otherwise (verl PR #7435's rule), breaks ties by rendezvous hash, and under
``full_determinism`` places a trajectory by its id and the server set alone. A trajectory's first
turn that carries ``request_group_id`` (the prompt's uid, the name verl PR #6122 gives it) is placed
beside its GRPO siblings while their server is within the margin (policy/groups.py).

Like verl's class it is a plain class; verl wraps it in ``ray.remote`` and calls its methods as
actor tasks, one at a time, so it needs no lock. Two ways to select it in verl:

* ``actor_rollout_ref.rollout.router_config_path=router.yaml`` with
  ``router_class: rollout_router.integrations.verl.AffinityLoadBalancer`` and the options below in
  the same file (verl constructs ``cls(servers, whole_yaml_dict)``);
* ``LLMServerManager(..., load_balancer_cls=AffinityLoadBalancer.configured(affinity_break_margin=2))``
  in code (verl constructs ``cls(servers=..., max_cache_size=10000)``).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from rollout_router.policy import NoReplicaError, Request, create

# verl's FullyAsyncLLMServerClient retries an acquire whose error contains this text.
NO_SERVERS = "No available servers in load balancer"

DEFAULTS: dict[str, Any] = {
    "affinity_break_margin": None,  # None: keep every pin (verl's sticky behaviour)
    "full_determinism": False,
    "max_cache_size": 10_000,  # verl's DEFAULT_ROUTING_CACHE_SIZE: pins kept, LRU beyond
    "idle_timeout_seconds": None,  # verl pins never expire by age; set to expire idle trajectories
    "max_groups": 10_000,  # GRPO groups remembered (request_group_id -> server), LRU beyond
}
_YAML_ONLY = {"router_class"}  # verl's own key in the router YAML, not an option of ours


def _options(supplied: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``supplied`` minus verl's own keys, or ValueError naming any option we do not know."""
    unknown = sorted(set(supplied) - set(DEFAULTS) - _YAML_ONLY)
    if unknown:
        raise ValueError(
            f"unknown AffinityLoadBalancer option(s) {', '.join(unknown)} in {where}; "
            f"known: {', '.join(sorted(DEFAULTS))}"
        )
    return {key: value for key, value in supplied.items() if key not in _YAML_ONLY}


def _checked(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings``, or ValueError naming the first option of the wrong type or range.

    The margin is checked by the policy itself, under its own name (affinity_break_margin).
    """
    size, idle = settings["max_cache_size"], settings["idle_timeout_seconds"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"max_cache_size must be an integer >= 1, got {size!r}")
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int | float) or idle <= 0):
        raise ValueError(f"idle_timeout_seconds must be a number > 0 or null, got {idle!r}")
    if not isinstance(settings["full_determinism"], bool):
        raise ValueError(f"full_determinism must be true or false, got {settings['full_determinism']!r}")
    return settings


class AffinityLoadBalancer:
    """verl's ``RequestLoadBalancer`` protocol, routed by RolloutRouter's affinity policy.

    Options (keyword arguments, keys of verl's router YAML, or ``configured``): see ``DEFAULTS``.
    Later sources win: keyword arguments, then the YAML dict, then ``configured`` (verl passes
    ``max_cache_size`` itself on the ``load_balancer_cls`` path, so a configured value must beat it).
    """

    _configured: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        servers: Mapping[str, Any],
        router_config: Mapping[str, Any] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        **options: Any,
    ):
        settings = {
            **DEFAULTS,
            **_options(options, "keyword arguments"),
            **_options(router_config or {}, "the router YAML"),
            **self._configured,
        }
        self.settings = _checked(settings)
        self._policy = create(
            "affinity",
            margin=settings["affinity_break_margin"],
            full_determinism=settings["full_determinism"],
            max_sessions=settings["max_cache_size"],
            idle_ttl=settings["idle_timeout_seconds"],
            max_groups=settings["max_groups"],
        )
        self._clock = clock
        self._servers: dict[str, Any] = dict(servers)
        self._inflight: dict[str, int] = {server_id: 0 for server_id in servers}

    @classmethod
    def configured(cls, **options: Any) -> type[AffinityLoadBalancer]:
        """A subclass with ``options`` fixed, for verl's ``load_balancer_cls`` (which takes a class)."""
        fixed = {**cls._configured, **_options(options, "configured()")}
        return type(cls.__name__, (cls,), {"_configured": fixed, "__module__": cls.__module__})

    def acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        """The server for this turn of trajectory ``request_id``, counted in flight until released;
        ``request_group_id`` in ``extra`` (its GRPO group, when verl passes one) places a first turn beside
        its siblings. (verl's protocol signature, kept: verl's tests compare it.)"""
        group_id = extra.get("request_group_id")
        group = None if group_id is None else str(group_id)
        try:
            decision = self._policy.route(Request(request_id, dict(self._inflight), self._clock(), group=group))
        except NoReplicaError:
            raise RuntimeError(NO_SERVERS) from None
        server_id = decision.replica
        self._inflight[server_id] += 1
        return server_id, self._servers[server_id]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        """A turn on ``server_id`` ended. The trajectory stays pinned (its next turn reuses the id)."""
        if self._inflight.get(server_id, 0) > 0:
            self._inflight[server_id] -= 1

    def release_session(self, request_id: str) -> bool:
        """The trajectory ended: drop its pin now (the in-process ``DELETE /v1/sessions/{key}``)."""
        return self._policy.release(request_id)

    def require_acquire_fields(self) -> list[str]:
        """Routing needs the request id and, when the agent loop passes one, its group id; verl then sends
        no prompt over the RPC (only fields named here that the call carries)."""
        return ["request_group_id"]

    def require_release_fields(self) -> list[str]:
        return []

    def add_servers(self, servers: Mapping[str, Any]) -> None:
        """Register servers; one already registered keeps its in-flight count."""
        for server_id, handle in servers.items():
            self._servers[server_id] = handle
            self._inflight.setdefault(server_id, 0)

    def remove_servers(self, server_ids: list[str]) -> None:
        """Unregister servers; trajectories pinned to them are re-pinned on their next turn."""
        for server_id in server_ids:
            self._servers.pop(server_id, None)
            self._inflight.pop(server_id, None)

    def get_all_servers(self) -> list[str]:
        return list(self._inflight)

    def get_inflight_count(self, server_id: str) -> int:
        return self._inflight.get(server_id, 0)

    def get_total_inflight(self) -> int:
        return sum(self._inflight.values())

    def clear_sticky_cache(self) -> dict[str, Any]:
        """Drop every pin (verl calls this on phase switches); loads and counters stay."""
        cleared = self._policy.release_all()
        return {"cleared_entries": cleared, "server_loads": dict(self._inflight)}

    def get_status(self) -> dict[str, Any]:
        """verl's status keys, plus the policy's decision counters and settings."""
        return {
            "servers": dict(self._inflight),
            "total_inflight": self.get_total_inflight(),
            "active_servers": len(self._inflight),
            "registered_handles": list(self._servers),
            "sessions": self._policy.sessions(),
            **self._policy.counters.as_dict(),
            "affinity_break_margin": self.settings["affinity_break_margin"],
            "full_determinism": self.settings["full_determinism"],
        }

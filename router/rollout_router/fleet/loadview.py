"""What the margin compares in a fleet: each replica's load over all routers, fed to the replica set.

The policy stays pure: it reads ``inflight + external`` per replica from the
replica set's load index. This module keeps ``external`` up to date, one of
three ways (``fleet.loadView``):

- ``peers``: the sum of the other live members' own in-flight counts, as they
  stream them from ``GET /fleet/v1/loads?watch`` when they change (looked at
  every ``pollIntervalSeconds``, ≤ 250 ms). This router's own counts are exact;
  the peers' are at most one interval (plus a one-way trip) old. A member that
  leaves takes its counts with it.
- ``vllm``: each replica's ``vllm:num_requests_running + vllm:num_requests_waiting``
  scraped from its ``/metrics`` at the same interval (a gRPC-only replica, which
  has no ``/metrics``: the same counts from its ``VllmEngine/GetLoads``), minus
  this router's own count at the scrape (never below 0): what vLLM holds beyond us.
- ``local``: nothing; each router compares only its own counts.

docs/fleet.md says which tracks the true load better (benchmarks/fleet_loadview.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from ..health.grpc_probe import grpc_load
from ..replicas import Replica, ReplicaSet, grpc_only
from .client import PeerClient, PeerError, Unreachable

log = logging.getLogger(__name__)

VLLM_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class PeerLoads:
    """The members' reported counts, summed per replica into ``ReplicaSet.set_external``."""

    def __init__(self, replicas: ReplicaSet):
        self._replicas = replicas
        self._totals: dict[str, int] = {}

    def change(self, old: Mapping[str, int], new: Mapping[str, int]) -> None:
        """One member's counts went from ``old`` to ``new`` (``{}`` when it joins or leaves)."""
        totals = self._totals
        for replica in old.keys() | new.keys():
            delta = new.get(replica, 0) - old.get(replica, 0)
            if delta:
                total = totals.get(replica, 0) + delta
                if total:
                    totals[replica] = total
                else:
                    totals.pop(replica, None)
                self._replicas.set_external(replica, total)

    def clear(self) -> None:
        for replica in list(self._totals):
            self._replicas.set_external(replica, 0)
        self._totals.clear()


def vllm_load(text: str) -> int | None:
    """``vllm:num_requests_running + vllm:num_requests_waiting`` from a Prometheus exposition (None: absent)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(VLLM_GAUGES):
            name, _, rest = line.partition(" ") if "{" not in line else line.partition("} ")
            if name.split("{", 1)[0] in VLLM_GAUGES:
                try:
                    total += float(rest.split()[0])
                    seen = True
                except (IndexError, ValueError):
                    continue
    return round(total) if seen else None


async def scrape_vllm(replicas: ReplicaSet, client: PeerClient, interval: float) -> None:
    """The ``vllm`` view: every ``interval``, each replica's queue in vLLM beyond our own requests."""
    while True:
        live = replicas.replicas()
        loads = await asyncio.gather(*(_scrape(client, replica, interval) for replica in live))
        for replica, load in zip(live, loads):
            if load is not None:
                replicas.set_external(replica.id, max(0, load - replica.inflight))
        await asyncio.sleep(interval)


async def _scrape(client: PeerClient, replica: Replica, interval: float) -> int | None:
    timeout, url = max(interval * 4, 0.5), replica.id
    if grpc_only(url) and replica.grpc_target is not None:
        return await grpc_load(replica.grpc_target, timeout)
    try:
        return vllm_load(await client.text(f"{url}/metrics", timeout=timeout))
    except (Unreachable, PeerError) as error:
        log.debug("vLLM load of %s not read: %s", url, error)
        return None

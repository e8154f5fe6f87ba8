"""Which of vLLM's own RL routes each replica serves, asked once per replica, and the engine calls that use them.

vLLM 0.32 serves its RL routes together (``entrypoints/rl/online``, with ``VLLM_SERVER_DEV_MODE=1``):
``/pause?mode=``, ``/resume``, ``/is_paused``, ``/abort_requests``, the weight-transfer routes
(``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``), ``/update_weight_version`` and
``/weight_info``. Versions before them serve only the dev routes ``/collective_rpc`` and
``/reset_prefix_cache``. One ``GET /weight_info`` tells the two apart (``NATIVE`` answers it, ``LEGACY`` says
404) and gives the replica's weight version, which every answer it serves then carries (``X-Weight-Version``):
so each replica is asked as soon as it joins (``watch``), or by the first fan-out that finds it unasked, and
never again while it stays. One that leaves is forgotten, with its version: it may come back as another vLLM.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..replicas import ReplicaSet, grpc_only
from .client import PeerClient, PeerError, Unreachable

log = logging.getLogger(__name__)

NATIVE, LEGACY = "native", "legacy"
WATCH_INTERVAL_SECONDS = 1.0  # how often the replica set is looked at for replicas not asked yet
ASK_TIMEOUT_SECONDS = 5.0  # one GET /weight_info; a replica that does not answer is asked again next pass
ROUTE_ABSENT = (404, 405)  # a server without the route (FastAPI: 404; a route of another method: 405)
Step = Callable[[PeerClient, str], Awaitable[dict[str, Any]]]  # (client, replica URL) -> what to report


class EngineRoutes:
    """Each replica's kind of RL routes (``kinds``), and its version read at the same time (``set_version``)."""

    def __init__(self, set_version: Callable[[str, object], bool], forget_version: Callable[[str], None]):
        self._set_version, self._forget_version = set_version, forget_version
        self.kinds: dict[str, str] = {}  # replica URL -> NATIVE or LEGACY

    async def kind(self, client: PeerClient, url: str) -> str:
        """``NATIVE`` or ``LEGACY``, asked once; raises ``Unreachable``/``PeerError`` when the replica did not say."""
        known = self.kinds.get(url)
        if known is None:
            known = self.kinds[url] = await self._ask(client, url)
        return known

    async def _ask(self, client: PeerClient, url: str) -> str:
        try:
            info = await client.call("GET", f"{url}/weight_info", timeout=ASK_TIMEOUT_SECONDS)
        except PeerError as error:
            if error.status in ROUTE_ABSENT:
                return LEGACY
            raise
        if not isinstance(info, dict) or "weight_version" not in info:  # not vLLM's answer: not its routes
            return LEGACY
        self._set_version(url, info["weight_version"])
        return NATIVE

    async def read_version(self, client: PeerClient, url: str) -> Any:
        """The version a native replica reports now (kept for its answers' heads when a head can carry it)."""
        info = await client.call("GET", f"{url}/weight_info")
        version = info.get("weight_version") if isinstance(info, dict) else None
        self._set_version(url, version)
        return version

    async def watch(self, replicas: ReplicaSet, client: PeerClient, probing: Callable[[], bool]) -> None:
        """Forever: ask the replicas that joined, forget those that left (a failed pass is logged, not fatal).
        While ``probing`` says active health probes are off (``probeIntervalSeconds: null``), nothing is sent
        to a replica in the background: each is asked by the first fan-out that reaches it instead."""
        while True:
            try:
                if probing():
                    await self.detect(replicas, client)
            except Exception:
                log.exception("asking the replicas which RL routes they serve failed; again in %gs",
                              WATCH_INTERVAL_SECONDS)
            await asyncio.sleep(WATCH_INTERVAL_SECONDS)

    async def detect(self, replicas: ReplicaSet, client: PeerClient) -> None:
        """One pass: every live HTTP replica not asked yet is asked, at once; those gone are forgotten."""
        live = {r.id for r in replicas.replicas() if not grpc_only(r.id)}
        for url in [url for url in self.kinds if url not in live]:
            del self.kinds[url]
            self._forget_version(url)
        await asyncio.gather(*(self._quietly(client, url) for url in live if url not in self.kinds))

    async def _quietly(self, client: PeerClient, url: str) -> None:
        try:
            await self.kind(client, url)
        except (Unreachable, PeerError) as error:  # not up yet, or failing: the prober says so; asked again
            log.debug("%s did not say which RL routes it serves: %s", url, error)


def engine_pause(routes: EngineRoutes, mode: str) -> Step:
    """vLLM's own ``POST /pause?mode=`` on a native replica (``clear_cache=false``: the update resets the cache
    when asked, a pause alone keeps it); a legacy one has nothing to pause (the router's queue holds), but cannot
    freeze its requests either: ``keep`` fails there."""
    async def step(client: PeerClient, url: str) -> dict[str, Any]:
        kind = await routes.kind(client, url)
        if kind == LEGACY and mode == "keep":
            raise PeerError(f"{url} serves no /pause (a vLLM before its RL routes): it cannot keep its requests "
                            "frozen; its requests in flight go on (pause with wait or abort)")
        if kind == NATIVE:
            await client.call("POST", f"{url}/pause?mode={mode}&clear_cache=false")
        return {"routes": kind, "engine_paused": kind == NATIVE}
    return step


def engine_resume(routes: EngineRoutes) -> Step:
    """vLLM's own ``POST /resume`` on a native replica."""
    async def step(client: PeerClient, url: str) -> dict[str, Any]:
        kind = await routes.kind(client, url)
        if kind == NATIVE:
            await client.call("POST", f"{url}/resume")
        return {"routes": kind, "engine_paused": False}
    return step


async def transfer(client: PeerClient, url: str, update_info: Any, version: str | None) -> None:
    """vLLM's weight-transfer session: start, the trainer's ``update_info`` (its transfer engine, set up with
    ``init_weight_transfer_engine``, moves the tensors meanwhile), finish with the version."""
    await client.call("POST", f"{url}/start_weight_update")
    await client.call("POST", f"{url}/update_weights", {"update_info": update_info})
    await client.call("POST", f"{url}/finish_weight_update",
                      {"weight_version": version} if version is not None else None)

"""Engine calls fanned out to every replica, fenced by the replica set's membership epoch; and the peers told.

Each replica gets the same calls at once (vLLM's own routes, served with
``VLLM_SERVER_DEV_MODE=1``: ``fakevllm/rl_api.py`` has their shapes), and its
result is reported by name. The replicas called are those live when the
fan-out starts; the replica set's ``epoch`` moves when one joins, leaves or is
ejected, and when it moved meanwhile the difference is reported too: a replica
that left or was ejected as ``left``/``ejected``, one that joined as ``joined``
(it was not called, so it may serve other weights). Nothing is skipped silently:
``ok`` is true only when every replica called answered and none joined, left
or was ejected.

A gRPC-only replica (``grpc://``) has no HTTP route for these calls: it is
reported as failed. The calls carry no token: the router's admin token is
for its peers, never for the replicas.
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..replicas import ReplicaSet, grpc_only
from .client import PeerClient, PeerError, Unreachable
from .rlengines import NATIVE, EngineRoutes, Step, transfer

if TYPE_CHECKING:
    from .node import Fleet
    from .rlstate import RlState

ABORT_ROUND_SECONDS = 1.0  # how long one abort round waits for the drain before aborting again
INFLIGHT_POLL_SECONDS = 0.05  # how often the requests in flight are counted while waiting for them to end


@dataclasses.dataclass(slots=True)
class FanOut:
    """One fan-out's per-replica results and the membership epochs it started and ended in."""

    workers: list[dict[str, Any]]
    epoch: tuple[int, int]

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [w for w in self.workers if w["status"] != "ok"]

    def document(self, **extra: Any) -> dict[str, Any]:
        failed = self.failed
        return {"success": not failed, "status": "ok" if not failed else "partial", **extra,
                "epoch": {"start": self.epoch[0], "end": self.epoch[1]}, "workers": self.workers,
                "failed": [w["url"] for w in failed]}


async def fan_out(replicas: ReplicaSet, client: PeerClient, step: Step, grpc_ok: bool = False) -> FanOut:
    """``step`` on every live replica at once; the results, and what the membership did meanwhile. ``grpc_ok``:
    a gRPC-only replica, which has no HTTP engine routes, is reported ok and not called (a pause, a resume)."""
    start = replicas.epoch
    before = {r.id: replicas.why_unroutable(r.id) for r in replicas.replicas()}
    results = await asyncio.gather(*(_one(client, url, step, grpc_ok) for url in before))
    workers = list(results)
    after = {r.id: replicas.why_unroutable(r.id) for r in replicas.replicas()}
    for worker in workers:
        url = worker["url"]
        if url not in after:
            worker.update(status="left", error=f"{url} left the replica set during the call")
        elif after[url] == "ejected" and before[url] != "ejected":
            worker.update(status="ejected", error=f"{url} was ejected (passive health) during the call")
    workers += [{"url": url, "status": "joined", "error": f"{url} joined the replica set during the call "
                 "and was not called: it may serve other weights"} for url in after if url not in before]
    return FanOut(workers, (start, replicas.epoch))


async def _one(client: PeerClient, url: str, step: Step, grpc_ok: bool) -> dict[str, Any]:
    if grpc_only(url):
        if grpc_ok:
            return {"url": url, "status": "ok", "routes": None}
        return {"url": url, "status": "failed", "error": f"{url} serves gRPC only: it has no HTTP engine routes"}
    try:
        return {"url": url, **await step(client, url), "status": "ok"}
    except (Unreachable, PeerError) as error:
        return {"url": url, "status": "failed", "error": str(error)}


async def abort(client: PeerClient, url: str) -> dict[str, Any]:
    """vLLM's ``POST /abort_requests {}``: every request in flight on the replica ends (finish_reason abort)."""
    answer = await client.call("POST", f"{url}/abort_requests", {})
    return {"aborted": answer.get("aborted") if isinstance(answer, dict) else None}


def update_weights(routes: EngineRoutes, weights_path: str | None, update_info: Any, version: str | None,
                   reset_cache: bool) -> Step:
    """New weights on one vLLM replica, its version, its prefix-cache reset; then the version it reports.

    The weights: ``update_info`` through vLLM's own weight-transfer routes (``rlengines.transfer``), or a reload
    from ``weights_path`` through ``/collective_rpc`` (vLLM has no route of its own for a checkpoint on disk).
    A replica without vLLM's RL routes (``LEGACY``) cannot take or report a version: its version is the one
    asked for, as the router's word."""
    async def step(client: PeerClient, url: str) -> dict[str, Any]:
        kind = await routes.kind(client, url)
        if update_info is not None:
            if kind != NATIVE:
                raise PeerError(f"{url} serves no /update_weights (a vLLM before its RL routes): "
                                "update it from a checkpoint with model_path")
            await transfer(client, url, update_info, version)
        elif weights_path is not None:
            await client.call("POST", f"{url}/collective_rpc",
                              {"method": "reload_weights", "kwargs": {"weights_path": weights_path}})
        if version is not None and update_info is None and kind == NATIVE:
            await client.call("POST", f"{url}/update_weight_version", {"new_version": version})
        report: dict[str, Any] = {"routes": kind}
        if reset_cache:
            answer = await client.call("POST", f"{url}/reset_prefix_cache")
            report["prefix_cache_reset"] = bool(isinstance(answer, dict) and answer.get("success"))
            if not report["prefix_cache_reset"]:
                raise PeerError(f"POST {url}/reset_prefix_cache answered success=false (blocks still held)")
        report["weight_version"] = await routes.read_version(client, url) if kind == NATIVE else version
        return report
    return step


def update_weights_sglang(model_path: str, version: str | None, reset_cache: bool) -> Step:
    """SGLang's ``POST /update_weights_from_disk`` (weights, version and cache flush in one call), then the
    version its ``GET /get_model_info`` reports."""
    async def step(client: PeerClient, url: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model_path": model_path, "flush_cache": reset_cache,
                                **({"weight_version": version} if version is not None else {})}
        answer = await client.call("POST", f"{url}/update_weights_from_disk", body)
        if not (isinstance(answer, dict) and answer.get("success")):
            why = answer.get("message") if isinstance(answer, dict) else answer
            raise PeerError(f"POST {url}/update_weights_from_disk answered success=false ({why})")
        info = await client.call("GET", f"{url}/get_model_info")
        return {"prefix_cache_reset": reset_cache,
                "weight_version": info.get("weight_version") if isinstance(info, dict) else None}
    return step


def engine_call(path: str, body: Any) -> Step:
    """Any engine route, the same body to every replica (SGLang's gateway's ``/v1/rl/engine/<path>``)."""
    async def step(client: PeerClient, url: str) -> dict[str, Any]:
        return {"answer": await client.call("POST", f"{url}/{path}", body)}
    return step


async def abort_until_drained(replicas: ReplicaSet, client: PeerClient, timeout: float) -> tuple[FanOut, bool]:
    """Abort on every replica until nothing is in flight here: (the last round, with each replica's ``aborted``
    summed over the rounds; whether it drained within ``timeout``).

    vLLM aborts only the requests it has admitted: one the router sent while the engine was still reading
    or tokenizing it escapes a round (measured on the real-vLLM tier), so a round is repeated after
    ``ABORT_ROUND_SECONDS`` while requests are still in flight.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    totals: dict[str, int] = {}
    while True:
        fanned = await fan_out(replicas, client, abort)
        for worker in fanned.workers:
            totals[worker["url"]] = totals.get(worker["url"], 0) + (worker.get("aborted") or 0)
        done = await drained(replicas, max(0.0, min(ABORT_ROUND_SECONDS, deadline - loop.time())))
        if done or fanned.failed or loop.time() >= deadline:
            break
    for worker in fanned.workers:
        if "aborted" in worker:
            worker["aborted"] = totals[worker["url"]]
    return fanned, done


async def drained(replicas: ReplicaSet, timeout: float) -> bool:
    """Whether every request in flight through this router finished within ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while replicas.total_inflight():
                await asyncio.sleep(INFLIGHT_POLL_SECONDS)
    except TimeoutError:
        return False
    return True


async def tell_peers(fleet: Fleet | None, state: RlState, timeout: float) -> dict[str, str]:
    """Push the state to every live peer (which answers once its own requests drained, when paused);
    each peer's outcome: ``ok``, or why not (it learns the state at its next poll of any router)."""
    if fleet is None:
        return {}
    peers: Sequence[str] = [member.id for member in fleet.live_peers()]

    async def push(peer: str) -> str:
        try:
            answer = await fleet.client.call("POST", f"{peer}/fleet/v1/rl", state.shared(), timeout)
        except (Unreachable, PeerError) as error:
            return f"unreachable: {error}"
        return "ok" if isinstance(answer, dict) and answer.get("drained", True) else "not drained"
    outcomes = await asyncio.gather(*(push(peer) for peer in peers))
    return dict(zip(peers, outcomes))

"""The RL step's fleet operations, on the admin listener behind its token (docs/rl.md has the shapes).

- ``POST /v1/rl/pause`` ``{"mode": "wait"|"abort", "timeout": s}`` (or ``?mode=``): stop dispatching; answers
  once the requests in flight finished (``abort``: after the replicas' own ``/abort_requests``), the replicas
  that serve vLLM's own ``/pause`` paused with the same mode (``fleet/rlengines.py``).
- ``POST /v1/rl/resume``: the engines' own ``/resume``, then dispatch again, the queued requests first.
- ``POST /v1/rl/update_weights`` ``{"model_path" or "update_info", "weight_version", "reset_prefix_cache",
  "abort_all_requests", "engine"}``: in a paused section (unless already paused), each replica takes new
  weights (from disk, or vLLM's weight transfer), the version, and resets its prefix cache (``engine:
  "sglang"``: SGLang's ``update_weights_from_disk`` does all three); 200 when all succeeded, 502 naming each
  failure (dispatch stays paused then).
- ``POST /v1/rl/engine/{path}``: any engine route, the same JSON body to every replica (SGLang's gateway).
- ``GET /v1/rl/workers``: each replica with its ``weight_version``.
- ``POST /fleet/v1/rl``: a peer router's new state (``fleet/rlstate.py``); answers once drained when paused.

Every fan-out answers per replica, fenced by the membership epoch (``fleet/rlfanout.py``). With other
routers in the fleet, the router that takes the call tells them the new state before it answers.
"""
from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from .. import jsonbody
from ..fleet import rlengines, rlfanout, rlstate
from ..fleet.client import PeerClient
from .admin import GET, AdminAnswer, AdminRequest, Deferred, Route, error
from .context import RouterContext
from .workers import worker_id

MODES = ("wait", "abort", "keep")
PAUSE_FIELDS = {"mode", "timeout"}
ENGINE_PATH = re.compile(r"[A-Za-z0-9_]+")
UPDATE_FIELDS = {"model_path", "weights_path", "update_info", "weight_version", "reset_prefix_cache",
                 "abort_all_requests", "timeout", "load_format", "flush_cache", "engine"}
ENGINES = ("vllm", "sglang")  # whose weight-update routes the fan-out calls (fleet/rlfanout.py)


def _json(document: dict, code: int = 200) -> AdminAnswer:
    return AdminAnswer(code, json.dumps(document).encode())


def _later(work: Callable[[], Awaitable[AdminAnswer]]) -> Deferred:
    return Deferred(202, b"", then=work)


def _fields(document: dict[str, Any], route: str, fields: set[str]) -> AdminAnswer | None:
    """A 400 naming the first field ``route`` does not take (a misspelt one is never silently ignored)."""
    unknown = sorted(set(document) - fields)
    if not unknown:
        return None
    takes = f"takes {', '.join(sorted(fields))}" if fields else "takes no body"
    return error(400, f"unknown field {unknown[0]!r}; {route} {takes}", unknown[0])


def _body(request: AdminRequest) -> dict[str, Any] | AdminAnswer:
    """The JSON object body (empty: {}), or a 400 naming the problem."""
    if not request.body.strip():
        return {}
    try:
        document = jsonbody.parse(request.body)
    except (UnicodeDecodeError, ValueError) as exc:
        return error(400, f"request body is not valid JSON ({exc})")
    if not isinstance(document, dict):
        return error(400, "request body must be a JSON object")
    return document


def _engines(context: RouterContext, timeout: float | None = None) -> PeerClient:
    """The client of the engine calls, timed by the call's ``timeout`` or ``rl.engineTimeoutSeconds`` (live)."""
    client = context.rl.engines
    client.timeout = timeout or context.settings.rl.engine_timeout_seconds
    return client


def _timeout(context: RouterContext, document: dict[str, Any]) -> float | AdminAnswer:
    value = document.get("timeout", context.settings.rl.engine_timeout_seconds)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return error(400, f"timeout must be a number of seconds > 0, not {value!r}", "timeout")
    return float(value)


def pause(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    document = _body(request)
    if isinstance(document, AdminAnswer):
        return document
    if (unknown := _fields(document, "pause", PAUSE_FIELDS)) is not None:
        return unknown
    asked = parse_qs(request.query).get("mode", [])
    if len(asked) > 1 or (asked and "mode" in document and asked[0] != document["mode"]):
        return error(400, "mode is given twice (the query and the body) with different values", "mode")
    mode = document.get("mode", asked[0] if asked else "wait")
    if mode not in MODES:
        return error(400, f"mode must be wait (in-flight requests finish), abort (the replicas abort them) or keep "
                          f"(the replicas freeze them until resume), not {mode!r}", "mode")
    timeout = _timeout(context, document)
    if isinstance(timeout, AdminAnswer):
        return timeout

    async def work() -> AdminAnswer:
        answer, _ = await _pause(context, mode, timeout)
        return answer
    return _later(work)


async def _pause(context: RouterContext, mode: str, timeout: float) -> tuple[AdminAnswer, bool]:
    """Pause this router and its peers; abort on the replicas; wait for the drain; then pause the engines that
    serve vLLM's own ``/pause`` with the same mode (for whatever else they run). (answer, whether dispatch is
    paused and drained everywhere: an engine that did not pause is named in the answer, and a weight update
    goes on, reporting that replica if it fails too.)"""
    rl = context.rl
    epoch = rl.pause(mode)
    document: dict[str, Any] = {"status": "paused", "mode": mode, "epoch": list(epoch)}
    failures = []
    aborted: dict[str, dict[str, Any]] = {}
    if mode == "abort":
        fanned, _ = await rlfanout.abort_until_drained(context.replicas, _engines(context), timeout)
        aborted = {w["url"]: w for w in fanned.workers}
        failures += [f"{w['url']}: {w['error']}" for w in fanned.failed]
    document["peers"] = await rlfanout.tell_peers(context.fleet, rl, timeout)
    failures += [f"router {peer}: {why}" for peer, why in document["peers"].items() if why != "ok"]
    drained = mode == "keep" or await rlfanout.drained(context.replicas, timeout)  # keep: frozen, not drained
    document["inflight"] = context.replicas.total_inflight()
    if not drained:
        rl.record("pause", "timeout", mode=mode)
        return error(504, f"dispatch is paused, but {document['inflight']} requests are still in flight after "
                          f"{timeout:g} s"), False
    held = not failures
    engines = await rlfanout.fan_out(context.replicas, _engines(context, timeout),
                                     rlengines.engine_pause(rl.routes, mode), grpc_ok=mode != "keep")
    failures += [f"{w['url']}: {w['error']}" for w in engines.failed]
    document["workers"] = [_merged(worker, aborted.get(worker["url"])) for worker in engines.workers]
    if failures:
        rl.record("pause", "partial", mode=mode, failures=failures)
        return _json({**document, "error": {"message": "dispatch is paused, but not everywhere: " +
                                            "; ".join(failures), "code": 502}}, 502), held
    return _json(document), True


def _merged(paused: dict[str, Any], aborted: dict[str, Any] | None) -> dict[str, Any]:
    """A replica's engine pause with its abort rounds' count; a failed abort round says why."""
    if aborted is None:
        return paused
    if aborted["status"] != "ok":
        return {**paused, "status": aborted["status"], "error": aborted["error"]}
    return {**paused, "aborted": aborted.get("aborted")}


async def _resume(context: RouterContext, timeout: float) -> dict[str, Any]:
    """The engines that serve vLLM's own ``/resume`` first, then this router and its peers: the answer's body."""
    rl = context.rl
    engines = await rlfanout.fan_out(context.replicas, _engines(context, timeout),
                                     rlengines.engine_resume(rl.routes), grpc_ok=True)
    waiting = rl.queued
    epoch = rl.resume()
    peers = await rlfanout.tell_peers(context.fleet, rl, timeout)
    document = {"status": "resumed", "epoch": list(epoch), "released": waiting, "peers": peers,
                "workers": engines.workers}
    if engines.failed:
        document["error"] = {"message": "dispatch resumed, but these engines may still be paused (retry "
                                        "POST /v1/rl/resume): " + "; ".join(f"{w['url']}: {w['error']}"
                                                                            for w in engines.failed), "code": 502}
    return document


def resume(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    document = _body(request)
    if isinstance(document, AdminAnswer):
        return document
    if (unknown := _fields(document, "resume", set())) is not None:
        return unknown

    async def work() -> AdminAnswer:
        document = await _resume(context, context.settings.rl.engine_timeout_seconds)
        return _json(document, 502 if "error" in document else 200)
    return _later(work)


def update_weights(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    document = _body(request)
    if isinstance(document, AdminAnswer):
        return document
    if (unknown := _fields(document, "update_weights", UPDATE_FIELDS)) is not None:
        return unknown
    path = document.get("model_path", document.get("weights_path"))
    version = document.get("weight_version")
    for name, value in (("model_path", path), ("weight_version", version)):
        if value is not None and (not isinstance(value, str) or not value):
            return error(400, f"{name} must be a non-empty string", name)
    if version is not None and rlstate.VERSION.fullmatch(version) is None:
        return error(400, "weight_version must be 1-256 visible ASCII characters (spaces inside): answers carry it in "
                          "their X-Weight-Version header", "weight_version")
    info = document.get("update_info")
    if (refused := _weights_source(path, info, version, document.get("engine", "vllm"))) is not None:
        return refused
    kind = document.get("engine", "vllm")
    flags = {name: document.get(name, default) for name, default in
             (("reset_prefix_cache", document.get("flush_cache", True)), ("abort_all_requests", False))}
    for name, value in flags.items():
        if not isinstance(value, bool):
            return error(400, f"{name} must be true or false", name)
    timeout = _timeout(context, document)
    if isinstance(timeout, AdminAnswer):
        return timeout
    if context.rl.lock.locked():
        return error(409, "another update_weights is in progress on this router; wait for its answer")

    async def work() -> AdminAnswer:
        async with context.rl.lock:
            step = (rlfanout.update_weights_sglang(path, version, flags["reset_prefix_cache"]) if kind == "sglang"
                    and path is not None else
                    rlfanout.update_weights(context.rl.routes, path, info, version, flags["reset_prefix_cache"]))
            return await _update(context, step, version, "abort" if flags["abort_all_requests"] else "wait",
                                 timeout)
    return _later(work)


def _weights_source(path: str | None, info: Any, version: str | None, kind: object) -> AdminAnswer | None:
    """A 400 when the body names no new weights and no version, both kinds of weights, or a bad engine."""
    if info is not None and not (isinstance(info, dict) or (isinstance(info, list) and info
                                                            and all(isinstance(i, dict) for i in info))):
        return error(400, "update_info must be a JSON object (or a list of them, one per engine rank): what "
                          "vLLM's POST /update_weights takes", "update_info")
    if info is not None and path is not None:
        return error(400, "give model_path (a checkpoint on disk) or update_info (vLLM's weight transfer), "
                          "not both", "update_info")
    if path is None and info is None and version is None:
        return error(400, "update_weights needs model_path (a checkpoint directory every replica can read), "
                          "update_info (vLLM's weight transfer) and/or weight_version", "model_path")
    if kind not in ENGINES:
        return error(400, f"engine must be one of {', '.join(ENGINES)}, not {kind!r}", "engine")
    if kind == "sglang" and path is None:
        return error(400, "engine sglang needs model_path: SGLang updates weights and version in one call",
                     "model_path")
    return None


async def _update(context: RouterContext, step: rlfanout.Step, version: str | None, mode: str,
                  timeout: float) -> AdminAnswer:
    rl = context.rl
    paused_here = not rl.paused
    if paused_here:
        answer, held = await _pause(context, mode, timeout)
        if not held:
            rl.record("update", "failed", weight_version=version, why="the pause before it did not hold")
            return answer
    fanned = await rlfanout.fan_out(context.replicas, _engines(context, timeout), step)
    for worker in fanned.workers:
        if worker["status"] == "ok":
            rl.set_version(worker["url"], worker.get("weight_version"))
    failed = fanned.failed
    if failed:
        rl.record("update", "failed", weight_version=version, failed=[w["url"] for w in failed])
        message = "; ".join(f"{w['url']}: {w['status']}: {w.get('error')}" for w in failed)
        return _json(fanned.document(weight_version=version, paused=True, error={
            "message": f"the weight update failed on {len(failed)} of {len(fanned.workers)} replicas ({message}); "
                       "dispatch stays paused: retry update_weights, or POST /v1/rl/resume", "code": 502}), 502)
    rl.new_weights(version)
    rl.record("update", "ok", weight_version=version, pins_cleared=rl.pins_cleared)
    if not paused_here:
        peers = await rlfanout.tell_peers(context.fleet, rl, timeout)
        return _json(fanned.document(weight_version=version, paused=rl.paused, peers=peers))
    resumed = await _resume(context, timeout)
    document = fanned.document(weight_version=version, paused=rl.paused, peers=resumed["peers"])
    if "error" in resumed:
        return _json({**document, "error": resumed["error"]}, 502)
    return _json(document)


def engine(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    path = request.params["path"]
    if not ENGINE_PATH.fullmatch(path):  # match() with $ took a final newline
        return error(400, f"engine path {path!r} must be one route name (letters, digits, _)", "path")
    try:
        body = jsonbody.parse(request.body) if request.body.strip() else {}
    except (UnicodeDecodeError, ValueError) as exc:
        return error(400, f"request body is not valid JSON ({exc})")

    async def work() -> AdminAnswer:
        fanned = await rlfanout.fan_out(context.replicas, _engines(context), rlfanout.engine_call(path, body))
        return _json(fanned.document(path=f"/{path}"), 200 if not fanned.failed else 502)
    return _later(work)


def workers(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    rl, replicas = context.rl, context.replicas
    routable = set(replicas.loads()) | set(replicas.loads(grpc=True))
    entries = [{"worker_id": worker_id(r.id), "url": r.id, "weight_version": rl.versions.get(r.id),
                "routes": rl.routes.kinds.get(r.id), "is_healthy": r.id in routable, "load": r.inflight}
               for r in replicas.replicas()]
    return _json({"workers": entries, "total": len(entries), "paused": rl.paused, "mode": rl.mode,
                  "weight_version": rl.weight_version, "epoch": replicas.epoch})


def peer_state(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    """A peer's new state; when it pauses, answered once this router's own requests drained."""
    document = _body(request)
    if isinstance(document, AdminAnswer):
        return document
    rl = context.rl
    epoch, mode = document.get("epoch"), document.get("mode")
    if not (isinstance(epoch, list) and len(epoch) == 2 and type(epoch[0]) is int and isinstance(epoch[1], str)) \
            or not isinstance(document.get("paused"), bool):  # else 200, and the state silently not adopted
        return error(400, "the state needs \"epoch\": [n, router] and \"paused\": true or false", "epoch")
    if mode is not None and mode not in MODES:
        return error(400, f"mode must be wait, abort or keep, not {mode!r}", "mode")

    async def work() -> AdminAnswer:
        rl.adopt(document)
        timeout = context.settings.rl.engine_timeout_seconds
        if rl.paused and rl.mode == "abort":  # what escaped the first router's aborts through this one
            await rlfanout.abort_until_drained(context.replicas, _engines(context), timeout)
        drained = not rl.paused or rl.mode == "keep" or await rlfanout.drained(context.replicas, timeout)
        return _json({"epoch": list(rl.epoch), "paused": rl.paused, "drained": drained})
    return _later(work)


ROUTES = [
    Route("/v1/rl/pause", ("POST",), pause),
    Route("/v1/rl/resume", ("POST",), resume),
    Route("/v1/rl/update_weights", ("POST",), update_weights),
    Route("/v1/rl/engine/{path}", ("POST",), engine),
    Route("/v1/rl/workers", GET, workers),
    Route("/fleet/v1/rl", ("POST",), peer_state),
]

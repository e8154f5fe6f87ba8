"""The fake replica's RL engine routes: the ones vLLM serves with ``VLLM_SERVER_DEV_MODE=1``.

Same paths, parameters and answers as the pinned vLLM (0.32: ``entrypoints/rl/online`` and
``entrypoints/serve/dev``), so the router's fan-out (``fleet/rlfanout.py``) is tested against
the shapes it meets on real engines. With ``--rl-routes legacy`` it serves only the dev routes
(``/collective_rpc``, ``/reset_prefix_cache``), as a vLLM from before its RL routes does, so the
router's fallback is tested too.

- ``POST /pause?mode=abort|wait|keep&clear_cache=true``, ``POST /resume``, ``GET /is_paused``: while
  paused, new generation requests wait; ``abort`` ends the requests in flight with finish_reason
  "abort", ``wait`` answers once they finished; ``clear_cache`` (default true) then resets the prefix
  cache; ``keep`` freezes the requests in flight (no token until ``/resume``) and keeps the cache.
- ``POST /abort_requests`` ``{}``: every unfinished request ends with finish_reason "abort".
- The weight transfer: ``POST /init_weight_transfer_engine`` ``{"init_info"}``, ``/start_weight_update``,
  ``/update_weights`` ``{"update_info"}`` (the answers' text changes with it), ``/finish_weight_update``
  ``{"weight_version"}``, ``/shutdown_weight_transfer_engine``; out of order, a 500 as vLLM's worker raises.
- ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": P}}``: the
  answers' text changes with the weights loaded (a deterministic function of the path).
- ``POST /update_weight_version`` ``{"new_version": V}``, ``GET /weight_info``.
- ``POST /reset_prefix_cache``: ``{"success": bool}``, refused while a request holds blocks; a
  success counts in ``fakevllm:prefix_cache_resets_total``, and the hit counters show the cold cache.

And SGLang's two (``srt/entrypoints/http_server.py``), so an SGLang fleet's update is tested too:
``POST /update_weights_from_disk`` ``{"model_path", "weight_version", "flush_cache"}`` answering
``{"success", "message", "num_paused_requests"}``, and ``GET /get_model_info`` with ``weight_version``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from aiohttp import web

from .engine import Engine
from .protocol import ApiError

PAUSE_MODES = ("abort", "wait", "keep")
DRAIN_POLL_SECONDS = 0.01  # how often a wait-mode pause looks whether the requests in flight finished
_RESUMED = web.AppKey("fakevllm_resumed", asyncio.Event)
_ENGINE = web.AppKey("fakevllm_rl_engine", Engine)


@dataclasses.dataclass(slots=True)
class Transfer:
    """vLLM's weight-transfer session: set up (``init_weight_transfer_engine``) and an update in progress."""

    init_info: dict[str, Any] | None = None
    active: bool = False


_TRANSFER = web.AppKey("fakevllm_transfer", Transfer)


def add_routes(app: web.Application, key: web.AppKey[Engine]) -> None:
    """The dev routes, and vLLM's RL routes unless the engine is configured as a vLLM from before them."""
    app[_ENGINE] = app[key]
    resumed = asyncio.Event()
    resumed.set()
    app[_RESUMED], app[_TRANSFER] = resumed, Transfer()
    app.router.add_post("/collective_rpc", collective_rpc)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    app.router.add_get("/get_model_info", get_model_info)
    if app[key].config.rl_routes == "legacy":
        return
    for path, handler in (("/pause", pause), ("/resume", resume), ("/abort_requests", abort_requests),
                          ("/update_weight_version", update_weight_version),
                          ("/init_weight_transfer_engine", init_weight_transfer_engine),
                          ("/start_weight_update", start_weight_update), ("/update_weights", update_weights),
                          ("/finish_weight_update", finish_weight_update),
                          ("/shutdown_weight_transfer_engine", shutdown_weight_transfer_engine)):
        app.router.add_post(path, handler)
    app.router.add_get("/is_paused", is_paused)
    app.router.add_get("/weight_info", weight_info)


async def unpaused(app: web.Application) -> None:
    """Hold a new generation request while the engine is paused (vLLM's frontend does the same)."""
    resumed = app[_RESUMED]
    if not resumed.is_set():
        await resumed.wait()


def _engine(request: web.Request) -> Engine:
    return request.app[_ENGINE]


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = await request.json() if request.can_read_body else {}
    except ValueError as exc:
        raise ApiError.bad_request(f"Invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError.bad_request("Request body must be a JSON object")
    return data


async def pause(request: web.Request) -> web.Response:
    mode = request.query.get("mode", "abort")
    if mode not in PAUSE_MODES:
        raise ApiError.bad_request(f"mode must be one of {', '.join(PAUSE_MODES)}, not {mode!r}", "mode")
    clear = request.query.get("clear_cache", "true").lower() not in ("false", "0", "no", "off")
    engine = _engine(request)
    request.app[_RESUMED].clear()
    if mode == "abort":
        engine.abort_all()
    elif mode == "keep":
        engine.freeze()
    elif mode == "wait":
        while engine.running():
            await asyncio.sleep(DRAIN_POLL_SECONDS)
    if clear and mode != "keep":
        engine.reset_prefix_cache()
    return web.json_response({"status": "paused"})


async def resume(request: web.Request) -> web.Response:
    _engine(request).thaw()
    request.app[_RESUMED].set()
    return web.json_response({"status": "resumed"})


async def is_paused(request: web.Request) -> web.Response:
    return web.json_response({"is_paused": not request.app[_RESUMED].is_set()})


async def abort_requests(request: web.Request) -> web.Response:
    await _body(request)
    return web.json_response({"status": "aborted", "aborted": _engine(request).abort_all()})


async def collective_rpc(request: web.Request) -> web.Response:
    body = await _body(request)
    method, kwargs = body.get("method"), body.get("kwargs") or {}
    if method is None:
        raise ApiError.bad_request("Missing 'method' in request body")
    if method != "reload_weights":
        raise ApiError(500, "InternalServerError", f"the fake engine's workers have no method {method!r}")
    path = kwargs.get("weights_path") if isinstance(kwargs, dict) else None
    if not isinstance(path, str) or not path:
        raise ApiError(500, "InternalServerError", "reload_weights needs kwargs.weights_path")
    _engine(request).weights = path
    return web.json_response({"results": [None]})


def _transfer(request: web.Request, active: bool | None = None) -> Transfer:
    """The session, checked as vLLM's worker does (a RuntimeError there: a 500 here)."""
    transfer = request.app[_TRANSFER]
    if transfer.init_info is None:
        raise ApiError(500, "InternalServerError", "Weight transfer not configured. Please set "
                       "weight_transfer_config to enable weight transfer.")
    if active is True and not transfer.active:
        raise ApiError(500, "InternalServerError", "start_weight_update must be called before update_weights.")
    if active is False and transfer.active:
        raise ApiError(500, "InternalServerError", "start_weight_update called while a weight update is already "
                       "active. Call finish_weight_update first.")
    return transfer


async def init_weight_transfer_engine(request: web.Request) -> web.Response:
    info = (await _body(request)).get("init_info")
    if not isinstance(info, dict):
        raise ApiError(422, "BadRequestError", "init_info is required (an object)", "init_info")
    request.app[_TRANSFER].init_info = info
    return web.json_response({"message": "Weight transfer initialized"})


async def shutdown_weight_transfer_engine(request: web.Request) -> web.Response:
    request.app[_TRANSFER].init_info = None
    return web.json_response({"message": "Weight transfer shut down"})


async def start_weight_update(request: web.Request) -> web.Response:
    _transfer(request, active=False).active = True
    return web.json_response({"message": "Weight update started"})


async def update_weights(request: web.Request) -> web.Response:
    info = (await _body(request)).get("update_info")
    if not isinstance(info, (dict, list)):
        raise ApiError(422, "BadRequestError", "update_info is required (an object or a list)", "update_info")
    _transfer(request, active=True)
    _engine(request).weights = "transfer:" + json.dumps(info, sort_keys=True)
    return web.json_response({"message": "Weights updated"})


async def finish_weight_update(request: web.Request) -> web.Response:
    version = (await _body(request)).get("weight_version")
    _transfer(request, active=True).active = False
    if isinstance(version, str):
        _engine(request).weight_version = version
    return web.json_response({"message": "Weight update finished"})


async def update_weight_version(request: web.Request) -> web.Response:
    version = (await _body(request)).get("new_version")
    if not isinstance(version, str):
        raise ApiError(422, "BadRequestError", "new_version is required (a string)", "new_version")
    _engine(request).weight_version = version
    return web.json_response({"success": True, "new_version": version})


async def weight_info(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": _engine(request).weight_version})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    return web.json_response({"success": _engine(request).reset_prefix_cache()})


async def update_weights_from_disk(request: web.Request) -> web.Response:
    """SGLang's: the weights, the version and (``flush_cache``, default true) the cache in one call."""
    body = await _body(request)
    path, version = body.get("model_path"), body.get("weight_version")
    if not isinstance(path, str) or not path:
        return web.json_response({"success": False, "message": "model_path is required", "num_paused_requests": 0},
                                 status=400)
    engine = _engine(request)
    if body.get("flush_cache", True) and not engine.reset_prefix_cache():
        return web.json_response({"success": False, "message": "cache flush failed: requests are running",
                                  "num_paused_requests": 0}, status=400)
    engine.weights = path
    if isinstance(version, str):
        engine.weight_version = version
    return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                              "num_paused_requests": 0})


async def get_model_info(request: web.Request) -> web.Response:
    return web.json_response({"model_path": _engine(request).weights, "weight_version": _engine(request).weight_version})

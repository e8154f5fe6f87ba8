"""The fake replica's RL engine routes: the ones vLLM serves with ``VLLM_SERVER_DEV_MODE=1``.

Same paths, parameters and answers as the pinned vLLM (0.32: ``entrypoints/rl/online`` and
``entrypoints/serve/dev``), so the router's fan-out (``fleet/rlfanout.py``) is tested against
the shapes it meets on real engines:

- ``POST /pause?mode=abort|wait|keep``, ``POST /resume``, ``GET /is_paused``: while paused, new
  generation requests wait; ``abort`` ends the requests in flight with finish_reason "abort".
- ``POST /abort_requests`` ``{}``: every unfinished request ends with finish_reason "abort".
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
from typing import Any

from aiohttp import web

from .engine import Engine
from .protocol import ApiError

PAUSE_MODES = ("abort", "wait", "keep")
_RESUMED = web.AppKey("fakevllm_resumed", asyncio.Event)
_ENGINE = web.AppKey("fakevllm_rl_engine", Engine)


def add_routes(app: web.Application, key: web.AppKey[Engine]) -> None:
    app[_ENGINE] = app[key]
    resumed = asyncio.Event()
    resumed.set()
    app[_RESUMED] = resumed
    app.router.add_post("/pause", pause)
    app.router.add_post("/resume", resume)
    app.router.add_get("/is_paused", is_paused)
    app.router.add_post("/abort_requests", abort_requests)
    app.router.add_post("/collective_rpc", collective_rpc)
    app.router.add_post("/update_weight_version", update_weight_version)
    app.router.add_get("/weight_info", weight_info)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    app.router.add_get("/get_model_info", get_model_info)


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
    request.app[_RESUMED].clear()
    if mode == "abort":
        _engine(request).abort_all()
    return web.json_response({"status": "paused"})


async def resume(request: web.Request) -> web.Response:
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

"""The HTTP face of the fake replica: vLLM's OpenAI-compatible routes on aiohttp.

Handler cancellation is switched on for the app itself, so whatever runner
serves it, a client that disconnects cancels its handler and the ``finally``
aborts the request in the engine (its blocks are freed, the gauges drop).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from . import rl_api
from .config import FakeVllmConfig
from .engine import Engine, Stream
from .metrics import Metrics
from .protocol import (
    CHAT,
    TEXT,
    ApiError,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    Kind,
    TokenizeRequest,
    usage,
)
from .tokens import output_piece, render_chat, tokenize

ENGINE = web.AppKey("fakevllm_engine", Engine)
_Model = TypeVar("_Model", bound=BaseModel)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(config: FakeVllmConfig | None = None) -> web.Application:
    config = config or FakeVllmConfig()
    app = web.Application(middlewares=[_errors], handler_args={"handler_cancellation": True})
    app[ENGINE] = Engine(config, Metrics(config.served_model_name))
    app.cleanup_ctx.append(_engine_task)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/tokenize", tokenize_route)
    rl_api.add_routes(app, ENGINE)
    return app


async def _engine_task(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[ENGINE].run(), name="fake-vllm engine")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@web.middleware
async def _errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response(exc.body(), status=exc.status)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await _parse(request, ChatCompletionRequest)
    prompt = tokenize(_render(body.messages, body.add_generation_prompt))
    return await _generate(request, CHAT, body, prompt)


async def completions(request: web.Request) -> web.StreamResponse:
    body = await _parse(request, CompletionRequest)
    prompt = tokenize(body.prompt) if isinstance(body.prompt, str) else body.prompt
    return await _generate(request, TEXT, body, prompt)


async def models(request: web.Request) -> web.Response:
    config = request.app[ENGINE].config
    card = {"id": config.served_model_name, "object": "model", "created": int(time.time()),
            "owned_by": "vllm", "root": config.served_model_name, "parent": None,
            "max_model_len": config.max_model_len, "permission": []}
    return web.json_response({"object": "list", "data": [card]})


async def health(request: web.Request) -> web.Response:
    return web.Response()


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[ENGINE].metrics.render(),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


async def tokenize_route(request: web.Request) -> web.Response:
    body = await _parse(request, TokenizeRequest)
    config = request.app[ENGINE].config
    _check_model(config, body.model)
    text = body.prompt if body.messages is None else _render(body.messages, body.add_generation_prompt)
    tokens = tokenize(text or "")
    return web.json_response({"count": len(tokens), "max_model_len": config.max_model_len,
                              "tokens": tokens, "token_strs": None})


async def _generate(request: web.Request, kind: Kind, body: ChatCompletionRequest | CompletionRequest,
                    prompt: list[int]) -> web.StreamResponse:
    engine = request.app[ENGINE]
    _check_model(engine.config, body.model)
    await rl_api.unpaused(request.app)
    check_length(engine.config, len(prompt), body.output_limit)
    try:
        stream = engine.submit(prompt, body.output_limit)
    except ValueError as exc:  # more KV blocks than the pool has
        raise ApiError.bad_request(str(exc)) from None
    head = {"id": f"{kind.id_prefix}-{request.headers.get('X-Request-Id') or uuid.uuid4().hex}",
            "created": int(time.time()), "model": engine.config.served_model_name}
    try:
        if body.stream:
            return await _stream(request, kind, head, stream, body.include_usage)
        return await _complete(kind, head, stream)
    finally:
        engine.abort(stream)  # a no-op unless the client left before the end


async def _complete(kind: Kind, head: dict[str, Any], stream: Stream) -> web.Response:
    request = stream.request
    seed = stream.seed
    count = 0
    async for _ in stream:
        count += 1
    text = "".join(output_piece(seed, i) for i in range(count))
    return web.json_response({
        **head, "object": kind.object, "choices": [kind.choice(text, stream.finish_reason)],
        "usage": usage(request.num_prompt_tokens, count, request.num_cached_tokens or 0),
    })


async def _stream(request: web.Request, kind: Kind, head: dict[str, Any], stream: Stream,
                  include_usage: bool) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    engine_request = stream.request
    seed, last = stream.seed, engine_request.max_tokens - 1
    count = 0
    try:
        async for _ in stream:
            frames = []
            if count == 0 and kind.chat:
                frames.append(_chunk(kind, head, [kind.delta("", None, role=True)]))
            finish = stream.finish_reason if count == last else None
            frames.append(_chunk(kind, head, [kind.delta(output_piece(seed, count), finish)]))
            count += 1
            await response.write("".join(frames).encode())
        if stream.finish_reason == "abort":  # vLLM's last chunk of an aborted request says so
            await response.write(_chunk(kind, head, [kind.delta("", "abort")]).encode())
        if include_usage:
            total = usage(engine_request.num_prompt_tokens, count, engine_request.num_cached_tokens or 0)
            await response.write(_chunk(kind, head, [], total).encode())
        await response.write(b"data: [DONE]\n\n")
    except ConnectionError:
        pass  # the client left; the caller aborts the request
    return response


def _chunk(kind: Kind, head: dict[str, Any], choices: list[dict[str, Any]],
           total: dict[str, Any] | None = None) -> str:
    chunk = {**head, "object": kind.chunk_object, "choices": choices}
    if total is not None:
        chunk["usage"] = total
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"


async def _parse(request: web.Request, model: type[_Model]) -> _Model:
    try:
        data = await request.json()
    except ValueError as exc:
        raise ApiError.bad_request(f"Invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError.bad_request("The request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError.from_validation(exc) from None


def _render(messages: list[ChatMessage], add_generation_prompt: bool) -> str:
    return render_chat(((m.role, m.text()) for m in messages), add_generation_prompt)


def _check_model(config: FakeVllmConfig, model: str | None) -> None:
    if model is not None and model != config.served_model_name:
        raise ApiError(404, "NotFoundError", f"The model `{model}` does not exist.", "model")


def check_length(config: FakeVllmConfig, num_prompt: int, max_tokens: int | None) -> None:
    """vLLM's prompt checks (shared with the gRPC side): not empty, fits ``max_model_len``."""
    if num_prompt == 0:
        raise ApiError.bad_request("The decoder prompt cannot be empty", "prompt")
    num_output = config.default_max_tokens if max_tokens is None else max_tokens
    if num_prompt + num_output > config.max_model_len:
        raise ApiError.bad_request(
            f"This model's maximum context length is {config.max_model_len} tokens. However, you "
            f"requested {num_prompt + num_output} tokens ({num_prompt} in the messages, {num_output} "
            "in the completion). Please reduce the length of the messages or completion.",
            "input_tokens")

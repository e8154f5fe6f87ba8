"""``rollout-router fake-vllm``: serve one simulated replica until SIGINT/SIGTERM."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal

from aiohttp import web

from .api import create_app
from .config import FakeVllmConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--host``, ``--port`` and one flag per ``FakeVllmConfig`` field."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (any 127.0.0.x works)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (0 picks a free one)")
    for knob in dataclasses.fields(FakeVllmConfig):
        flag = "--" + knob.name.replace("_", "-")
        parser.add_argument(flag, *knob.metadata["aliases"], dest=knob.name, type=type(knob.default),
                            default=knob.default, help=f"{knob.metadata['help']} (default: %(default)s)")


def config_from_args(args: argparse.Namespace) -> FakeVllmConfig:
    return FakeVllmConfig(**{knob.name: getattr(args, knob.name) for knob in dataclasses.fields(FakeVllmConfig)})


def run(args: argparse.Namespace) -> None:
    """Serve on uvloop; prints ``fake-vllm listening on http://HOST:PORT`` once bound."""
    config = config_from_args(args)
    try:
        import uvloop
    except ImportError:  # uvloop does not exist on Windows
        asyncio.run(serve(config, args.host, args.port))
    else:
        uvloop.run(serve(config, args.host, args.port))


async def serve(config: FakeVllmConfig, host: str, port: int) -> None:
    """The async core of ``run``, for callers that already have a loop (main thread only)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    # In-flight requests get a moment to end, then are cancelled (and aborted).
    runner = web.AppRunner(create_app(config), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_port = runner.addresses[0][1]
        print(f"fake-vllm listening on http://{host}:{bound_port}", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()

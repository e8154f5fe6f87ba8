"""``rollout-router fake-vllm``: serve one simulated replica until SIGINT/SIGTERM."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from .. import listening, usage
from ..usage import UsageError
from .api import create_app
from .config import FakeVllmConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--host``, ``--port``, ``--grpc-port`` and one flag per ``FakeVllmConfig`` field."""
    parser.add_argument("--host", default="127.0.0.1", type=usage.host,
                        help="address to bind (any 127.0.0.x works; default: %(default)s)")
    parser.add_argument("--port", type=usage.port_or_zero, default=8000,
                        help="port to bind (0 picks a free one; default: %(default)s)")
    parser.add_argument("--grpc-port", type=usage.port_or_zero, default=None,
                        help="also serve vLLM's gRPC VllmEngine service on --host at this port, sharing "
                             "the engine (0 picks a free one; default: no gRPC)")
    parser.add_argument("--port-file", type=usage.new_file, metavar="PATH",
                        help='once listening, write the bound ports here as JSON ({"http": PORT, "grpc": PORT or '
                             'null, "admin": null}; a replica has no admin port); useful with --port 0')
    for knob in dataclasses.fields(FakeVllmConfig):
        flag = "--" + knob.name.replace("_", "-")
        parser.add_argument(flag, *knob.metadata["aliases"], dest=knob.name, type=_knob_type(knob),
                            default=knob.default, help=f"{knob.metadata['help']} (default: %(default)s)")


def _knob_type(knob: dataclasses.Field) -> Callable[[str], Any]:
    """The argparse type of a knob: the range ``FakeVllmConfig`` checks, so a bad value is refused by name."""
    low = knob.metadata["min"]
    if low is None:
        return type(knob.default)
    if isinstance(knob.default, int):
        return usage.at_least(int(low))
    return usage.number(positive=knob.metadata["exclusive"])


async def _bindable(host: str, port: int) -> None:
    """Bind ``host:port`` and let go: grpcio prints its own multi-line log when its bind fails, so test first."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]  # ::1 is IPv6, 127.0.0.1 IPv4
    socket.create_server((host, port), family=family).close()


def config_from_args(args: argparse.Namespace) -> FakeVllmConfig:
    """The config the flags give; a value it refuses is a ``UsageError`` naming the flag."""
    try:
        return FakeVllmConfig(**{knob.name: getattr(args, knob.name) for knob in dataclasses.fields(FakeVllmConfig)})
    except ValueError as error:
        name, _, problem = str(error).partition(" ")
        raise UsageError(f"--{name.replace('_', '-')}: {problem}") from None


def run(args: argparse.Namespace) -> None:
    """Serve on uvloop; prints ``fake-vllm listening on http://HOST:PORT`` once bound.

    With ``--grpc-port`` a second line follows: ``fake-vllm grpc listening on HOST:PORT``;
    with ``--port-file`` both ports are written there too (see ``listening``).
    """
    config = config_from_args(args)
    main = serve(config, args.host, args.port, getattr(args, "grpc_port", None), getattr(args, "port_file", None))
    try:
        import uvloop
    except ImportError:  # uvloop does not exist on Windows
        asyncio.run(main)
    else:
        uvloop.run(main)


async def serve(config: FakeVllmConfig, host: str, port: int, grpc_port: int | None = None,
                port_file: Path | None = None) -> None:
    """The async core of ``run``, for callers that already have a loop (main thread only).

    Both servers are bound before either line is printed (and the port file
    written); they share one engine.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    app = create_app(config)
    # In-flight requests get a moment to end, then are cancelled (and aborted).
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    grpc_server = None
    try:
        await usage.bind(web.TCPSite(runner, host, port).start(), "--host", "--port", host, port)
        grpc_bound = None
        if grpc_port is not None:
            from .grpc_api import start_grpc  # grpcio is loaded only when asked for

            await usage.bind(_bindable(host, grpc_port), "--host", "--grpc-port", host, grpc_port)
            grpc_server, grpc_bound = await start_grpc(app, host, grpc_port)
        listening.announce("fake-vllm", host, runner.addresses[0][1], grpc_bound, port_file)
        await stop.wait()
    finally:
        if grpc_server is not None:  # before the runner's cleanup stops the engine loop
            await grpc_server.stop(1.0)
        await runner.cleanup()

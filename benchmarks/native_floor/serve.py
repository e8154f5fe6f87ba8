"""The native floor (native_floor.c), built with the machine's C compiler on first use and served on uvloop.

    python benchmarks/native_floor/serve.py HOST PORT [--route hash|ours] BACKEND_URL...

``--route hash`` (the floor): the session header's CRC-32 picks the replica, as benchmarks/raw_proxy.py does.
``--route ours``: each request is routed and finished by the router's own Python, the calls its HTTP fast path
makes (``attempts.route``, the turn's start; then ``outcome.answered``: the request metrics, passive health, the
replica put back, the turn), on a ``Runtime`` with the default settings (sticky), so the arm costs what a native data path
calling our policy would. Neither is a proxy to run (native_floor.c says what it leaves out).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sysconfig
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvloop

HERE = Path(__file__).resolve().parent
BUILT = HERE.parents[1] / ".cache" / "bench" / "native_floor"


def load() -> Any:
    """The extension, compiled into .cache/ when its source is newer than the build."""
    source = HERE / "native_floor.c"
    library = BUILT / f"native_floor{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not library.exists() or library.stat().st_mtime < source.stat().st_mtime:
        BUILT.mkdir(parents=True, exist_ok=True)
        subprocess.run([sysconfig.get_config_var("CC").split()[0] or "cc", "-O2", "-shared", "-fPIC",
                        f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(library)], check=True)
    spec = importlib.util.spec_from_file_location("native_floor", library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Route = Callable[[bytes | None], tuple[list, object]]


def hashed(pools: dict[str, list]) -> tuple[Route, Callable[[object], None]]:
    lists = list(pools.values())

    def route(key: bytes | None) -> tuple[list, object]:
        return lists[zlib.crc32(key or b"") % len(lists)], None
    return route, lambda token: None


def ours(pools: dict[str, list]) -> tuple[Route, Callable[[object], None]]:
    """Our routing and bookkeeping per request, as ``HttpProxy._fast`` and ``Forwarding.done`` call them."""
    from rollout_router.app import Runtime
    from rollout_router.proxy.attempts import route as routed_by
    from rollout_router.proxy.outcome import answered
    from rollout_router.settings import RouterSettings
    runtime = Runtime(RouterSettings(backends=list(pools)))
    runtime.apply(runtime.settings)
    monotonic = time.monotonic

    def route(key: bytes | None) -> tuple[list, object]:
        routing = routed_by(runtime, key.decode() if key else None)
        routing.start = monotonic()
        routing.turn.begin(routing.start)  # type: ignore[union-attr]  # ``route`` measures every turn
        return pools[routing.replica.id], routing

    def finish(token: Any) -> None:
        answered(runtime, token, 200, 200, None, True, monotonic())
    return route, finish


async def serve(host: str, port: int, how: str, backends: list[str]) -> None:
    native = load()
    loop = asyncio.get_running_loop()
    pools: dict[str, list] = {url: [] for url in backends}
    addresses = {id(pools[url]): (urlsplit(url).hostname or "", urlsplit(url).port or 80) for url in backends}
    route, finish = (ours if how == "ours" else hashed)(pools)

    async def opened(pool: list, client: object, token: object, request: bytes) -> None:
        _, upstream = await loop.create_connection(lambda: native.Upstream(pool), *addresses[id(pool)])
        upstream.send(client, token, request)

    def connect(pool: list, client: object, token: object, request: bytes) -> None:
        loop.create_task(opened(pool, client, token, request))
    server = await loop.create_server(lambda: native.Client(route, finish, connect), host, port)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--route", choices=["hash", "ours"], default="hash")
    parser.add_argument("backends", nargs="+")
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.route, args.backends))


if __name__ == "__main__":
    main()

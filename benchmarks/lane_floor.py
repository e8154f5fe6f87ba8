"""The router's native lane with its routing stubbed out: what the lane's C costs alone (issue 22).

    python benchmarks/lane_floor.py HOST PORT BACKEND_URL

The traffic port runs the router's own lane (``proxy/http/lane/_lane.pyx``), but ``LaneGlue.route`` sends every
request to the one backend and ``finish`` records nothing: no policy, in-flight count, metrics or passive health. Beside
``native floor (C protocols)`` (hand-written C) it shows what the lane costs as C; beside ``ours (sticky)``, what
the router's routing and bookkeeping add. Not a router to run.
"""
from __future__ import annotations

import argparse
import asyncio
from typing import Any

import uvloop

from rollout_router.app import Runtime
from rollout_router.proxy.http import lane, traffic
from rollout_router.settings import RouterSettings


class Stubbed(lane.LaneGlue):
    """The lane's glue, but for its two calls per request: one replica, nothing recorded (and no sticky hit in C)."""

    def __init__(self, proxy: Any) -> None:
        super().__init__(proxy)
        self.native.sticky = None

    def route(self, *_: Any) -> tuple[Any, bool, None]:  # type: ignore[override]
        return self.pool(self.context.settings.backends[0].url), False, None

    def finish(self, *_: Any) -> None:
        return None


async def serve(host: str, port: int, backend: str) -> None:
    if lane.unavailable() is not None:
        raise SystemExit(f"lane_floor.py: {lane.unavailable()}")
    traffic.LaneGlue = Stubbed  # type: ignore[misc]  # what HttpProxy builds its lane's glue from
    runtime = Runtime(RouterSettings(backends=[backend]), data_path="native")
    await runtime.start(host, port)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("backend")
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.backend))


if __name__ == "__main__":
    main()

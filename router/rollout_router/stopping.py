"""A router stopping (SIGTERM, a first Ctrl-C): it finishes what it accepted, and takes nothing new for long.

A router that keeps accepting until it is idle never stops under a client that keeps sending, and one that
stops at once cuts every stream in flight. Draining instead, within ``timeout`` seconds (``--drain-timeout``):

1. ``/readyz`` answers 503 at once (``begin``), so a Service or a readiness-following balancer moves on; a
   fleet router also stops owning keys and hands its pins over (``fleet/leaving.py``);
2. for ``accept_seconds`` (``--drain-accept-seconds``; a few seconds in the operator's pods, while a
   Service's endpoints catch up) it still accepts and answers as before;
3. then it stops accepting (``stop_accepting``): its listeners close (connections the kernel had queued for
   them are taken first); a kept-alive connection closes after the answers to the requests read on it, the last
   with ``Connection: close``, or once idle for a second; gRPC connections are told GOAWAY;
4. it finishes every request it accepted, until no connection is left open (a request still being read on one
   is accepted too), and ``end`` runs (a fleet router pushes the pins made meanwhile and tells its peers it is
   done).

At the deadline it exits anyway and says how many requests it cut. Logged: the start, and either what it
finished or what it cut.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

BUSY_POLL_SECONDS = 0.05  # how often the requests still in flight are counted while draining
SIGNAL_REPEAT_SECONDS = 1.0  # a stop signal this soon after the first is the same one delivered twice


@dataclasses.dataclass(frozen=True)
class Drain:
    """What a draining router does at each step (``Runtime.drain`` makes it)."""

    busy: Callable[[], int]  # anything left: requests and calls, forwarded ones, leases, connections open
    requests: Callable[[], int]  # requests and calls being answered now (what the deadline would cut)
    answered: Callable[[], int]  # requests answered so far (a running count)
    begin: Callable[[], Awaitable[None]]  # fail /readyz (and leave the fleet's ownership)
    stop_accepting: Callable[[], None]  # close the listeners; kept-alive connections close after their next answer
    end: Callable[[], Awaitable[bool]]  # after the last request: whether all was handed over (a fleet's pins)
    pins_left: Callable[[], int] = lambda: 0  # a fleet router's pins not handed over yet (said at the deadline)


async def drain(steps: Drain, timeout: float, accept_seconds: float, why: str = "") -> bool:
    """Run ``steps`` within ``timeout`` seconds; True when everything accepted was finished (and handed over).
    ``why`` (the signal) starts the first log line."""
    loop = asyncio.get_running_loop()
    started, answered = loop.time(), steps.answered()
    log.info("%sstopping gracefully: /readyz fails now; new connections are accepted for %gs more, then refused; "
             "%d requests in flight; at most %gs (--drain-timeout)", f"{why}: " if why else "",
             min(accept_seconds, timeout), steps.requests(), timeout)
    try:
        async with asyncio.timeout(timeout):
            await steps.begin()
            await asyncio.sleep(max(0.0, accept_seconds - (loop.time() - started)))
            steps.stop_accepting()
            await until_idle(steps.busy)
            done = await steps.end()
    except TimeoutError:
        left = steps.pins_left()
        log.warning("stopped at --drain-timeout %gs: %d requests finished, %d cut%s", timeout,
                    steps.answered() - answered, steps.requests(),
                    f", {left} pins not handed over (their sessions are placed anew)" if left else "")
        return False
    log.info("stopped in %.2fs: %d requests finished, none cut", loop.time() - started, steps.answered() - answered)
    return done


async def until_idle(busy: Callable[[], int]) -> None:
    while busy():
        await asyncio.sleep(BUSY_POLL_SECONDS)

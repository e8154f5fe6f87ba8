"""The protocol of forwarding one request, shared by the HTTP and gRPC listeners.

Route (the replica counted in flight), send one attempt; if the replica
refused before a byte was exchanged, mark it down for a while and try another.
A listener supplies only ``send``: one attempt on the routed replica, which
records how it ended (``outcome.answered``) and raises ``Refused`` when
retrying elsewhere is safe; it stamps the attempt's ``Turn`` (turns.py: first
byte, prefill), counted once the replica accepted the request. The replica is
put back exactly once whatever ends the attempt. An attempt the replica did
not accept (refused, an error status, no answer) hands its decision back to
the policy (``Policy.forget``), so a rejected request leaves the session's pin
as it was.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from .. import descriptors
from ..policy import Outcome
from .context import RouterContext
from .outcome import Routing, put_back, refused, routed
from .turns import KEPT, Turn, turn_for


class Refused(Exception):
    """The replica refused the request before any byte was exchanged: safe to retry elsewhere (``failure``: what
    passive health hears of it, e.g. a connect that timed out)."""

    def __init__(self, detail: str, failure: str | None = None):
        super().__init__(detail)
        self.failure = failure


class OutOfDescriptors(Exception):
    """The router has no file descriptor left for a connection to the replica: its own shortage, not the
    replica's failure, so nothing is marked down and the client is told to retry (descriptors.py)."""

    def __init__(self, where: str):
        descriptors.report(where)
        super().__init__("the router is out of file descriptors (RLIMIT_NOFILE): retry later")


def refused_or_short(error: OSError, detail: str) -> Exception:
    """What a failed connect to a replica means: ``Refused`` (retry elsewhere), or the router's own shortage."""
    return OutOfDescriptors("connect") if descriptors.local_shortage(error) else Refused(detail)


class AllRefused(Exception):
    """Every attempt was refused."""

    def __init__(self, attempts: int):
        super().__init__(f"replicas refused the connection on all {attempts} attempts")


async def forward(context: RouterContext, key: str | None, send: Callable[[Routing], Awaitable[None]],
                  grpc: bool = False, prefix: Sequence[int] | str | None = None, group: str | None = None,
                  first: Routing | None = None) -> None:
    """``send`` on a routed replica, retried on others while replicas refuse (``group``: its GRPO group key).

    ``send`` records how its attempt ended (``outcome.answered``); a refusal is recorded here
    (``outcome.refused``), and the replica is put back once whatever ends the attempt.
    While dispatch is paused (``/v1/rl/pause``) it waits its turn, or raises ``Paused``. ``first``: the
    first attempt's routing, already done (the HTTP fast path's, handed over when it could not finish).
    Raises ``NoReplicaError`` when none can take the request, ``AllRefused``
    when every attempt was refused, ``OutOfDescriptors`` when the router could not open a connection at all.
    """
    rl = context.rl
    if rl.paused and first is None:  # the only cost of the RL pause while dispatch runs: this check
        await rl.wait_turn()
    attempts = context.settings.connect_retries + 1
    for _ in range(attempts):
        routing = first or route(context, key, prefix, grpc, group)
        first = None
        try:
            await send(routing)
        except OutOfDescriptors:
            refused(context, routing, down=False)
            raise
        except Refused as refusal:
            refused(context, routing, refusal.failure)
            continue
        finally:
            put_back(context.replicas, routing)
        return
    raise AllRefused(attempts)


def route(context: RouterContext, key: str | None, prefix: Sequence[int] | str | None = None, grpc: bool = False,
          group: str | None = None) -> Routing:
    """One attempt's routing, counted in flight, with its ``Turn`` (its clock started by ``Turn.begin``);
    NoReplicaError."""
    return measured(taken(context, key, prefix, grpc, group))


def measured(routing: Routing, started: float = 0.0) -> Routing:
    """``taken``'s routing with a ``Turn`` for the kept turn it left unmeasured: the coroutine path's attempts
    (``forward``) stamp a turn on every request (``started``: the attempt's start, if it has one). The fast path
    and the lane do not: their exchange stamps the first byte, recorded alone (``outcome.answered``'s ``first_at``)."""
    if routing.turn is None:
        routing.turn = Turn(KEPT, None, False, started)
    return routing


def taken(context: RouterContext, key: str | None, prefix: Sequence[int] | str | None = None, grpc: bool = False,
          group: str | None = None, started: float = 0.0) -> Routing:
    """``route`` for the native lane, which records a kept turn that is not measured, most requests, with no
    ``Turn`` made: None in its place, its first byte observed alone (``outcome.recorded``)."""
    decision, replica = context.balancer.take(key, prefix, grpc, group)
    if decision.outcome is Outcome.KEPT:  # most turns: nothing moved to say why, and a share of them is measured
        turn = Turn(KEPT, None, True, started) if context.metrics.margin.sample() else None
    else:
        turn = turn_for(decision, context.balancer.why_moved(decision, grpc), started)
    return routed(key, group, decision, replica, turn, started)

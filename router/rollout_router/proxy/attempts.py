"""The protocol of forwarding one request, shared by the HTTP and gRPC listeners.

Route, take a lease, send one attempt, release the lease; if the replica
refused before a byte was exchanged, mark it down for a while and try another.
A listener supplies only ``send``: one attempt on the leased replica, which
returns whether the replica accepted the request and raises ``Refused`` when
retrying elsewhere is safe; it stamps the attempt's ``Turn`` (turns.py: first
byte, prefill), counted once the replica accepted the request. The lease is
released exactly once whatever ends the attempt. An attempt the replica did
not accept (refused, an error status, no answer) hands its decision back to
the policy (``Policy.forget``), so a rejected request leaves the session's pin
as it was.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from .. import descriptors
from ..policy import Decision, Outcome
from ..replicas import Lease, Replica
from .context import RouterContext
from .turns import KEPT, Turn, turn_for


class Refused(Exception):
    """The replica refused the request before any byte was exchanged: safe to retry elsewhere."""


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


Routed = tuple[Decision, Lease, Turn]  # one attempt's routing (``route``)
Taken = tuple[Decision, Replica, Turn | None]  # the same without a lease, and a kept turn unmeasured (``taken``)


async def forward(context: RouterContext, key: str | None, send: Callable[[Lease, Turn], Awaitable[bool]],
                  grpc: bool = False, prefix: Sequence[int] | str | None = None, group: str | None = None,
                  first: Routed | None = None) -> None:
    """``send`` on a routed replica, retried on others while replicas refuse (``group``: its GRPO group key).

    While dispatch is paused (``/v1/rl/pause``) it waits its turn, or raises ``Paused``. ``first``: the
    first attempt's routing, already done (the HTTP fast path's, handed over when it could not finish).
    Raises ``NoReplicaError`` when none can take the request, ``AllRefused``
    when every attempt was refused, ``OutOfDescriptors`` when the router could not open a connection at all.
    """
    rl = context.rl
    if rl.paused and first is None:  # the only cost of the RL pause while dispatch runs: this check
        await rl.wait_turn()
    settings = context.settings  # one snapshot for every attempt of this request
    attempts = settings.connect_retries + 1
    for _ in range(attempts):
        decision, lease, turn = first or route(context, key, prefix, grpc, group)
        first = None
        try:
            accepted = await send(lease, turn)
        except OutOfDescriptors:
            context.balancer.forget(key, decision)
            raise
        except Refused:
            context.replicas.mark_down(lease.replica_id, settings.down_seconds)
            context.metrics.retried(lease.replica_id)
            context.balancer.forget(key, decision)
            continue
        finally:
            lease.release()
        settle(context, key, decision, turn, accepted)
        return
    raise AllRefused(attempts)


def route(context: RouterContext, key: str | None, prefix: Sequence[int] | str | None = None, grpc: bool = False,
          group: str | None = None) -> Routed:
    """One attempt's routing: the decision, its lease (counted in flight) and its ``Turn`` (its clock started by
    ``Turn.begin``); NoReplicaError."""
    return leased(context, taken(context, key, prefix, grpc, group))


def leased(context: RouterContext, routing: Taken, started: float = 0.0) -> Routed:
    """``taken``'s routing under a ``Lease``, with a ``Turn`` for the kept turn it left unmeasured: the Python
    path's attempt stamps a turn on every request (``started``: the attempt's start, if it has one)."""
    decision, replica, turn = routing
    return decision, Lease(context.replicas, replica), turn or Turn(KEPT, None, False, started)


def taken(context: RouterContext, key: str | None, prefix: Sequence[int] | str | None = None, grpc: bool = False,
          group: str | None = None, started: float = 0.0) -> Taken:
    """``route`` for the native lane, which puts the replica back itself, once (no ``Lease`` per request), and
    records a kept turn that is not measured, most requests, with no ``Turn`` made: None in its place, its first
    byte observed alone (``MarginMeter.kept_first_byte``)."""
    decision, replica = context.balancer.take(key, prefix, grpc, group)
    if decision.outcome is Outcome.KEPT:  # most turns: nothing moved to say why, and a share of them is measured
        return decision, replica, Turn(KEPT, None, True, started) if context.metrics.margin.sample() else None
    return decision, replica, turn_for(decision, context.balancer.why_moved(decision, grpc), started)


def settle(context: RouterContext, key: str | None, decision: Decision, turn: Turn, accepted: bool) -> None:
    """An attempt answered (its lease released): count its turn, or hand a rejected decision back."""
    if accepted:
        context.metrics.turn(turn)
    else:
        context.balancer.forget(key, decision)

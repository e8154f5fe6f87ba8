"""One request's routing as a declared record, and the one place that records how the request ended.

Every path (the coroutine path, the HTTP fast path, the native lane and its glue, gRPC, the sibling-worker
delegation) routes into a ``Routing`` and ends it through ``answered`` or ``refused``: those are the only code
that touches passive health, the request metrics, the turn, the replica's in-flight count and the pin after a
request. An answer below 400 is recorded by ``core.answers.answered_ok``, which the lane's sticky hit calls in C
too (``_lane_sticky.pxi``). A request whose decision a sibling
worker made is ended in two halves, each where its state lives: the owner ``settled`` (passive health, the
replica put back, the pin), the worker that forwarded it ``recorded`` (the metrics, the turn).
Anchors: llm-d's request-control hooks with one end-of-stream hook; SMG's load guard released once when the
response ends.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.answers import answered_ok, turn_recorded
from ..core.routing import Routing, routed

if TYPE_CHECKING:
    from ..observability import Metrics
    from ..replicas import ReplicaSet
    from .context import RouterContext
    from .turns import Turn

__all__ = ["Routing", "answered", "put_back", "recorded", "refused", "routed", "settled"]  # Routing: core's record


def put_back(replicas: ReplicaSet, routing: Routing) -> None:
    """The replica's in-flight count taken for ``routing`` given back, once whatever ends the request."""
    if routing.held:
        routing.held = False
        replicas.put(routing.replica)


def answered(context: RouterContext, routing: Routing, code: int | str | None, status: int, failure: str | None,
             accepted: bool, now: float, first_at: float = 0.0) -> None:
    """The replica answered (or failed mid-answer, or the client left): both halves of the record.

    ``code``: the code to count (a gRPC status's name; None: nothing); ``status``: the replica's status for passive health (0: no head,
    a gRPC call's mapped one); ``failure``: what failed before a head; ``accepted``: whether the replica took it
    (a rejected decision goes back to the policy); ``first_at``: the first body byte (lane, kept turn unmeasured)."""
    replicas = context.replicas
    if accepted and failure is None and 0 < status < 400 and code is not None and answered_ok(
            routing, replicas.members, context.metrics.series, code, now, *replicas.indexes):
        _turn(context.metrics, routing.turn, routing.start, first_at)
        return
    settled(context, routing, status, failure, accepted)
    recorded(context.metrics, routing.replica.id, routing.turn, code, accepted, routing.start, now, first_at)


def settled(context: RouterContext, routing: Routing, status: int, failure: str | None, accepted: bool) -> None:
    """The owner's half: passive health hears what the replica did, the replica is put back, and a rejected
    decision is handed back to the policy (``Policy.forget``), so the session's pin stays as it was."""
    if failure is not None:
        context.outliers.failure(routing.replica, failure)
    elif status:
        context.outliers.answered(routing.replica, status)
    put_back(context.replicas, routing)
    if not accepted:
        context.balancer.forget(routing.key, routing.decision)


def recorded(metrics: Metrics, replica: str, turn: Turn | None, code: int | str | None, accepted: bool,
             start: float, now: float, first_at: float = 0.0) -> None:
    """The forwarding worker's half: the request counted by code and duration, an accepted turn's outcome (a
    kept turn with no ``Turn``: its first byte alone, ``MarginMeter.kept_first_byte``)."""
    if code is not None:
        metrics.observe(replica, code, now - start)
    if accepted:
        _turn(metrics, turn, start, first_at)


def _turn(metrics: Metrics, turn: Turn | None, start: float, first_at: float) -> None:
    """An accepted turn's outcome, or a kept turn's first byte alone when it has no ``Turn``
    (``core.answers.turn_recorded``, which the lane's sticky hit calls in C)."""
    turn_recorded(metrics.turn, metrics.margin.kept_first_byte, turn, start, first_at)


def refused(context: RouterContext, routing: Routing, failure: str | None = None, down: bool = True) -> None:
    """The replica refused before a byte was exchanged (safe to retry elsewhere): passive health hears a
    ``failure`` (a connect timed out), the replica is marked down for ``downSeconds`` and the retry counted
    (``down``: not when the router ran out of descriptors, its own shortage), the decision is handed back and the
    replica put back."""
    if failure is not None:
        context.outliers.failure(routing.replica, failure)
    if down:
        context.replicas.mark_down(routing.replica.id, context.settings.down_seconds)
        context.metrics.retried(routing.replica.id)
    context.balancer.forget(routing.key, routing.decision)
    put_back(context.replicas, routing)

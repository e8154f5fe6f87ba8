"""The protocol of forwarding one request, shared by the HTTP and gRPC listeners.

Route, take a lease, send one attempt, release the lease; if the replica
refused before a byte was exchanged, mark it down for a while and try another.
A listener supplies only ``send``: one attempt on the leased replica, which
returns whether the replica accepted the request and raises ``Refused`` when
retrying elsewhere is safe. The lease is released exactly once whatever ends
the attempt. An attempt the replica did not accept (refused, an error status,
no answer) hands its decision back to the policy (``Policy.forget``), so a
rejected request leaves the session's pin as it was.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from .. import descriptors
from ..replicas import Lease
from .context import RouterContext


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


async def forward(context: RouterContext, key: str | None, send: Callable[[Lease], Awaitable[bool]],
                  grpc: bool = False, prefix: Sequence[int] | str | None = None, group: str | None = None) -> None:
    """``send`` on a routed replica, retried on others while replicas refuse (``group``: its GRPO group key).

    Raises ``NoReplicaError`` when none can take the request, ``AllRefused``
    when every attempt was refused, ``OutOfDescriptors`` when the router could not open a connection at all.
    """
    settings = context.settings  # one snapshot for every attempt of this request
    attempts = settings.connect_retries + 1
    for _ in range(attempts):
        decision, lease = context.balancer.acquire(key, prefix, grpc=grpc, group=group)
        try:
            accepted = await send(lease)
        except OutOfDescriptors:
            context.balancer.forget(key, decision)
            raise
        except Refused:
            context.replicas.mark_down(lease.replica_id, settings.down_seconds)
            context.metrics.retries.labels(lease.replica_id).inc()
            context.balancer.forget(key, decision)
            continue
        finally:
            lease.release()
        if not accepted:
            context.balancer.forget(key, decision)
        return
    raise AllRefused(attempts)

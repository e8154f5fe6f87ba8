"""HTTP to the session's owner router: once, over the listener's own upstream pool and relay.

The request goes out as it came (its head, minus hop-by-hop headers, plus the
hop mark of ``proxy/owner.py``) on a keep-alive connection to the owner's
traffic port, and its answer (SSE included) is relayed as it arrives with the
same back-pressure as a replica's. The owner decides and counts; this router
holds no lease. When the owner cannot be reached before the first byte of its
answer (refused, reset, closed, connect timeout) the caller decides locally and
the fleet counts it as owner-unreachable.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ... import owner
from ..connection.relay import STALE, UNREACHED, Exchange, request_bytes
from ..connection.upstream import UpstreamConnection

if TYPE_CHECKING:
    from ....fleet.membership import Member
    from ....fleet.node import Fleet
    from ..connection.client import ClientConnection
    from ..connection.port import Port
    from ..wire.request import HttpRequest


def hop_line(fleet: Fleet) -> bytes:
    return b"%s: %s\r\n" % (owner.HOP_HEADER.encode(), owner.hop_value(fleet))


async def to_owner(proxy: Port, fleet: Fleet, client: ClientConnection, request: HttpRequest,
                   headers: bytes, member: Member) -> bool:
    """Relay ``request`` through the owner ``member``; False when it could not be reached (decide locally)."""
    if member.http is None:
        return False
    target = member.http
    pool = proxy.pools.get(target)
    data = request_bytes(request, pool, headers + hop_line(fleet))

    async def send(conn: UpstreamConnection, reused: bool) -> bool | None:
        if not reused and client.gone:
            conn.close()
            return True
        exchange = Exchange(proxy, client, request, target, conn, reused, forwarded=True)
        exchange.start(data)
        assert exchange.done is not None  # an exchange without a callback has its future
        result = await exchange.done
        if result == STALE:
            return None
        if result == UNREACHED:
            owner.unreached(fleet, member, gone=True)
            return False
        owner.reached(fleet)
        return True

    try:
        return await pool.exchange(send)
    except TimeoutError:  # before OSError, its base class: a slow owner stays a member
        owner.unreached(fleet, member, gone=False)
        return False
    except OSError:
        owner.unreached(fleet, member, gone=True)
        return False

"""HTTP to the session's owner router: once, over the proxy's own upstream pool and relay.

The request goes out as it came (its head, minus hop-by-hop headers, plus
``X-RolloutRouter-Forwarded-By: <this router's id>``) on a keep-alive
connection to the owner's traffic port, and its answer (SSE included) is
relayed as it arrives with the same back-pressure as a replica's. The owner
decides and counts; this router holds no lease. When the owner cannot be
reached before the first byte of its answer (refused, reset, closed, connect
timeout) the caller decides locally and the fleet counts it as owner-unreachable.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..proxy.http.relay import STALE, UNREACHED, Exchange, request_bytes
from .membership import Member

if TYPE_CHECKING:
    from ..proxy.http import HttpProxy
    from ..proxy.http.server import ClientConnection, HttpRequest
    from .node import Fleet

HOP_HEADER = "X-RolloutRouter-Forwarded-By"
HOP = HOP_HEADER.lower().encode()


def hop_line(fleet: Fleet) -> bytes:
    return b"%s: %s\r\n" % (HOP_HEADER.encode(), fleet.self_id.encode())


async def to_owner(proxy: HttpProxy, fleet: Fleet, client: ClientConnection, request: HttpRequest,
                   headers: bytes, member: Member) -> bool:
    """Relay ``request`` through the owner ``member``; False when it could not be reached (decide locally)."""
    if member.http is None:
        return False
    pool = proxy.pools.get(member.http)
    conn = pool.take()
    data: bytes | None = None
    for reused in ((True, False) if conn is not None else (False,)):
        if not reused:
            try:
                conn = await pool.connect()
            except OSError:
                fleet.unreachable(member, gone=True)
                return False
            except TimeoutError:
                fleet.unreachable(member, gone=False)
                return False
            if client.gone:
                conn.close()
                return True
        assert conn is not None
        if data is None:
            data = request_bytes(request, pool, headers + hop_line(fleet))
        exchange = Exchange(proxy, client, request, member.http, conn, reused, forwarded=True)
        exchange.start(data)
        result = await exchange.done
        if result == UNREACHED:
            fleet.unreachable(member, gone=True)
            return False
        if result != STALE:
            fleet.forwarded += 1
            return True
    raise AssertionError("unreachable: a fresh connection is never stale")

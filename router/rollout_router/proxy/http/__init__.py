"""The traffic listener (``traffic``): OpenAI-compatible paths forwarded byte for byte, and the probes.

Packages by job, each importing only those below it (importlinter-http.toml, type-only imports counted):
``wire`` bytes only (the proxy's own answers, response heads, paths, one parsed request); ``connection`` an
asyncio Protocol per client connection parsed with llhttp, its listener, keep-alive connections to replicas and
the relay of one attempt; ``forwarding`` one request on its way (``Forwarding``), a sibling worker's routing and
the hop to the key's owner router; ``lane`` the native lane, its glue and the hand-over both ways; on top the
traffic port (``traffic.HttpProxy``: the fast path and the coroutine path) and the admin port
(``admin_listener``). What a lower layer needs of the traffic port is a Protocol it declares (``connection.Port``,
``forwarding.TrafficPort``). Every request goes through ``forward``, the attempt loop shared with gRPC: route,
lease, one attempt, release once. The path is normalised and checked before anything else
(``wire.routes.normalise``) and the replica gets exactly the path that was checked. Timeouts are found by one
periodic sweep (``proxy/listener.py``), not by a timer per request.
"""
from ..listener import SWEEP_SECONDS
from .connection.relay import CLIENT_CLOSED
from .traffic import HttpProxy
from .wire.routes import FORWARDED_PATHS, REPLICA_HEADER

__all__ = ["CLIENT_CLOSED", "FORWARDED_PATHS", "HttpProxy", "REPLICA_HEADER", "SWEEP_SECONDS"]

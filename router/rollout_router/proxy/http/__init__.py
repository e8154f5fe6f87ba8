"""The traffic listener (``traffic``): OpenAI-compatible paths forwarded byte for byte, and the probes.

An asyncio Protocol server (uvloop when installed) parsing with llhttp
(``server``), keep-alive connections to replicas (``upstream``) and the
relay of one attempt (``relay``). Every request goes through ``forward``,
the attempt loop shared with gRPC: route, lease, one attempt, release once.
The path is normalised and checked before anything else (``routes.normalise``)
and the replica gets exactly the path that was checked. Timeouts are found by
one periodic sweep (``proxy/listener.py``), not by a timer per request. The admin routes
other than the probes live on their own listener (``admin_listener``).
"""
from ..listener import SWEEP_SECONDS
from .relay import CLIENT_CLOSED
from .routes import FORWARDED_PATHS, REPLICA_HEADER
from .traffic import HttpProxy

__all__ = ["CLIENT_CLOSED", "FORWARDED_PATHS", "HttpProxy", "REPLICA_HEADER", "SWEEP_SECONDS"]

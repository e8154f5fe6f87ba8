"""The gRPC listener (``traffic``): every method passed through as raw HTTP/2 frames to the chosen replica.

No gRPC library runs here: the listener speaks HTTP/2 itself (``conn``,
``server``, ``upstream``) and relays each call's frames (``call``), so a
message costs a frame header and a write shared with whatever else arrived
with it, not a trip through a gRPC stack on each side. The session key comes
from request metadata (the HTTP header names, lower-cased), routing goes
through the same ``Balancer`` as HTTP, so a replica's in-flight count is one
number across both protocols, and the limits are the traffic port's:
``maxConnections`` connections, ``maxGrpcStreams`` calls in progress,
``maxBodyBytes`` per request message, and request bytes held counted in the
same ``maxBufferedBytes`` budget as HTTP's. A limit hit is answered
RESOURCE_EXHAUSTED naming it, logged once per episode and counted.
"""
from .traffic import REPLICA_METADATA, GrpcProxy, unary_request_methods

__all__ = ["GrpcProxy", "REPLICA_METADATA", "unary_request_methods"]

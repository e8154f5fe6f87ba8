"""The in-flight ledger: a replica's count of requests in flight, and its place in the load indexes.

A request is counted on its replica when it is routed (``take``) and given back once, however it ends
(``put``); a replica's load is its own count plus what other routers report (``external``), filed in the HTTP
index and, when it serves gRPC, the gRPC one (``recount``). ``ReplicaSet`` and the native lane's sticky hit
both count through these, on a replica the set holds live (the set handles the others: draining, removed).
"""
from __future__ import annotations

from .loads import LoadIndex
from .replica import ReplicaState


def recount(replica: ReplicaState, http: LoadIndex, grpc: LoadIndex) -> None:
    """File a live replica whose count changed at its load in each index holding it (a replica that serves no
    gRPC is not in the gRPC index)."""
    load = replica.inflight + replica.external
    http.move(replica.id, load)
    if replica.grpc_target is not None:
        grpc.move(replica.id, load)


def take(replica: ReplicaState, http: LoadIndex, grpc: LoadIndex) -> None:
    """One more request in flight on a live replica."""
    replica.inflight += 1
    recount(replica, http, grpc)


def put(replica: ReplicaState, http: LoadIndex, grpc: LoadIndex) -> None:
    """A request ``take`` counted on a live replica ended (the caller has checked its count is above zero)."""
    replica.inflight -= 1
    recount(replica, http, grpc)

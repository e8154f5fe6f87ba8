"""What every request reads and writes of a replica: its id, its gRPC target, its counts in flight (here and
through other routers) and its runs of failures and of 5xx answers (passive health).

``replicas.Replica`` adds the rest (health, ejection, sources). The in-flight ledger and an answer's record
(``ledger``, ``answers``) read and write these fields, which compiled are C fields (``replica.pxd``): the native
lane's sticky hit reaches them with no attribute lookup.
"""
from __future__ import annotations


class ReplicaState:
    """A replica's part that the request path counts in."""

    __slots__ = ("id", "grpc_target", "inflight", "external", "failures", "server_errors")

    def __init__(self, replica_id: str, grpc_target: str | None = None, external: int = 0) -> None:
        self.id: str = replica_id  # its HTTP base URL, or ``grpc://HOST:PORT`` for a gRPC-only one
        self.grpc_target: str | None = grpc_target
        self.inflight: int = 0
        self.external: int = external  # in flight through other routers (fleet load view)
        self.failures: int = 0  # consecutive failures (passive health); a success resets it
        self.server_errors: int = 0  # consecutive 5xx answers (passive health); any other answer resets it

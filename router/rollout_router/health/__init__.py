"""Replica health: passive (outlier ejection from real traffic) and active (probing each replica's /health).

``outliers.OutlierDetector`` counts each replica's failures in a row as the
HTTP and gRPC listeners report them and ejects a replica for a while, Envoy
style. ``probes.Prober`` probes every live replica's HTTP health path in
rounds and takes a replica out of rotation until a probe passes. Both act
through the ``ReplicaSet``, so the policy simply no longer sees the replica
and re-places its sessions on their next turn.
"""
from .outliers import CLOSED, INVALID_RESPONSE, TIMEOUT, OutlierDetector
from .probes import Prober, probe

__all__ = ["CLOSED", "INVALID_RESPONSE", "OutlierDetector", "Prober", "TIMEOUT", "probe"]

"""Requests on their way to a replica: the state one request carries across the traffic port's paths
(``forwarding``), a sibling worker's routing (``delegated``), the hop to the key's owner router (``owner``), and
the declared interface of the traffic port they use (``port``)."""
from .forwarding import Forwarding
from .port import TrafficPort

__all__ = ["Forwarding", "TrafficPort"]

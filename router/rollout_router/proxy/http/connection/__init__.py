"""Connections: the client's (``client``, parsed by llhttp), the listener that makes them (``listener``), the
keep-alive connections to the replicas (``upstream``) and one attempt's bytes between the two (``relay``), with
the declared interface of the traffic port the relay uses (``port``)."""
from .client import ClientConnection
from .listener import HttpListener
from .port import Port

__all__ = ["ClientConnection", "HttpListener", "Port"]

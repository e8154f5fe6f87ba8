"""The native lane: the traffic port's common request parsed, routed, forwarded and relayed in C (``_lane.pyx``
and its ``.pxi`` files, ``_lane.pyi`` its interface to Python), the router's side of it (``glue``: what the lane
calls, and the hand-over both ways), a connection handed to the Python path (``handover``) and the hash of the
lane's sources (``sources``). ``unavailable`` says why a router cannot run it, or None."""
from .glue import LaneGlue, _lane, unavailable

__all__ = ["LaneGlue", "_lane", "unavailable"]

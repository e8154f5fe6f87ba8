"""What forwarding to a session's owner router means for both protocols: the hop mark, the slack, the counts.

The fleet decides (``Fleet.via_owner``: who owns the key, whether to try once
more); the listener of each protocol sends (``http/forwarding/owner.py``, ``grpc/owner.py``).
A forwarded request carries ``X-RolloutRouter-Forwarded-By: <this router's id>``
(gRPC metadata is the same name, lower-cased), so the owner decides instead of
forwarding again. The forwarding router gives the owner ``FORWARD_SLACK_SECONDS``
more than its own timeouts: the owner times its replica out first, and says so.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..fleet.membership import Member
    from ..fleet.node import Fleet

HOP_HEADER = "X-RolloutRouter-Forwarded-By"
HOP = HOP_HEADER.lower().encode()  # as the HTTP parser keeps header names, and as gRPC metadata is named
FORWARD_SLACK_SECONDS = 5.0


def hop_value(fleet: Fleet) -> bytes:
    """This router's id, the hop mark's value."""
    return fleet.self_id.encode()


def reached(fleet: Fleet) -> None:
    """The owner answered: the request is its."""
    fleet.forwarded += 1


def unreached(fleet: Fleet, member: Member, gone: bool) -> None:
    """The owner could not be reached before any byte of its answer; ``gone``: refused or reset, not slow."""
    fleet.unreachable(member, gone)

"""gRPC to the session's owner router: the call's frames relayed to the owner's gRPC port, once.

The call carries the hop mark of ``proxy/owner.py`` as metadata; the owner
decides and counts. When the owner cannot be reached before any frame of its
answer the caller decides locally and the fleet counts it as owner-unreachable.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import owner
from .call import REFUSED, Call

if TYPE_CHECKING:
    from ...fleet.membership import Member
    from ...fleet.node import Fleet


async def to_owner(call: Call, fleet: Fleet, member: Member) -> bool:
    """Relay ``call`` through the owner ``member``; False when it could not be reached (decide locally)."""
    if member.grpc is None or call.finished:
        return call.finished
    gone = True
    try:
        outcome = await call.attempt(member.grpc, member.id, True, ((owner.HOP, owner.hop_value(fleet)),))
    except TimeoutError:  # before OSError, its base class: a slow owner stays a member; decided here
        outcome, gone = REFUSED, False
    except OSError:
        outcome = REFUSED
    if outcome == REFUSED:
        owner.unreached(fleet, member, gone=gone)
        return False
    owner.reached(fleet)
    return True

"""A pin released fleet-wide: ``DELETE /v1/sessions/KEY`` at any router forgets the conversation everywhere.

A key's pin lives at its owner, and for a while at others too: at a previous
owner until the new one asks for it (``handoff``), at a router that decided
alone while the owner could not be reached. So the router that takes the
DELETE drops its own pin and asks each live peer to drop theirs
(``POST /fleet/v1/release``) at once; each peer's outcome is reported by its
admin URL, and one that did not answer is named, never taken for "not pinned".
A candidate peer that is not live (not answering its polls, so out of the
membership: no key is routed by its pins) is not asked, and named as such.
A router from before this route answers 404: named as failed.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .client import PeerError, Unreachable

if TYPE_CHECKING:
    from .node import Fleet

RELEASED, NOT_PINNED, NOT_LIVE = "released", "not pinned", "not asked: not live"


async def release_at_peers(fleet: Fleet, key: str) -> dict[str, str]:
    """Each candidate peer's outcome for ``key``: ``released``, ``not pinned``, ``not asked: not live``, or why
    it gave none."""
    peers = [member.id for member in fleet.live_peers()]
    silent = {member: NOT_LIVE for member in sorted(fleet.membership.peers) if member not in peers}

    async def one(peer: str) -> str:
        try:
            answer = await fleet.client.call("POST", f"{peer}/fleet/v1/release", {"key": key})
        except Unreachable as error:
            return f"unreachable: {error}"
        except PeerError as error:
            return f"failed: {error}"
        return RELEASED if isinstance(answer, dict) and answer.get("released") is True else NOT_PINNED
    return {**dict(zip(peers, await asyncio.gather(*(one(peer) for peer in peers)))), **silent}

"""A pin released fleet-wide: ``DELETE /v1/sessions/KEY`` at any router forgets the conversation everywhere.

A key's pin lives at its owner, and for a while at others too: at a previous
owner until the new one asks for it (``handoff``), at a router that decided
alone while the owner could not be reached. So the router that takes the
DELETE drops its own pin and asks each live peer to drop theirs
(``POST /fleet/v1/release``) at once; each peer's outcome is reported by its
admin URL, and one that did not answer is named, never taken for "not pinned".
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .client import PeerError, Unreachable

if TYPE_CHECKING:
    from .node import Fleet

RELEASED, NOT_PINNED = "released", "not pinned"


async def release_at_peers(fleet: Fleet, key: str) -> dict[str, str]:
    """Each live peer's outcome for ``key``: ``released``, ``not pinned``, or why it gave none."""
    peers = [member.id for member in fleet.live_peers()]

    async def one(peer: str) -> str:
        try:
            answer = await fleet.client.call("POST", f"{peer}/fleet/v1/release", {"key": key})
        except Unreachable as error:
            return f"unreachable: {error}"
        except PeerError as error:
            return f"failed: {error}"
        return RELEASED if isinstance(answer, dict) and answer.get("released") is True else NOT_PINNED
    return dict(zip(peers, await asyncio.gather(*(one(peer) for peer in peers))))

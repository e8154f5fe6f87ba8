"""A pin released fleet-wide: ``DELETE /v1/sessions/KEY`` at any router forgets the conversation everywhere.

A key's pin lives at its owner, and for a while at others too: at a previous
owner until the new one asks for it (``handoff``), at a router that decided
alone while the owner could not be reached. So the router that takes the
DELETE drops its own pin and asks every other router it knows of to drop
theirs (``POST /fleet/v1/release``) at once: the live members, the candidate
peers that are not live in its view (one not polled yet, or whose polls fail,
may still serve clients with its pins) and its sibling workers. Each outcome
is reported by admin URL; one that did not answer is named, never taken for
"not pinned", and told apart when the router was not live here either
(``AWAY``: most likely gone). A router from before this route answers 404:
named as failed.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .client import PeerError, Unreachable

if TYPE_CHECKING:
    from .node import Fleet

RELEASED, NOT_PINNED = "released", "not pinned"
AWAY = "not live"  # the prefix of an outcome from a router this one does not see live, that did not answer


def others(fleet: Fleet) -> list[str]:
    """Every router to ask: the candidate peers, live or not, and the sibling workers."""
    return sorted({*fleet.membership.peers, *fleet.siblings} - {fleet.self_id})


async def release_at_peers(fleet: Fleet, key: str) -> dict[str, str]:
    """Each other router's outcome for ``key``: ``released``, ``not pinned``, or why it gave none."""
    peers = others(fleet)
    live = {member.id for member in fleet.live_peers()} | set(fleet.siblings)

    async def one(peer: str) -> str:
        try:
            answer = await fleet.client.call("POST", f"{peer}/fleet/v1/release", {"key": key})
        except (Unreachable, PeerError) as error:
            what = f"{'unreachable' if isinstance(error, Unreachable) else 'failed'}: {error}"
            return what if peer in live else f"{AWAY}, {what}"
        return RELEASED if isinstance(answer, dict) and answer.get("released") is True else NOT_PINNED
    return dict(zip(peers, await asyncio.gather(*(one(peer) for peer in peers))))

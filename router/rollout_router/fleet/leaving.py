"""A router leaving the fleet (SIGTERM) hands its sessions over before it exits.

A router that exits at once takes its pins with it: every session it owned is
placed anew on its next turn (a rolling update of the router pods re-places
them all). Leaving instead, as the two fleet steps of a router's drain
(``stopping.py``, within ``--drain-timeout``):

1. ``begin``: it owns no key any more (``Fleet.leaving``): ``/readyz`` answers
   503, so Services stop sending it traffic; a keyed request that still arrives
   goes to the key's owner among the others. It tells its peers (``POST
   /fleet/v1/leave``; its loads answer says ``"leaving": true`` too), which
   stop counting it as an owner but keep following its loads: it still answers
   pull handoffs (``/fleet/v1/handoff``). It pushes every pin it holds to the
   key's new owner, ``BATCH`` at a time (``POST /fleet/v1/adopt``), dropping
   each pin the owner took;
2. (the drain stops accepting and finishes the requests in flight)
3. ``end``: it pushes the pins made meanwhile, and tells its peers it has
   handed everything over (``"done": true``): they no longer ask it, nor count
   it as lost.

If the deadline passes first it exits anyway: the pins it still holds are
lost, and the peers, never told ``done``, re-place those sessions and count
them as ``replaced`` (as for a router killed).
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .client import PeerError, Unreachable
from .ownership import owner

if TYPE_CHECKING:
    from ..balancer import Balancer
    from .node import Fleet

log = logging.getLogger(__name__)

BATCH = 1000  # pins per adopt call
REDIRECTS = 2  # rounds in which a peer may answer that a pin pushed to it is another member's


async def begin(fleet: Fleet) -> None:
    """Own no key any more, tell the peers, push every pin to its new owner."""
    fleet.stop_owning()
    await announce(fleet, done=False)
    await push(fleet)


async def end(fleet: Fleet) -> bool:
    """After the last request: push the pins made meanwhile; True (and the peers told ``done``) when none is left."""
    left = await push(fleet)
    if left == 0:
        await announce(fleet, done=True)
    log.info("left the fleet: %d pins handed over%s", fleet.pushed,
             "" if left == 0 else f", {left} not (no owner answered): their sessions are placed anew")
    return left == 0


async def announce(fleet: Fleet, done: bool) -> None:
    """Tell every candidate peer that this router is leaving (``done``: and has handed every pin over)."""
    body = {"id": fleet.self_id, "done": done}

    async def tell(peer: str) -> None:
        try:
            await fleet.client.call("POST", f"{peer}/fleet/v1/leave", body)
        except (Unreachable, PeerError) as error:
            log.info("peer %s not told that this router is leaving: %s", peer, error)

    await asyncio.gather(*(tell(peer) for peer in list(fleet.membership.peers)))


async def push(fleet: Fleet) -> int:
    """Send every pin held here to its owner among the other members, this router's sibling workers aside (they
    leave with it: a pin handed to one after it pushed its own would be lost); returns how many are still held.

    A peer whose view names another owner for a pin (one that joined a moment ago, or the worker of a new pod
    this router has not seen yet) does not take it but says whose it is: the pin is pushed there next, for
    ``REDIRECTS`` rounds, the last of which the peer must take it. Until a pin lands it stays here, where the
    new owner asks first (``handoff``): nobody else ever holds a pin that its owner would not ask for.
    """
    others = fleet.members() - {fleet.self_id} - fleet.siblings
    pins = fleet.balancer.pins()
    if not others:
        return len(pins)
    by_owner: dict[str, list[tuple[str, str, float]]] = {}
    for pin in pins:
        by_owner.setdefault(owner(pin[0], others), []).append(pin)
    for round_ in range(REDIRECTS + 1):
        final = round_ == REDIRECTS
        pushes = list(by_owner.items())
        answers = await asyncio.gather(*(push_to(fleet, peer, held, final) for peer, held in pushes))
        by_owner = {}
        for (receiver, _), elsewhere in zip(pushes, answers):
            for peer, held in elsewhere.items():
                # Named for this router or a sibling (the receiver missed that they leave): it must take them.
                target = receiver if peer == fleet.self_id or peer in fleet.siblings else peer
                by_owner.setdefault(target, []).extend(held)
        if not by_owner:
            break
    return len(fleet.balancer.pins())


async def push_to(fleet: Fleet, peer: str, pins: list[tuple[str, str, float]],
                  final: bool = False) -> dict[str, list[tuple[str, str, float]]]:
    """``pins`` to ``peer``, ``BATCH`` at a time; each pin it took (or kept its own newer one for) is dropped here
    (unless re-pinned since). Returns the pins it said are another member's, by that member (none when
    ``final``: it takes them all)."""
    balancer, clock = fleet.balancer, fleet.clock
    elsewhere: dict[str, list[tuple[str, str, float]]] = {}
    for start in range(0, len(pins), BATCH):
        batch = held(balancer, pins[start:start + BATCH])
        if not batch:
            continue
        now = clock()
        body = {"from": fleet.self_id, "redirect": not final,
                "pins": [{"key": key, "replica": replica, "idleSeconds": round(max(0.0, now - used), 3)}
                         for key, replica, used in batch]}
        try:
            answer = await fleet.client.call("POST", f"{peer}/fleet/v1/adopt", body)
        except (Unreachable, PeerError) as error:
            log.warning("%d pins not handed to %s: %s; they stay here, where their owner asks first",
                        len(pins) - start, peer, error)
            break
        owners = answer.get("elsewhere") if isinstance(answer, dict) else None
        owners = owners if isinstance(owners, dict) and not final else {}
        for pin in batch:
            key, replica, _ = pin
            if isinstance(owners.get(key), str):
                elsewhere.setdefault(owners[key], []).append(pin)
            elif balancer.pinned(key) == replica:
                balancer.surrender(key)
                fleet.pushed += 1
    return elsewhere


def held(balancer: Balancer, pins: list[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    """Of ``pins`` as listed a moment ago, those still held here as they were, with their last use now: a pin a
    new owner pulled meanwhile (``/fleet/v1/handoff``) is not pushed a second copy."""
    still = []
    for key, replica, _ in pins:
        used = balancer.last_used(key)
        if used is not None and balancer.pinned(key) == replica:
            still.append((key, replica, used))
    return still

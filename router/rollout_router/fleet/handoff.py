"""Pins follow ownership: a new owner asks the previous owner for a session's pin before placing it anew.

When the member set changes, the keys whose owner changed arrive at their new
owner without a pin. Before routing such a key, the owner asks every peer that is
leaving the fleet (it may be pushing that pin), then the key's owner under each
recent member set (``ownership.History``, newest first), with
``POST /fleet/v1/handoff``; the first that holds the pin gives it up and the
session keeps its replica (a handoff). Only when no one holds it and some
previous owner could not be reached (gone for good: refused, reset, silent)
is the session placed anew and counted as replaced. A previous owner that
answers without the pin means the session is new (or expired): nothing is counted.

A router leaving the fleet (SIGTERM) pushes its pins instead (``receive``);
once it said it handed them all over it is ``departed``: not asked again, and
not a loss when it no longer answers.

With entry ownership (``fleet.ownership: entry``) the router a turn enters by
owns its session: lacking a pin, it asks every live peer at once (``lookup``);
a peer holding one gives it up, so the pin moves and there is never a second
copy. Finding none, the session is new (or was held by a router that no
longer answers: ``lookup`` says so).

Concurrent requests for one key wait for the same handoff or lookup.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from ..balancer import Balancer
from .client import PeerError, Unreachable
from .ownership import History

log = logging.getLogger(__name__)

# (peer, key, timeout or None for the default) -> (the replica it held, seconds since that pin's last use), or None
Ask = Callable[[str, str, float | None], Awaitable[tuple[str, float] | None]]


class Handoff:
    """Given ``leaving``: the peers that said they are leaving the fleet (they may still hold pins, or be pushing
    them)."""

    def __init__(self, history: History, balancer: Balancer, ask: Ask, clock: Callable[[], float],
                 leaving: Callable[[], Iterable[str]] = tuple):
        self.history, self.balancer, self._ask, self._clock, self._leaving = history, balancer, ask, clock, leaving
        self.handoffs = self.replaced = 0
        self.lookups = 0  # entry ownership: keys without a pin here that every peer was asked for
        self.gone: set[str] = set()  # previous owners that could not be reached: not asked again until they answer
        #                              a poll of their loads (``Fleet._loads_answered``)
        self.departed: set[str] = set()  # previous owners that left after handing over every pin they held
        self._pending: dict[str, asyncio.Future[None]] = {}

    def needed(self, key: str, believed: str | None = None) -> bool:
        """Whether ``key`` may have a pin elsewhere: not pinned here, and the fleet changed lately (or
        ``believed``, the key's owner in this router's view, sent it here: the views differ for a moment)."""
        return self.balancer.pinned(key) is None and bool(believed or self.history.previous_owners(key, self._clock()))

    async def fetch(self, key: str, believed: str | None = None) -> None:
        """Bring ``key``'s pin here if a previous owner holds it; count a handoff or a replaced session."""
        await self._once(key, lambda: self._fetch(key, believed))

    async def lookup(self, key: str, peers: list[str], timeout: float) -> bool:
        """Entry ownership: ask every peer in ``peers`` at once (each for at most ``timeout`` s) for ``key``'s pin.

        Every peer that held one gave it up; the most recently used is adopted
        here (a handoff). More than one is found only after two routers placed
        the same new session at once: this merges them. False when no pin was
        found and some peer did not answer (it may have held it).
        """
        return await self._once(key, lambda: self._lookup(key, peers, timeout))

    async def _once(self, key: str, work: Callable[[], Awaitable[bool]]) -> bool:
        """Run ``work`` for ``key`` unless it runs already; then wait for that one (and report True)."""
        pending = self._pending.get(key)
        if pending is not None:
            await asyncio.shield(pending)
            return True
        future = self._pending[key] = asyncio.get_running_loop().create_future()
        try:
            return await work()
        finally:
            del self._pending[key]
            future.set_result(None)

    async def _lookup(self, key: str, peers: list[str], timeout: float) -> bool:
        self.lookups += 1
        found, failed = await self._ask_all(key, peers, timeout)
        for peer, error in failed.items():
            log.info("peer %s did not answer a lookup of session %r: %s", peer, key, error)
        if found:
            self._take_freshest(key, found)
            return True
        return not failed

    async def _ask_all(self, key: str, peers: list[str],
                       timeout: float | None) -> tuple[list[tuple[str, float]], dict[str, Exception]]:
        """Ask ``peers`` at once for ``key``'s pin: the pins they gave up, and those that did not answer, with why."""
        answers = await asyncio.gather(*(self._ask(peer, key, timeout) for peer in peers), return_exceptions=True)
        found: list[tuple[str, float]] = []
        failed: dict[str, Exception] = {}
        for peer, answer in zip(peers, answers):
            if isinstance(answer, (Unreachable, PeerError)):
                failed[peer] = answer
            elif isinstance(answer, BaseException):
                raise answer
            elif answer is not None:
                found.append(answer)
        return found, failed

    def _take_freshest(self, key: str, found: list[tuple[str, float]]) -> None:
        """Of several pins found (two routers placed one new session at once), the most recently used: its
        replica has the newest turns cached."""
        self._take(key, min(found, key=lambda pin: pin[1])[0])

    def _take(self, key: str, replica: str) -> None:
        if self.balancer.pinned(key) is None:  # a pin pushed or placed meanwhile wins
            self.balancer.adopt(key, replica)
            self.handoffs += 1

    async def _fetch(self, key: str, believed: str | None) -> bool:
        owners = self.history.previous_owners(key, self._clock())
        owners = ([believed] if believed else []) + [c for c in owners if c != believed]
        leaving = [peer for peer in self._leaving() if peer != self.history.self_id and peer not in self.departed]
        found, lost = await self._ask_leaving(key, leaving, owners)
        if found:
            return True
        for previous in owners:
            if previous in self.departed or previous in leaving:
                continue
            if previous in self.gone:
                lost = True
                continue
            try:
                answer = await self._ask(previous, key, None)
            except Unreachable as error:
                log.warning("previous owner %s is unreachable (%s): its sessions are placed anew", previous, error)
                self.gone.add(previous)
                lost = True
                continue
            except PeerError as error:
                log.warning("previous owner %s did not hand over session %r: %s", previous, key, error)
                continue
            if answer is not None:
                self._take(key, answer[0])
                return True
        if lost:
            self.replaced += 1
        return True

    async def _ask_leaving(self, key: str, leaving: list[str], owners: list[str]) -> tuple[bool, bool]:
        """Ask the leaving peers at once, before ``owners``: (a pin was taken, one that did not answer was also one
        of the key's previous owners). A leaving peer keeps each pin until the peer it pushes it to took it, so
        asked first it either gives the pin up or the pin has landed already; asked after the owners, the pin
        could land behind the question and be missed."""
        asked = [peer for peer in leaving if peer not in self.gone]
        lost = any(peer in owners for peer in leaving if peer in self.gone)
        found, failed = await self._ask_all(key, asked, None)
        for peer, error in failed.items():
            log.warning("leaving router %s did not hand over session %r: %s", peer, key, error)
            if isinstance(error, Unreachable):
                self.gone.add(peer)
                lost = lost or peer in owners
        if found:
            self._take_freshest(key, found)
        return bool(found), lost

    def receive(self, pins: list[tuple[str, str, float]]) -> int:
        """Pins pushed by a router leaving the fleet, as (key, replica, seconds since last use); a pin held
        here used since is kept. Returns how many were adopted (each counted as a handoff)."""
        now = self._clock()
        adopted = 0
        for key, replica, idle in pins:
            used = self.balancer.last_used(key)
            if used is not None and used >= now - idle:
                continue
            self.balancer.adopt(key, replica)
            adopted += 1
        self.handoffs += adopted
        return adopted

    def surrender(self, key: str) -> str | None:
        """The previous owner's side: give up the pin."""
        return self.balancer.surrender(key)

"""Decisions asked of a sibling worker (``serve --workers N``): its replica for a key, not a relay through it.

The kernel spreads client connections over a pod's workers without knowing the session, so half the turns enter
a worker that does not own their key. Relaying such a turn through its owner doubles what it costs (the owner
parses, routes and relays it again). Instead the entry worker asks the owner which replica (``DecisionService``:
the owner routes with its own policy and keeps the lease, so the request is in flight in the owner's count
where the margin reads it), forwards the request itself, and tells the owner how it ended (the owner releases
the lease, hands a rejected decision back to its policy and tells its passive health). llm-d's endpoint picker
works the same way: the proxy asks which endpoint and forwards the bytes itself.

The channel is a Unix socket in a directory only the pod's user can enter (``--workers``' parent makes it),
one per worker: nothing on the network can reach it. Anything unusual (no answer, an owner that cannot
decide at once, a connection to open) goes back to the relay, which is unchanged.

Messages: a header ``!BIB`` (kind, id, number of fields), then each field as ``!I`` length and bytes
(``NONE``: absent). ``D`` id key group: decide. ``R`` id replica outcome reason measure: routed. ``N`` id:
decide it yourself (relay). ``F`` id accepted status failure refused: finished (refused: the connection to the
replica was refused or timed out, so the owner marks it down as its own attempt would). ``A`` id: abandoned,
the answer came after the entry stopped waiting and relayed the request instead; the owner releases the lease
and leaves the pin alone (the relayed request decided again on it: handing the decision back would drop the
pin under the turn that is using it). The abandoned decision stays counted in the owner's counters, and is
counted as abandoned (``rolloutrouter_decisions_abandoned_total``).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Final

from . import outcome
from .attempts import route
from .context import RouterContext
from .outcome import Routing, put_back
from .turns import Turn

log = logging.getLogger(__name__)

HEAD: Final = struct.Struct("!BIB")
LENGTH: Final = struct.Struct("!I")
NONE: Final = 0xFFFFFFFF  # the length that means an absent field
MAX_BUFFERED: Final = 1 << 20  # unparsed bytes a sibling may leave on the channel before it is cut
MAX_PENDING: Final = 1 << 16  # decisions one sibling may hold leases for at once (beyond: "N", relay)
DECIDE, ROUTED, NOT_HERE, FINISHED, ABANDONED = b"DRNFA"
RECONNECT_SECONDS: Final = 1.0  # a lost channel is opened again at most this often (meanwhile: relay)

Fields = list[bytes | None]


def message(kind: int, ident: int, *fields: bytes | None) -> bytes:
    parts = [HEAD.pack(kind, ident, len(fields))]
    for field in fields:
        parts.append(LENGTH.pack(NONE) if field is None else LENGTH.pack(len(field)) + field)
    return b"".join(parts)


def text(value: str | None) -> bytes | None:
    return None if value is None else value.encode("utf-8", "surrogatepass")


def untext(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "surrogatepass")


class Channel(asyncio.Protocol):
    """One end of a channel: frames messages off the stream and hands each to ``received``; what it sends
    leaves in one write at the end of the loop's turn (``send``)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._soon = False  # a flush is due at the end of this turn of the loop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a Unix stream transport
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        at = 0
        while self.transport is None or not self.transport.is_closing():  # cut: the rest is not read
            parsed = _parse(buffer, at)
            if parsed is None:
                break
            at, kind, ident, fields = parsed
            self.received(kind, ident, fields)
        del buffer[:at]
        if len(buffer) > MAX_BUFFERED and self.transport is not None:
            log.error("a sibling worker left %d unparsed bytes on the decision channel: closing it", len(buffer))
            self.transport.abort()

    def received(self, kind: int, ident: int, fields: Fields) -> None:
        raise NotImplementedError

    def send(self, data: bytes) -> None:
        """Queue ``data``: what one turn of the loop sends leaves in one write at its end. Not later than that:
        an attempt's end releases the owner's lease, which must not outlast the answer the client has read."""
        loop = self._loop
        if loop is None:
            return
        self._out.append(data)
        if not self._soon:
            self._soon = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._soon = False
        out, transport = self._out, self.transport
        if out and transport is not None and not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()


def _parse(buffer: bytearray, at: int) -> tuple[int, int, int, Fields] | None:
    """The message starting at ``at``: (where the next starts, kind, id, fields), or None while incomplete."""
    end = len(buffer)
    if end - at < HEAD.size:
        return None
    kind, ident, count = HEAD.unpack_from(buffer, at)
    at += HEAD.size
    fields: Fields = []
    for _ in range(count):
        if end - at < LENGTH.size:
            return None
        (length,) = LENGTH.unpack_from(buffer, at)
        at += LENGTH.size
        if length == NONE:
            fields.append(None)
            continue
        if end - at < length:
            return None
        fields.append(bytes(buffer[at:at + length]))
        at += length
    return at, kind, ident, fields


class DecisionService:
    """The owner's side: routes the keys its siblings ask about and holds their leases until they say how it
    ended (or their channel closes: then every lease it held is released)."""

    def __init__(self, context: RouterContext) -> None:
        self.context = context
        self._server: asyncio.AbstractServer | None = None

    async def start(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a worker restarted in the same directory
        self._server = await asyncio.get_running_loop().create_unix_server(lambda: _OwnerEnd(self), str(path))

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    def decide(self, key: str, group: str | None) -> Routing | None:
        """The routing of a sibling's request for ``key``, or None when it must be decided by relay: this
        worker is leaving or paused, the key's pin must be fetched first, or nothing can take it."""
        context = self.context
        fleet = context.fleet
        if fleet is None or fleet.leaving or context.rl.paused or not fleet.decided_here(key, True):
            return None
        try:
            return route(context, key, group=group)
        except Exception:  # noqa: BLE001  # no replica, or a bug: the relay meets it again and answers it
            return None

    def finished(self, routing: Routing, accepted: bool, status: int, failure: str | None,
                 refused: bool = False) -> None:
        """A delegated attempt ended: the owner's half of its record (``outcome.settled``; a refused connection:
        ``outcome.refused``), as this worker's own attempt would record it. The sibling records its half."""
        if refused:
            outcome.refused(self.context, routing, failure)
        else:
            outcome.settled(self.context, routing, status, failure, accepted)

    def abandoned(self, routing: Routing) -> None:
        """A decision the sibling gave up waiting for (it relayed the request): nothing reached the replica
        through it, so only its replica is put back. It stays in the decision counters (the relayed request is
        decided again): counted, so that overcount is known."""
        put_back(self.context.replicas, routing)
        if self.context.fleet is not None:
            self.context.fleet.abandoned += 1


class _OwnerEnd(Channel):
    """One sibling's channel into a ``DecisionService``."""

    def __init__(self, service: DecisionService) -> None:
        super().__init__()
        self.service = service
        self.pending: dict[int, Routing] = {}

    def received(self, kind: int, ident: int, fields: Fields) -> None:
        if kind == DECIDE and len(fields) == 2 and fields[0] is not None:
            key = untext(fields[0])
            assert key is not None
            routing = None if len(self.pending) >= MAX_PENDING else self.service.decide(key, untext(fields[1]))
            if routing is None:
                self.send(message(NOT_HERE, ident))
                return
            self.pending[ident] = routing
            turn = routing.turn
            assert turn is not None  # ``route`` measures every turn
            self.send(message(ROUTED, ident, text(routing.replica.id), text(turn.outcome), text(turn.reason),
                              b"1" if turn.measure else b""))
        elif kind == FINISHED and len(fields) == 4:
            held = self.pending.pop(ident, None)
            if held is None:  # an attempt asked on a channel that closed since: its replica was put back with it
                log.debug("a sibling worker finished decision %d, which this channel did not give", ident)
                return
            self.service.finished(held, fields[0] == b"1", int(fields[1] or b"0"), untext(fields[2]),
                                  fields[3] == b"1")
        elif kind == ABANDONED and not fields:
            abandoned = self.pending.pop(ident, None)
            if abandoned is not None:
                self.service.abandoned(abandoned)
        else:
            log.error("a sibling worker sent a message the decision channel does not know (kind %r): closing it", kind)
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        """The sibling is gone: what it was answering is over, so its leases are (pins stay as they are)."""
        for routing in self.pending.values():
            put_back(self.service.context.replicas, routing)
        self.pending.clear()


Delegation = tuple[str, Turn]  # a delegated decision, as the entry worker hears it: the replica and the turn to stamp
Answer = Callable[[int, Delegation | None], None]  # called with the id and the routing, or None: relay


def _call(answer: Answer, ident: int, routing: Delegation | None) -> None:
    """Hand an answer to its request; a bug there is logged, not left to cut the channel of every other."""
    try:
        answer(ident, routing)
    except Exception:
        log.exception("a delegated request failed on its decision")


class DecisionClient:
    """The entry's side: one channel per sibling, opened on first use and again (at most once a second)
    after it closes; while it is not open, or the owner does not answer within ``timeout``, requests relay."""

    def __init__(self, sockets: dict[str, Path], clock: Callable[[], float], timeout: Callable[[], float]) -> None:
        self._sockets, self._clock, self._timeout = sockets, clock, timeout
        self._ends: dict[str, EntryEnd] = {}
        self._opening: dict[str, float] = {}  # sibling -> when its channel was last asked to open
        self._next = 0
        self.closed = False  # stopping: nothing more is asked, no channel opened

    def ask(self, sibling: str, key: str, group: str | None, answer: Answer) -> EntryEnd | None:
        """Ask ``sibling`` to decide ``key``: the channel asked on, whose ``finished`` takes the id ``answer`` is
        called with (later, never from here); None when there is no open channel to it (the request relays)."""
        end = self._ends.get(sibling)
        if end is None or not end.open():
            self._open(sibling)
            return None
        ident = (self._next + 1) & 0xFFFFFFFF
        asking = message(DECIDE, ident, text(key), text(group))
        self._next = ident
        end.pending[ident] = (answer, self._clock())
        end.send(asking)
        return end

    def sweep(self) -> None:
        """Answers not come within the timeout are given up (their requests relay; a late one is released)."""
        limit = self._clock() - self._timeout()
        for end in self._ends.values():
            for ident in [i for i, (_, asked) in end.pending.items() if asked < limit]:
                answer, _ = end.pending.pop(ident)
                end.abandon(ident)
                _call(answer, ident, None)

    def close(self) -> None:
        self.closed = True
        for end in self._ends.values():
            if end.transport is not None:
                end.transport.close()

    def _open(self, sibling: str) -> None:
        path = self._sockets.get(sibling)
        now = self._clock()
        if self.closed or path is None or now - self._opening.get(sibling, -RECONNECT_SECONDS) < RECONNECT_SECONDS:
            return
        self._opening[sibling] = now
        asyncio.get_running_loop().create_task(self._connect(sibling, path))

    async def _connect(self, sibling: str, path: Path) -> None:
        try:
            _, end = await asyncio.get_running_loop().create_unix_connection(lambda: EntryEnd(self, sibling),
                                                                             str(path))
        except OSError as error:
            log.debug("decision channel to %s not open (%s): its keys relay", sibling, error)
            return
        current = self._ends.get(sibling)
        if self.closed or (current is not None and current.open()):  # stopped, or one opened meanwhile
            end.transport.close()  # type: ignore[union-attr]  # connected
            return
        self._ends[sibling] = end


class EntryEnd(Channel):
    """The channel to one sibling's ``DecisionService``."""

    def __init__(self, client: DecisionClient, sibling: str) -> None:
        super().__init__()
        self.client, self.sibling = client, sibling
        self.pending: dict[int, tuple[Answer, float]] = {}
        self.abandoned: set[int] = set()  # given up on: their decisions, if they come, are finished at once

    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def finished(self, ident: int, accepted: bool, status: int = 0, failure: str | None = None,
                 refused: bool = False) -> None:
        """Tell the owner how its decision ``ident`` ended (a closed channel: the owner released the lease
        itself)."""
        self.send(message(FINISHED, ident, b"1" if accepted else b"0", b"%d" % status, text(failure),
                          b"1" if refused else b""))

    def received(self, kind: int, ident: int, fields: Fields) -> None:
        asked = self.pending.pop(ident, None)
        if asked is None:
            if ident in self.abandoned:
                self.abandoned.discard(ident)
                if kind == ROUTED:
                    self.send(message(ABANDONED, ident))
            return
        answer = asked[0]
        if kind == ROUTED and len(fields) == 4 and fields[0] and fields[1]:
            replica, outcome, reason = untext(fields[0]), untext(fields[1]), untext(fields[2])
            assert replica is not None and outcome is not None
            _call(answer, ident, (replica, Turn(outcome, reason, bool(fields[3]))))
        else:
            _call(answer, ident, None)

    def abandon(self, ident: int) -> None:
        """Given up waiting for ``ident``; an owner that lets too many go unanswered is taken for hung."""
        self.abandoned.add(ident)
        if len(self.abandoned) > MAX_PENDING and self.transport is not None:
            log.error("sibling worker %s left %d decisions unanswered: closing its channel", self.sibling,
                      len(self.abandoned))
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        """The owner is gone: whatever it was deciding relays (and finds out)."""
        self.abandoned.clear()
        pending, self.pending = self.pending, {}
        if self.client._ends.get(self.sibling) is self:
            del self.client._ends[self.sibling]
        for ident, (answer, _) in pending.items():
            _call(answer, ident, None)

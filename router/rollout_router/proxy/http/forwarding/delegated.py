"""A request whose replica a sibling worker chose (``decisions``): forwarded from here, its end told back.

The fast path of the traffic listener asks the key's owner worker instead of relaying through it; the answer
(or its absence) comes from the channel's callback, with no Task waiting. When the owner routes it, the
request goes to that replica as the fast path's own would (on an idle connection, else a new one; a pooled
one gone stale is tried once more on a new one). In every other case (the owner cannot decide at once, no
answer in time, the replica's connection cannot be opened) it is answered as before: ``HttpProxy.handle``,
which relays it through its owner.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .... import descriptors
from ....health import TIMEOUT
from ...decisions import DecisionClient, Delegation, EntryEnd
from ...outcome import recorded
from ...turns import Turn
from ..connection.relay import CLIENT_CLOSED, STALE, Exchange, accepted, request_bytes
from ..connection.upstream import ReplicaPool, UpstreamConnection
from ..wire.heads import lines

if TYPE_CHECKING:
    from ..connection.client import ClientConnection
    from ..wire.request import HttpRequest
    from .port import TrafficPort

log = logging.getLogger(__name__)


class Asked:
    """A request whose replica a sibling worker chooses, from the question to the end it is told: what the
    Python path's ``Delegated`` and the native lane's ``LaneAsked`` share. ``decided`` takes the owner's answer;
    a subclass says what to do with it (``_forward``), without one (``_relay``) and when the client has gone
    (``_gone``)."""

    __slots__ = ("proxy", "client", "end", "ident", "replica", "turn")

    def __init__(self, proxy: TrafficPort, client: Any) -> None:
        self.proxy, self.client = proxy, client
        self.end: EntryEnd | None = None  # the channel the decision was asked on: its end is told there
        self.ident = 0
        self.replica = ""
        self.turn: Turn | None = None  # the owner's routing outcome, stamped here (its ``started``: the attempt's)

    def ask(self, decisions: DecisionClient, owner: str, key: str, group: str | None) -> bool:
        """Ask ``owner``; False when it is no sibling with an open channel (the request relays, or is handed over)."""
        self.end = decisions.ask(owner, key, group, self.decided)
        return self.end is not None

    def decided(self, ident: int, routing: Delegation | None) -> None:
        """The owner's answer: its replica and turn, the attempt's clock started; None: relay through the owner."""
        self.ident = ident
        if routing is None:
            return self._relay()
        self.replica, self.turn = routing
        self.turn.begin(time.monotonic())
        if self.client.gone:
            return self._gone()
        self._forward()

    def _relay(self) -> None:
        raise NotImplementedError

    def _gone(self) -> None:
        raise NotImplementedError

    def _forward(self) -> None:
        raise NotImplementedError

    def _finished(self, ok: bool, status: int, failure: str | None, refused: bool = False) -> None:
        """Tell the owner how the request ended (it releases the lease and tells its passive health)."""
        if self.end is not None and self.end.open():
            self.end.finished(self.ident, ok, status, failure, refused)

    def _record(self, code: int | None, ok: bool, now: float) -> None:
        """This worker's half of the request's record, ended at ``now`` (``outcome.recorded``): its metrics and
        its turn; the owner records the other half (``_finished``)."""
        turn = self.turn
        assert turn is not None  # decided
        recorded(self.proxy.context.metrics, self.replica, turn, code, ok, turn.started, now)

    def _counted(self) -> None:
        """Answered here on the owner's decision: counted as delegated (one that relays after all is counted
        as forwarded instead, never as both)."""
        fleet = self.proxy.context.fleet
        if fleet is not None:
            fleet.delegated += 1
        self.proxy.answering_here -= 1


class Delegated(Asked):
    """One request of the Python path on its way through a decision asked of a sibling worker."""

    __slots__ = ("request", "opening")

    def __init__(self, proxy: TrafficPort, client: ClientConnection, request: HttpRequest) -> None:
        super().__init__(proxy, client)
        self.request = request
        self.opening: asyncio.Task | None = None  # a connection being opened to the replica (held while it is)

    def _forward(self) -> None:
        """Forward to the owner's replica on an idle connection, or on a new one."""
        fleet = self.proxy.context.fleet
        if fleet is not None and fleet.leaving:  # began leaving while it waited: as ``handle`` does, its client
            self.request.close_after = True  # reconnects elsewhere
        pool = self.proxy.pools.get(self.replica)
        conn = pool.take()
        if conn is None:
            self._connect(pool)
        else:
            self._send(pool, conn, True)

    def _send(self, pool: ReplicaPool, conn: UpstreamConnection, reused: bool) -> None:
        Exchange(self.proxy, self.client, self.request, self.replica, conn, reused, turn=self.turn,
                 on_done=self.done).start(request_bytes(self.request, pool, lines(self.request.headers)))

    def _connect(self, pool: ReplicaPool) -> None:
        """Open a connection to the replica (a Task: the one wait of this path), then send on it."""
        assert self.client.loop is not None
        self.opening = self.client.loop.create_task(self._open(pool))

    async def _open(self, pool: ReplicaPool) -> None:
        """A new connection, then the attempt; refused or timed out, the owner marks the replica down (as its
        own attempt would) and the request relays to it, to be routed elsewhere."""
        failure, refused = None, False
        try:
            conn = await pool.connect()
        except TimeoutError:  # before OSError, its base class
            failure, refused = TIMEOUT, True
        except OSError as error:
            refused = not descriptors.local_shortage(error)  # this worker's own shortage is nobody's failure
        except Exception:  # a bug: nothing may leave the owner's lease held or the client waiting
            log.exception("connecting to %s for a delegated request", self.replica)
        else:
            if self.client.gone:
                conn.close()
                return self._gone()
            return self._send(pool, conn, False)
        finally:
            self.opening = None
        self._finished(False, 0, failure, refused)
        self._relay()

    def done(self, exchange: Exchange, result: str | None) -> None:
        """The exchange ended: the owner hears how (it releases the lease and tells its passive health), this
        worker records the request's metrics and its turn. A pooled connection gone stale before answering
        is tried once more on a new one (nothing was sent; the attempt's clock runs on)."""
        if result == STALE:
            return self._connect(self.proxy.pools.get(self.replica))
        ok = accepted(exchange)
        self._finished(ok, exchange.status, exchange.failure)
        self._record(exchange.code, ok, time.monotonic())
        self._answered()

    def _gone(self) -> None:
        """The client left before anything was sent: what the single-process attempt records then (499, a
        turn that rejected nothing)."""
        self._finished(True, 0, None)
        self._record(CLIENT_CLOSED, True, time.monotonic())
        self._answered()

    def _answered(self) -> None:
        self._counted()
        self.client.answered(self.request)

    def _relay(self) -> None:
        """Answer as if the fast path had not taken it: ``handle`` relays it through its owner."""
        self.proxy.answering_here -= 1
        self.client.answer_later(self.request, self.proxy.handle(self.client, self.request))


class LaneAsked(Asked):
    """A request of the native lane whose replica a sibling worker chooses: the lane's client connection
    (``_lane.Client``) waits for ``decided`` and sends the request itself; this is the token ``LaneGlue.finish``
    passes back when the answer ends."""

    __slots__ = ("pool",)

    def __init__(self, proxy: TrafficPort, client: Any, pool: Callable[[str], Any]) -> None:
        super().__init__(proxy, client)
        self.pool = pool

    def _forward(self) -> None:
        """The lane sends the request to the owner's replica."""
        assert self.turn is not None  # decided
        self.client.routed(self.pool(self.replica), self.turn.measure, self)

    def _relay(self) -> None:
        """The Python path relays it through its owner (``handle`` counts it again)."""
        self.proxy.answering_here -= 1
        self.client.relay()

    def _gone(self) -> None:
        """What the single-process attempt records then (499, a turn that rejected nothing)."""
        self.finish(CLIENT_CLOSED, 0, None, True, 0.0, None, time.monotonic())

    def finish(self, code: int | None, status: int, failure: str | None, ok: bool, first_at: float,
               tail: bytes | None, now: float) -> None:
        """The answer ended (``ok``: the replica accepted it, as ``LaneGlue.finish`` judged): the owner hears how
        (as ``Delegated.done`` tells it), this worker records the request's metrics and its turn."""
        assert self.turn is not None  # decided
        self.turn.ended(first_at, tail, self.replica)
        self._finished(ok, status, failure)
        self._record(code, ok, now)
        self._counted()

    def refused(self, error: OSError) -> None:
        """Connecting to the replica failed: the owner marks it down (as its own attempt would: ``Delegated._open``);
        the request then relays through the owner, to be routed elsewhere (the caller hands it over)."""
        self._finished(False, 0, TIMEOUT if isinstance(error, TimeoutError) else None,
                       not descriptors.local_shortage(error))
        self.proxy.answering_here -= 1

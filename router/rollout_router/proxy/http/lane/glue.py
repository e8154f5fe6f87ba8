"""The router's side of the native lane (``_lane.pyx``): what the lane calls, and the hand-over both ways.

The lane parses, forwards and relays the common request in C and calls here twice per request: ``route``
(the checks ``HttpProxy._fast`` makes, the policy, the replica counted in flight: an ``outcome.Routing``) and
``finish`` (``outcome.answered``, as ``Forwarding.done`` records). Anything it does not take goes to the Python
path whole: ``hand_over`` gives the connection to a ``HandedConnection`` (``handover.py``) with the bytes the lane held (and, for a
request the lane had routed, its routing, so it is routed once either way), and ``take_back`` gives it back once
the Python path is idle on it.
``available`` says whether the lane was built and is as new as its sources.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, cast

from .... import core
from ....core.sources import why_stale
from ....policy.affinity import AffinityPolicy
from ...attempts import Refused
from ...outcome import Routing, answered, refused
from ...session_key import header_key
from ...turns import KEPT, Turn
from ..connection import client as client_side
from ..connection import upstream
from ..connection.listener import HttpListener
from ..connection.relay import answer_accepted, connect_failure, failure_answer
from ..connection.upstream import ReplicaPool
from ..forwarding.decide import open_now, route_or_decline
from ..forwarding.delegated import LaneAsked
from ..forwarding.forwarding import Forwarding
from ..forwarding.port import TrafficPort
from ..wire.heads import remembered
from ..wire.request import HttpRequest
from ..wire.routes import KEYED, kind, normalise
from .handover import Handed, HandedConnection
from .sources import FOLDER, source_hash

_lane: Any = None
if core.COMPILED:  # the lane calls the core's compiled modules in C: with the core's Python source, no lane
    try:
        from . import _lane
    except ImportError:  # not built (no C compiler or Cython at install): the Python data path only
        pass

log = logging.getLogger(__name__)

# why the lane handed a connection over (_lane_requests.pxi): a request still arriving at a sweep, the connection limit
W_SLOW, W_ADMIT = ((_lane.HANDOVER_REASONS.index("slow"), _lane.HANDOVER_REASONS.index("connection_limit"))
                   if _lane is not None else (-1, -1))
PATHS_KEPT = 1024  # paths whose verdict (forwarded, keyed) is remembered; cleared when full
LANE_REQUEST = HttpRequest(0)  # what a lane request is to the Python path's heads: keep-alive HTTP/1.1, no HEAD


@functools.cache
def unavailable() -> str | None:
    """Why the lane cannot run here (None: it can): not built, or built from other sources than those beside it
    (read once: a process runs the module it imported)."""
    if not core.COMPILED:
        return f"the router's core runs its Python source ({core.WHY_PYTHON}), which the native HTTP lane cannot call"
    current = source_hash() if (FOLDER / "_lane.pyx").exists() else None  # a checkout: its sources beside it
    return why_stale(_lane, current, "the native HTTP lane")


def sampled(started: float) -> Turn:
    """A kept turn the margin meter samples (``attempts.taken``), for the lane's sticky hit."""
    return Turn(KEPT, None, True, started)


class LaneGlue:
    """One traffic listener's lane: the ``_lane.Lane``, its replica pools, what it calls."""

    def __init__(self, proxy: TrafficPort) -> None:
        self.proxy, self.context = proxy, proxy.context
        self.listener = cast(HttpListener, proxy)  # the traffic port, as the handed-over connections' listener
        context = proxy.context
        self.native = _lane.Lane(self, proxy, proxy.active, proxy.context.rl.versions)
        self.native.write_high_water = client_side.WRITE_HIGH_WATER
        self.pools: dict[str, Any] = {}
        self.paths: dict[bytes, int] = {}  # path -> 0 (not forwarded), KEYED or UNKEYED (the sticky hit reads it)
        self._settings: object = None  # the settings the lane's limits and key names were read from (``_sync``)
        self._kept: frozenset[bytes] = frozenset()  # the key names the lane looks for (``proxy.key_names``)
        self._limits: object = None
        # the sticky hit, in C: the default policy's, on a clock that is the lane's (``_lane_sticky.pxi``):
        # CLOCK_MONOTONIC is ``time.monotonic`` on Linux only (elsewhere no clock matches, and it declines all)
        clock = time.monotonic if sys.platform.startswith("linux") else None
        self.sticky = _lane.Sticky(self, (AffinityPolicy, clock, sampled, open_now))
        # at debug level every decision goes through the balancer, which logs a sample of them (decisionlog.py)
        self.native.sticky = self.sticky if context.balancer.decisions is None else None
        self._sync()
        self.tick(proxy.now, proxy.now)

    def client(self) -> Any:
        """A new client connection's protocol."""
        return _lane.Client(self.native)

    def _sync(self) -> None:
        """Hand the lane the live limits and key names (on start, and when the settings change)."""
        proxy = self.proxy
        self._settings = proxy.context.settings
        limits = self._limits = proxy.limits()
        self.native.max_body, self.native.max_buffered = limits.max_body_bytes, limits.max_buffered_bytes
        session, self._kept = proxy.key_names()
        self.native.set_names(session, proxy.names.groups)
        settings = proxy.context.settings
        self._max_key, self._group_fields = settings.session.max_key_bytes, bool(settings.group.body_fields)
        self.sticky.sync(settings, self._max_key, self._group_fields)

    def _changed(self, size: int) -> bool:
        """New settings: whether they change what the lane read this request with (its body's ``size`` against
        maxBodyBytes, the key names), in which case the request goes to the Python path. The lane is told."""
        limits, kept = self._limits, self._kept
        self._sync()
        return self._kept != kept or size > self.native.max_body or self._limits != limits

    # what the lane calls
    def route(self, client: Any, path: bytes, size: int, key_at: int, key: bytes | None, group_at: int,
              group: bytes | None, now: float) -> tuple[Any, bool, Routing] | tuple[()] | None:
        """A whole request routed (``forwarding/decide.py``, as ``HttpProxy._fast`` routes; ``size``: its body's
        bytes; ``now``: the attempt's start): its pool, whether its turn is measured and its routing; an empty
        tuple when a sibling worker was asked (the lane waits for its answer); None hands it to the Python path."""
        context = self.context
        if not open_now(context) or (context.settings is not self._settings and self._changed(size)):
            return None
        what = self.paths.get(path)
        if what is None:
            what = self._kind(path)
        if not what:
            return None
        try:
            session_key = group_key = None
            if what == KEYED:
                if key is not None and len(key) <= self._max_key:  # ``header_key``'s common case
                    session_key = key.decode()
                else:
                    session_key = self._key(key_at, key, "session")
                if group is not None or self._group_fields:
                    group_key = self._key(group_at, group, "group")
            routed = route_or_decline(self.proxy, session_key, group_key, False,
                                      lambda: LaneAsked(self.proxy, client, self.pool), now)
        except Exception:  # noqa: BLE001  # a 400, a 503 or a bug: the Python path meets it again and answers it
            return None
        if not isinstance(routed, Routing):
            return () if routed else None
        replica = routed.replica.id
        pool = self.pools.get(replica)
        if pool is None:
            pool = self.pool(replica)
        turn = routed.turn
        return pool, turn is not None and turn.measure, routed

    def _kind(self, path: bytes) -> int:
        what = kind(path.decode("ascii"))  # the lane takes printable ASCII targets only
        if len(self.paths) >= PATHS_KEPT:
            self.paths.clear()
        self.paths[path] = what
        return what

    def _key(self, at: int, value: bytes | None, kind: str) -> str | None:
        """A key from the lane's header value (``HttpProxy._find``); a key only a body field can give raises, so
        the Python path reads the body."""
        settings = self.proxy.context.settings
        names = self.proxy.names
        if value is not None:
            pairs = names.session_pairs if kind == "session" else names.group_pairs
            return header_key(pairs[at][0], value, settings.session, kind)
        if (settings.session if kind == "session" else settings.group).body_fields:
            raise LookupError("a body field to read")
        return None

    def pool(self, replica: str) -> Any:
        """The lane's pool of connections to ``replica``, made on first use."""
        pool = self.pools.get(replica)
        if pool is None:  # (not ``or``: an empty pool is falsy)
            model = ReplicaPool(replica)  # the Python pool's reading of the URL
            pool = self.pools[replica] = _lane.Pool(replica, model.prefix, model.host_header, model.host,
                                                    model.port, model.ssl)
        return pool

    def finish(self, token: Routing | LaneAsked, code: int | None, status: int, failure: str | None,
               first_at: float, tail: bytes | None, now: float) -> None:
        """A lane request ended at ``now``: recorded as every path records (``outcome.answered``); a request a
        sibling worker routed: ``LaneAsked.finish``."""
        ok = answer_accepted(status, failure, code)
        if type(token) is LaneAsked:
            return token.finish(code, status, failure, ok, first_at, tail, now)
        assert isinstance(token, Routing)
        if token.turn is not None:
            token.turn.ended(first_at, tail, token.replica.id)
        answered(self.context, token, code, status, failure, ok, now, first_at)
        self.proxy.answering_here -= 1

    def failed(self, replica: str, state: int, what: str, timed_out: bool, sse_chunked: bool
               ) -> tuple[bytes | None, int]:
        return failure_answer(self.proxy, replica, LANE_REQUEST, state, what, timed_out, sse_chunked)

    def head(self, replica: str, status: int, reason: bytes, headers: list[tuple[bytes, bytes]], has_length: bool,
             keeps: bool, version: str | None) -> tuple[bytes, bytes, bool, bool, bool, bool]:
        return remembered(status, reason, headers, has_length, keeps, LANE_REQUEST, replica, False, version)

    def connect(self, pool: Any, client: Any) -> None:
        """A new connection to ``pool``'s replica for the request waiting on ``client``."""
        asyncio.get_running_loop().create_task(self._connect(pool, client))

    async def _connect(self, pool: Any, client: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(upstream.CONNECT_SECONDS):
                _, connection = await loop.create_connection(lambda: _lane.Upstream(pool, self.native), pool.host,
                                                             pool.port, ssl=pool.ssl)
        except OSError as error:  # TimeoutError among them
            client.refused(error)
            return
        client.connected(connection)

    def abandon(self, token: Routing | LaneAsked, error: OSError) -> None:
        """Connecting failed and the client has gone: recorded as ``attempts.forward`` records a refusal."""
        if isinstance(token, LaneAsked):
            return token.refused(error)
        refusal = connect_failure(token.replica, error)
        refused(self.context, token, refusal.failure if isinstance(refusal, Refused) else None)
        self.proxy.answering_here -= 1

    def opened(self, client: Any) -> bool:
        if not self.proxy.admit():
            return False
        self.proxy.clients.add(client)
        return True

    def closed(self, client: Any) -> None:
        self.proxy.clients.discard(client)

    def exception(self, error: BaseException) -> None:
        log.error("the native HTTP lane's call into the router failed", exc_info=error)

    # the hand-over
    def hand_over(self, native: Any, data: bytes, why: int, handed: tuple[Routing | LaneAsked, OSError] | str | None
                  ) -> HandedConnection:
        """The lane gives its connection to the Python path, which reads ``data`` from the start."""
        proxy = self.proxy
        proxy.clients.discard(native)
        client = HandedConnection.adopted(self.listener, native.transport, self, native.write_paused, native.shaped)
        if why == W_ADMIT:
            client.refuse()
            return client
        client.handed = handed if not isinstance(handed, tuple) else self._refused(*handed)
        if data:
            client.data_received(data)
        if native.since:  # a request (or the connection's first head) began in the lane: its clocks come too
            client.started_at(native.since, native.body_since)
        if why == W_SLOW:  # and the sweep is visiting
            client.check(proxy.now, proxy.limits())
        return client

    def dispatch(self, client: HandedConnection, request: HttpRequest, handed: Handed) -> None:
        """The first request of a connection the lane handed over with a request it had begun, read again by the
        Python path: a connect to its replica that failed (a refusal, retried elsewhere as ``attempts.forward``
        does), or nothing to go on (a sibling worker would not route it: ``handle`` relays it through its owner)."""
        proxy = self.proxy
        if proxy.closing and client.last_in_line():
            request.close_after = True  # (as ``HttpProxy.dispatch``)
        forwarding = None
        if isinstance(handed, tuple):
            routing, error = handed
            normalise(request)
            forwarding = Forwarding(proxy, client, request, routing.key, routing.group, routing)
            forwarding.refused = error
        client.answer_later(request, proxy.handle(client, request, forwarding))

    def _refused(self, token: Routing | LaneAsked, error: OSError) -> Handed:
        """What the Python path is handed with a request whose replica refused the connection: one a sibling
        decided relays through its owner (as ``Delegated._open`` does); one routed here is retried elsewhere as
        ``attempts.forward`` does (``dispatch``; ``HttpProxy._send`` gives a kept turn its ``Turn``)."""
        if isinstance(token, LaneAsked):
            token.refused(error)
            return _lane.RELAY
        return token, error

    def take_back(self, client: HandedConnection) -> None:
        """The Python path is idle on ``client``'s connection: the lane serves it again."""
        transport = client.transport
        assert transport is not None
        native = _lane.Client(self.native)
        native.adopt(transport, client.active_at)
        native.shaped = client.shaped
        client.detach()
        self.proxy.clients.discard(client)
        self.proxy.clients.add(native)
        transport.set_protocol(native)

    # the sweep
    def tick(self, now: float, idle_before: float) -> None:
        """Once a sweep: the lane's clock and the connection deadlines (``connection/client.py``'s, read each time), its idle
        replica connections closed. (Its answers are in ``HttpProxy.active``: ``expire_silent`` times them out.)"""
        native = self.native
        native.now, native.idle_seconds = now, client_side.IDLE_SECONDS
        native.write_stall_seconds = client_side.WRITE_STALL_SECONDS
        self.close_idle(idle_before)

    def close_idle(self, older_than: float) -> None:
        for pool in self.pools.values():
            pool.close_idle(older_than)

    def handovers(self) -> dict[str, int]:
        """Requests the lane handed to the Python path, by reason."""
        return self.native.handover_counts()


if TYPE_CHECKING:  # the lane's side of the contract (``_lane.pyi``: ``Glue``): mypy checks that LaneGlue is one
    from ._lane import Glue

    def _declared(glue: LaneGlue) -> Glue:
        return glue

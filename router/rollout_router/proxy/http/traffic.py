"""The traffic listener's requests: session key, owner or replica, the attempt, the probes, the sweep."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from ...fleet.rlstate import Paused
from ...policy import NoReplicaError
from .. import admin, rl_routes, workers
from ..attempts import AllRefused, OutOfDescriptors, forward, measured
from ..context import RouterContext
from ..decisions import DecisionClient
from ..errors import RouterError
from ..listener import Limits, traffic_limits
from ..outcome import Routing, answered
from ..owner import FORWARD_SLACK_SECONDS, HOP
from ..session_key import KeyNames, body_key, decoded_body, header_key
from . import wire
from .connection.client import ClientConnection
from .connection.listener import HttpListener, write_admin
from .connection.relay import WAITING, Exchange, attempt, connect_failure, request_bytes
from .connection.upstream import KEEPALIVE_SECONDS, Pools
from .forwarding.decide import open_now, route_or_decline
from .forwarding.delegated import Delegated
from .forwarding.forwarding import Forwarding
from .forwarding.owner import to_owner
from .lane import LaneGlue
from .lane import unavailable as lane_unavailable
from .wire.request import HttpRequest
from .wire.routes import KEYED, REPLICA_HEADER, forwarded, kind, normalise, unkeyed

if TYPE_CHECKING:
    from ...fleet.node import Fleet
    from .lane._lane import Upstream

log = logging.getLogger(__name__)

CLOSING_IDLE_SECONDS = 1.0  # stopping: a client connection idle this long is closed (see ``stop_accepting``)


class HttpProxy(HttpListener):
    """The traffic port: forwards the OpenAI-compatible paths, answers the probes."""

    name = "traffic"

    def __init__(self, context: RouterContext, data_path: str = "auto"):
        super().__init__(context)
        self.pools = Pools()
        self.active: set[Exchange | Upstream] = set()  # answers in progress, on either data path
        self.answering_here = 0  # requests being answered now on the Python side (``answering``: with the lane's)
        self.names = KeyNames()
        self.decisions: DecisionClient | None = None  # a --workers N worker's channels to its siblings
        # the native lane (``lane/``) unless the Python data path is asked for or the lane cannot run here
        self.lane = LaneGlue(self) if data_path != "python" and lane_unavailable() is None else None

    @property
    def answering(self) -> int:
        """Requests being answered now (decided, forwarded or relayed): the Python side's count and the lane's
        sticky hits' (counted in C; either side may end a request the other began, so only the sum means)."""
        return self.answering_here + (self.lane.sticky.answering if self.lane is not None else 0)

    def connection(self) -> asyncio.Protocol:
        return self.lane.client() if self.lane is not None else ClientConnection(self)

    def data_path(self) -> dict:
        """/status's ``data_path``: which one this port runs, and with the lane, what it answered and handed over."""
        if self.lane is None:
            return {"http": "python"}
        sticky = self.lane.sticky
        return {"http": "native", "lane_requests": self.lane.native.forwarded, "lane_handovers": self.lane.handovers(),
                "lane_sticky": {"routed": sticky.hits, "recorded": sticky.answers}}

    def limits(self) -> Limits:
        return traffic_limits(self.context.settings)

    def stop_accepting(self) -> None:
        """Also: a connection closes after the answers to the requests read on it, the last with ``Connection:
        close`` (the lane hands every next request to the Python path, which does so: ``dispatch``), or once
        idle ``CLOSING_IDLE_SECONDS`` (``tick``): a client sending steadily on it is answered once more, rather
        than finding it closed as it sends."""
        super().stop_accepting()
        if self.lane is not None:
            self.lane.native.closing = True

    async def close(self) -> None:
        await super().close()
        self.pools.close_idle(float("inf"))
        if self.lane is not None:
            self.lane.close_idle(float("inf"))

    def key_names(self) -> tuple[tuple[bytes, ...], frozenset[bytes]]:
        """The session-key headers, lower-cased, in precedence order (the kept set has the group-key headers too);
        recomputed when settings change."""
        settings = self.context.settings
        return self.names.of(settings.session, settings.group)

    def dispatch(self, client: ClientConnection, request: HttpRequest) -> None:
        """Start answering ``request``: the common case from here, with no Task (``_fast``), else ``handle``.
        (A request the native lane routed and handed over comes through ``LaneGlue.dispatch`` instead.)"""
        if self.closing and client.last_in_line():
            request.close_after = True  # (the requests read behind it are answered first, the last one closing)
        if not self._fast(client, request):
            client.answer_later(request, self.handle(client, request))

    def _fast(self, client: ClientConnection, request: HttpRequest) -> bool:
        """Forward ``request`` from the parser's callbacks, its answer relayed and recorded from the replica
        connection's (``Forwarding.done``), when nothing needs a wait (``forwarding/decide.py``): a forwarded
        path, no RL pause, and with a fleet, a key this router or a sibling worker decides with no hop or pin
        fetch first. False leaves the request to ``handle``: a probe, a refusal (its keys, no replica), or any
        of those. Routed but with no idle connection to the replica, it goes to ``handle`` with its routing."""
        if request.error is not None or client.gone or not open_now(self.context):
            return False
        try:
            path = normalise(request)
            what = kind(path)
            if not what:
                return False
            key, group = self._keys(request) if what == KEYED else (None, None)
            fleet = self.context.fleet
            hopped = fleet is not None and key is not None and _hopped(fleet, request)
            routing = route_or_decline(self, key, group, hopped, lambda: Delegated(self, client, request))
        except Exception:  # noqa: BLE001  # a 400, a 503 or a bug: ``handle`` meets it again and answers it
            return False
        if not isinstance(routing, Routing):
            return routing
        forwarding = Forwarding(self, client, request, key, group, routing)
        replica = routing.replica.id
        pool = self.pools.get(replica)
        conn = pool.take()
        if conn is None:  # a connect to wait for
            client.answer_later(request, self.handle(client, request, forwarding))
            return True
        forwarding.started = routing.start = started = time.monotonic()
        turn = routing.turn  # a kept turn not sampled has none, as on the lane: the exchange stamps its first byte
        if turn is not None:
            turn.begin(started)
        Exchange(self, client, request, replica, conn, True, turn=turn,
                 on_done=forwarding.done).start(request_bytes(request, pool, forwarding.headers))
        return True

    async def handle(self, client: ClientConnection, request: HttpRequest, handed: Forwarding | None = None
                     ) -> None:
        """Answer one request; never raises (whatever goes wrong, the client gets JSON naming it).

        ``handed``: what the fast path routed and could not finish (counted in ``answering`` already)."""
        if handed is None:
            self.answering_here += 1
            fleet = self.context.fleet
            if fleet is not None and fleet.leaving:
                request.close_after = True  # the client's next request opens a connection to a router that stays
        try:
            if handed is not None:
                await self._send(handed)
            elif request.error is not None:
                return self._refuse(client, request, request.error)
            else:
                path = normalise(request)
                if not forwarded(path):
                    return self._probe(client, request, path)
                await self._forward(client, request)
        except RouterError as error:
            self._refuse(client, request, error)
        except Exception:
            log.exception("unexpected error on %s %s", request.method.decode(), request.path)
            self._refuse(client, request, RouterError(500, "internal router error; see the router's log"))
        finally:
            self.answering_here -= 1

    async def _forward(self, client: ClientConnection, request: HttpRequest) -> None:
        try:
            key, group = (None, None) if unkeyed(request.path) else self._keys(request)
        except RouterError as error:
            return self._refuse(client, request, error)
        forwarding = Forwarding(self, client, request, key, group)
        fleet = self.context.fleet
        if fleet is not None and key is not None and await fleet.via_owner(
                key, _hopped(fleet, request),
                lambda owner: to_owner(self, fleet, client, request, forwarding.headers, owner)):
            return
        await self._send(forwarding)

    async def _send(self, forwarding: Forwarding) -> None:
        """Forward to a replica, retrying on others as ``attempts.forward`` does, and refuse when none answers."""
        client, request = forwarding.client, forwarding.request

        async def send(routing: Routing) -> None:
            if forwarding.refused is not None:  # the lane's connect to this replica failed
                error, forwarding.refused = forwarding.refused, None
                raise connect_failure(routing.replica, error)
            started, forwarding.started = forwarding.started, None
            stale = started is not None  # the fast path's attempt, begun on a pooled connection that went stale
            turn = measured(routing, started or 0.0).turn  # what the fast path or the lane routed has one now
            assert turn is not None
            if started is None:
                routing.start = time.monotonic()
                turn.begin(routing.start)
            verdict = await attempt(self, client, request, forwarding.headers, routing, fresh=stale)
            answered(self.context, routing, *verdict, time.monotonic())

        try:
            await forward(self.context, forwarding.key, send, group=forwarding.group, first=forwarding.routed)
        except NoReplicaError:
            self._refuse(client, request, RouterError(503, self.context.replicas.unavailable()),
                         "no_replica")
        except AllRefused as error:
            self._refuse(client, request, RouterError(503, str(error)), "all_refused")
        except OutOfDescriptors as error:
            self._refuse(client, request, RouterError(503, str(error)), "out_of_descriptors")
        except Paused as paused:
            self._refuse(client, request, RouterError(503, paused.message), paused.reason, paused.retry_after)

    def _keys(self, request: HttpRequest) -> tuple[str | None, str | None]:
        """The session key and the GRPO group key (``settings.group``): each from its headers, then its body
        fields; the body is inflated at most once for both. The header pairs are those the request's head was
        read with (``key_names``, at ``on_message_begin``)."""
        settings, names = self.context.settings, self.names
        body: list[tuple[bytes, str | None]] = []  # the decoded body, once one of the keys needs it
        group = settings.group
        return (self._find(request, names.session_pairs, settings.session.body_fields, "session", body),
                self._find(request, names.group_pairs, group.body_fields, "group", body)
                if names.group_pairs or group.body_fields else None)

    def _find(self, request: HttpRequest, pairs: tuple[tuple[str, bytes], ...], fields: list[str], kind: str,
              body: list[tuple[bytes, str | None]]) -> str | None:
        """A ``kind`` key: the first of its headers present, else its body fields (``body``: decoded once)."""
        session = self.context.settings.session
        keys = request.keys
        if keys:
            for name, lower in pairs:
                value = keys.get(lower)
                if value:
                    return header_key(name, value, session, kind)
        if not fields:
            return None
        if not body:
            body.append(self._json_body(request))
        return body_key(*body[0], session, fields, kind)

    def _json_body(self, request: HttpRequest) -> tuple[bytes, str | None]:
        """The body as JSON text and its Content-Type, for reading keys from body fields."""
        content_type = request.content_type.decode("latin-1") if request.content_type is not None else None
        assert isinstance(request.body, bytes)
        return decoded_body(request.body, request.content_encoding, self.context.settings.max_body_bytes), content_type

    def _probe(self, client: ClientConnection, request: HttpRequest, path: str) -> None:
        """Answer the probes here; any other path is a 404 that names where admin routes live."""
        answer = admin.admin_answer(self.context, request.method.decode(), path, probes_only=True)
        if answer is None:
            where = (" (admin routes are served on the admin listener, --admin-port)"
                     if admin.find(path, routes=(*admin.ROUTES, *workers.ROUTES, *rl_routes.ROUTES)) else "")
            raise RouterError(404, f"path {path} is not an OpenAI-compatible endpoint this router forwards{where}")
        write_admin(self, client, request, answer)

    def _refuse(self, client: ClientConnection, request: HttpRequest, error: RouterError,
                reason: str | None = None, retry_after: int | None = None) -> None:
        """The router's own error answer."""
        self.context.metrics.errors.labels(reason or error.reason).inc()
        client.write(self.error_bytes(error.status, error.message, request, param=error.param,
                                      retry_after=retry_after))

    def error_bytes(self, status: int, message: str, request: HttpRequest, replica: str | None = None,
                    param: str | None = None, retry_after: int | None = None) -> bytes:
        extra: tuple[tuple[bytes, bytes], ...] = ((REPLICA_HEADER.encode(), replica.encode()),) if replica else ()
        if retry_after is not None:
            extra += ((b"Retry-After", b"%d" % retry_after),)
        return wire.error_answer(status, message, param, close=request.close_after or not request.keep_alive,
                                 extra=extra, head_only=request.head_only)

    def tick(self, elapsed: float) -> None:
        """Once a sweep: time out silent replicas, close upstream connections idle too long; stopping, close the
        client connections idle a moment."""
        self.pools.close_idle(self.now - KEEPALIVE_SECONDS)
        self.expire_silent(elapsed)
        if self.closing:  # a connection's last use is on the sweep's clock, one sweep behind: what was used since
            idle_before = min(self.swept, self.now - CLOSING_IDLE_SECONDS)  # the last sweep reads ``swept``
            for client in list(self.clients):
                client.close_if_idle(idle_before)
        if self.lane is not None:
            self.lane.tick(self.now, self.now - KEEPALIVE_SECONDS)
        if self.decisions is not None:
            self.decisions.sweep()

    def expire_silent(self, elapsed: float) -> None:
        """Count ``elapsed`` seconds of silence against each exchange that received nothing since last time.

        Before the response head the limit is ``firstByteTimeoutSeconds``, after it ``upstreamTimeoutSeconds``.
        """
        settings = self.context.settings
        first_byte, idle = settings.first_byte_timeout_seconds, settings.upstream_timeout_seconds
        if first_byte is None and idle is None:
            return
        for exchange in list(self.active):
            # Bytes arrived (a head's do not count: firstByteTimeoutSeconds bounds the wait for the whole head, so
            # a replica trickling one is timed out too), or a slow client paused us.
            if (exchange.seen != exchange.swept and exchange.state != WAITING) or exchange.paused:
                exchange.swept, exchange.silent = exchange.seen, 0.0
                continue
            exchange.silent += elapsed
            limit = first_byte if exchange.state == WAITING else idle
            if limit is not None and exchange.forwarded:
                limit += FORWARD_SLACK_SECONDS  # the owner router times its replica out first, and says so
            if limit is not None and exchange.silent >= limit:
                exchange.timeout()


def _hopped(fleet: Fleet, request: HttpRequest) -> bool:
    """Another router of the fleet sent this request here (its hop header, naming it)."""
    return fleet.hopped(request.keys.get(HOP) if request.keys else None)

"""The traffic listener's requests: session key, owner or replica, the attempt, the probes, the sweep."""
from __future__ import annotations

import logging
import time

from ...fleet.rlstate import Paused
from ...policy import NoReplicaError
from .. import admin, rl_routes, workers
from ..attempts import AllRefused, OutOfDescriptors, forward
from ..context import RouterContext
from ..errors import RouterError
from ..listener import Limits, traffic_limits
from ..owner import FORWARD_SLACK_SECONDS, HOP
from ..session_key import KeyNames, body_key, decoded_body, header_key
from . import wire
from .listener import HttpListener
from .owner import to_owner
from .relay import WAITING, Exchange, attempt
from .routes import REPLICA_HEADER, forwarded, normalise, unkeyed
from .server import ClientConnection, HttpRequest
from .upstream import KEEPALIVE_SECONDS, Pools

log = logging.getLogger(__name__)


class HttpProxy(HttpListener):
    """The traffic port: forwards the OpenAI-compatible paths, answers the probes."""

    name = "traffic"

    def __init__(self, context: RouterContext):
        super().__init__(context)
        self.pools = Pools()
        self.active: set[Exchange] = set()
        self.answering = 0  # requests being answered now (decided, forwarded or relayed)
        self._key_names = KeyNames(HOP)  # the parser keeps the hop header too

    def limits(self) -> Limits:
        return traffic_limits(self.context.settings)

    async def close(self) -> None:
        await super().close()
        self.pools.close_idle(float("inf"))

    def key_names(self) -> tuple[tuple[bytes, ...], frozenset[bytes]]:
        """The session-key headers, lower-cased, in precedence order (the kept set has the group-key headers too);
        recomputed when settings change."""
        settings = self.context.settings
        return self._key_names.of(settings.session, settings.group)

    async def handle(self, client: ClientConnection, request: HttpRequest) -> None:
        """Answer one request; never raises (whatever goes wrong, the client gets JSON naming it)."""
        self.answering += 1
        fleet = self.context.fleet
        if fleet is not None and fleet.leaving:
            request.close_after = True  # the client's next request opens a connection to a router that stays
        try:
            if request.error is not None:
                return self._refuse(client, request, request.error)
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
            self.answering -= 1

    async def _forward(self, client: ClientConnection, request: HttpRequest) -> None:
        try:
            key, group = (None, None) if unkeyed(request.path) else self._keys(request)
        except RouterError as error:
            return self._refuse(client, request, error)
        headers = b"".join([b"%s: %s\r\n" % pair for pair in request.headers])  # once for every attempt
        metrics = self.context.metrics
        fleet = self.context.fleet
        if fleet is not None and key is not None and await fleet.via_owner(
                key, bool(request.keys and HOP in request.keys),
                lambda owner: to_owner(self, fleet, client, request, headers, owner)):
            return

        async def send(lease, turn) -> bool:
            started = time.monotonic()
            turn.begin(started)
            code, accepted = await attempt(self, client, request, headers, lease, turn)
            if code is not None:
                metrics.observe(lease.replica.id, code, time.monotonic() - started)
            return accepted

        try:
            await forward(self.context, key, send, group=group)
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
        fields; the body is inflated at most once for both."""
        settings = self.context.settings
        names, _ = self.key_names()  # also brings ``groups`` up to date with the settings
        body: list[tuple[bytes, str | None]] = []  # the decoded body, once one of the keys needs it

        def find(headers: list[str], lowered: tuple[bytes, ...], fields: list[str], kind: str) -> str | None:
            if request.keys:
                for name, lower in zip(headers, lowered):
                    value = request.keys.get(lower)
                    if value:
                        return header_key(name, value, settings.session, kind)
            if not fields:
                return None
            if not body:
                body.append(self._json_body(request))
            return body_key(*body[0], settings.session, fields, kind)

        return (find(settings.session.headers, names, settings.session.body_fields, "session"),
                find(settings.group.headers, self._key_names.groups, settings.group.body_fields, "group"))

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
        """Once a sweep: time out silent replicas, close upstream connections idle too long."""
        self.pools.close_idle(self.now - KEEPALIVE_SECONDS)
        self.expire_silent(elapsed)

    def expire_silent(self, elapsed: float) -> None:
        """Count ``elapsed`` seconds of silence against each exchange that received nothing since last time.

        Before the response head the limit is ``firstByteTimeoutSeconds``, after it ``upstreamTimeoutSeconds``.
        """
        settings = self.context.settings
        first_byte, idle = settings.first_byte_timeout_seconds, settings.upstream_timeout_seconds
        if first_byte is None and idle is None:
            return
        for exchange in list(self.active):
            if exchange.seen != exchange.swept or exchange.paused:  # bytes arrived, or a slow client paused us
                exchange.swept, exchange.silent = exchange.seen, 0.0
                continue
            exchange.silent += elapsed
            limit = first_byte if exchange.state == WAITING else idle
            if limit is not None and exchange.forwarded:
                limit += FORWARD_SLACK_SECONDS  # the owner router times its replica out first, and says so
            if limit is not None and exchange.silent >= limit:
                exchange.timeout()


def write_admin(listener: HttpListener, client: ClientConnection, request: HttpRequest, answer: admin.AdminAnswer,
                extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Write an admin route's answer (counting it when it is an error)."""
    if answer.status >= 400:
        listener.context.metrics.errors.labels(f"http_{answer.status}").inc()
    client.write(wire.answer(answer.status, answer.body, answer.content_type.encode(), extra=extra,
                             close=request.close_after or not request.keep_alive, head_only=request.head_only))

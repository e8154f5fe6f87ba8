"""The gRPC listener's calls: limits, session key, owner or replica, the attempt, the sweep."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time

from ...fleet.rlstate import Paused
from ...health import TIMEOUT
from ...policy import NoReplicaError
from ...settings import SessionSettings
from ..attempts import AllRefused, OutOfDescriptors, Refused, forward, refused_or_short, taken
from ..context import RouterContext
from ..errors import RouterError
from ..listener import BODY_GRACE_SECONDS, Budget, Limits, Listener, traffic_limits
from ..outcome import Routing, answered, put_back
from ..outcome import refused as given_back
from ..owner import FORWARD_SLACK_SECONDS, HOP
from ..session_key import KeyNames, header_key
from . import h2
from .call import REFUSED, Call
from .outbound import flush_dirty
from .owner import to_owner
from .server import ClientConnection
from .upstream import Upstreams, answer_window
from .usage import LastMessage, generate_path

log = logging.getLogger(__name__)

REPLICA_METADATA = "x-rolloutrouter-replica"
# gRPC statuses that say the server failed, as the HTTP 5xx they map to (UNKNOWN, INTERNAL, DATA_LOSS 500,
# UNAVAILABLE 503), for health.consecutive5xx; DEADLINE_EXCEEDED is left out: the client's deadline ran out
SERVER_ERROR_CODES = {2: 500, 13: 500, 14: 503, 15: 500}
_NOT_RELAYED = frozenset({b"te", b"connection", b"host"})  # the request head's fields the replica's head rebuilds


def unary_request_methods() -> frozenset[bytes]:
    """Paths of the methods whose client sends exactly one message, from vLLM's protos."""
    try:
        from smg_grpc_proto.generated import vllm_engine_pb2
    except ImportError:  # without the protos no call gets the one-message timeouts; every call still works
        return frozenset()
    return frozenset(f"/{service.full_name}/{method.name}".encode()
                     for service in vllm_engine_pb2.DESCRIPTOR.services_by_name.values()
                     for method in service.methods if not method.client_streaming)


def _find(pairs: tuple[tuple[str, bytes], ...], metadata: list[h2.Header], session: SessionSettings,
          kind: str) -> str | None:
    """The ``kind`` key from the first of the headers ``pairs`` names (as written, lower-case) in ``metadata``."""
    for header, lower in pairs:
        for name, value in metadata:
            if name == lower and value:
                return header_key(header, value, session, kind)
    return None


class Handed:
    """A call ``GrpcProxy._here`` routed and hands to a task: its keys, its routing, and the refusal of the attempt
    it made there, if any (``attempts.forward`` records it as the first attempt's)."""

    __slots__ = ("key", "group", "routing", "refusal")

    def __init__(self, key: str | None, group: str | None, routing: Routing) -> None:
        self.key, self.group, self.routing = key, group, routing
        self.refusal: Refused | None = None


class GrpcProxy(Listener):
    name = "grpc"
    refusal = "RESOURCE_EXHAUSTED"

    def __init__(self, context: RouterContext, budget: Budget | None = None):
        super().__init__(context, budget)
        self.upstreams = Upstreams(lambda: answer_window(self.limits().max_buffered_bytes,
                                                         self.context.settings.max_grpc_streams))
        self.calls: set[Call] = set()  # calls in progress (bounded by maxGrpcStreams)
        self.active: set[Call] = set()  # calls with an attempt on a replica
        self.unary_methods = unary_request_methods()
        self.generate = generate_path()  # the calls whose answers report prefill
        self._streams_full = False
        self._key_names = KeyNames()
        context.metrics.grpc_calls.set_function(lambda: len(self.calls))

    def limits(self) -> Limits:
        return traffic_limits(self.context.settings)

    def connection(self) -> asyncio.Protocol:
        return ClientConnection(self)

    def budget_message(self) -> str:
        return (f"the router holds its limit of buffered request bytes (maxBufferedBytes="
                f"{self.limits().max_buffered_bytes}); retry later")

    def refused(self, reason: str) -> None:
        self.context.metrics.errors.labels(reason).inc()

    def stop_accepting(self) -> None:
        """Also: every connection is told to go away (GOAWAY), so that its client opens new calls elsewhere; the calls
        in progress go on until they end."""
        super().stop_accepting()
        for client in list(self.clients):
            client.go_away()
        flush_dirty()

    async def close(self, grace: float = 2.0) -> None:
        """Stop taking calls, let those in progress finish for up to ``grace`` seconds, then close everything."""
        if self._server is not None:
            self._server.close()
        for client in list(self.clients):
            client.go_away()
        flush_dirty()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                while self.calls:
                    await asyncio.sleep(0.05)
        await super().close()
        self.upstreams.close()

    def prune(self) -> None:
        """Retire connections to targets that no replica (live or still draining) or peer router has any more."""
        live = self.context.replicas.grpc_targets()
        if self.context.fleet is not None:  # and the owner routers calls are forwarded to
            live |= {m.grpc for m in self.context.fleet.membership.peers.values() if m.grpc}
        for target in self.upstreams.targets() - live:
            self.upstreams.retire(target)

    # a new call
    def open_call(self, client: ClientConnection, stream, headers: list[h2.Header], path: bytes, end: bool) -> None:
        """A new call: ``headers``, its request head (well-formed, a POST: ``ClientConnection.headers_frame``)."""
        metadata, mark = [], None
        for field in headers:
            name = field[0]
            if name[:1] == b":" or name in _NOT_RELAYED:
                continue
            if name == HOP:  # read, never relayed: a forward carries this router's own (as over HTTP)
                mark = field[1] if mark is None else mark
            else:
                metadata.append(field)
        if not path.startswith(b"/"):
            return client.answer(stream, h2.UNIMPLEMENTED, "gRPC calls are POST requests to /service/method",
                                 request_ended=end)
        limit = self.context.settings.max_grpc_streams
        if len(self.calls) >= limit:
            self.refused("stream_limit")
            if not self._streams_full:
                self._streams_full = True
                log.warning("grpc listener: %d calls in progress, the limit (maxGrpcStreams=%d); new calls get "
                            "RESOURCE_EXHAUSTED until some end", len(self.calls), limit)
            return client.answer(stream, h2.RESOURCE_EXHAUSTED, "the router has reached its limit of concurrent "
                                 f"gRPC calls (maxGrpcStreams={limit}); retry later", request_ended=end)
        call = Call(self, client, stream, path, metadata, path in self.unary_methods, mark)
        self.calls.add(call)
        if not call.single:
            self.begin(call)
        if end:
            call.on_data(stream, b"", True)

    def begin(self, call: Call) -> None:
        """Route ``call`` and start its attempt. A one-message call (vLLM's methods) starts once its message is
        whole (``Call.on_data``): a stream opened and reset before that (rapid reset, CVE-2023-44487) costs a
        parsed head, never a routing decision, a task or a replica stream. Such a call, its request whole, most
        often starts from the read that completed it (``_here``); the rest, a call whose client may still send
        (client streaming: its request's later frames, a malformed trailer block among them, are read before it
        is routed, as they always were) and a call whose first attempt was refused, on a task of their own
        (``_serve``)."""
        call.started = True
        if not (call.single and self._here(call)):
            asyncio.get_running_loop().create_task(self._serve(call))

    def _here(self, call: Call) -> bool:
        """Route ``call`` and open its attempt's stream now, its end recorded when the replica ends it
        (``_ended``), when nothing needs a wait: no RL pause, and with a fleet, a key this router decides with no
        hop or pin fetch first (``Fleet.decided_here``). False leaves the call to ``_serve``: a refusal (its keys,
        no replica) or any of those. Routed but with no open connection to the replica, it goes to ``_serve``
        with its routing (``attempts.forward``'s ``first``), as the HTTP listener's fast path hands a request
        over."""
        context = self.context
        if context.rl.paused:
            return False
        try:
            key, group = self._keys(call.metadata)
            fleet = context.fleet
            if fleet is not None and key is not None and not fleet.decided_here(key, fleet.hopped(call.mark)):
                return False
            routing = taken(context, key, None, True, group)  # a kept turn not measured: no ``Turn`` (``_begin``)
        except Exception:  # noqa: BLE001  # an INVALID_ARGUMENT, no replica or a bug: ``_serve`` meets it again
            return False
        replica = routing.replica
        target = replica.grpc_target
        assert target is not None  # routed with grpc=True
        conn = self.upstreams.ready(target)
        if conn is None:  # a connection to wait for
            asyncio.get_running_loop().create_task(self._serve(call, Handed(key, group, routing)))
            return True
        try:
            self._begin(call, routing)
            call.prepare(replica.id, False)
            call.dispatch(conn, target, (), functools.partial(self._ended, call, key, group, routing))
        except Exception:  # as ``_serve`` answers a bug; the replica goes back as ``attempts.forward`` puts it
            log.exception("unexpected error on gRPC call %s", call.path.decode("latin-1"))
            call.ended = None  # (nothing records this attempt's end: it is over)
            self.active.discard(call)
            put_back(context.replicas, routing)
            call.answer(h2.INTERNAL, "internal router error; see the router's log")
        return True

    def _ended(self, call: Call, key: str | None, group: str | None, routing: Routing, outcome: str | None) -> None:
        """The end of an attempt ``_here`` started: recorded, the replica put back; refused (the replica never saw
        the call), it is retried on a task as ``attempts.forward`` retries, the refusal recorded there (handed over
        only then: most attempts end here answered, with no object to hand over)."""
        if outcome == REFUSED:
            handed = Handed(key, group, routing)
            handed.refusal = Refused(f"{routing.replica.id} closed the connection before answering")
            asyncio.get_running_loop().create_task(self._serve(call, handed))
            return
        try:
            self._record(call, routing)
        except Exception:  # a bug in recording must not break the connection's read: the call has its answer
            log.exception("unexpected error recording gRPC call %s", call.path.decode("latin-1"))
        finally:
            put_back(self.context.replicas, routing)

    async def _serve(self, call: Call, handed: Handed | None = None) -> None:
        try:
            await self._route(call, handed)
        except Exception:
            log.exception("unexpected error on gRPC call %s", call.path.decode("latin-1"))
            call.answer(h2.INTERNAL, "internal router error; see the router's log")
        finally:
            if not call.finished:  # every path above answers; this is the guard that nothing leaks
                call.answer(h2.INTERNAL, "the router ended the call without an answer")
            flush_dirty()

    async def _route(self, call: Call, handed: Handed | None) -> None:
        if handed is not None:  # routed by ``_here``: its first attempt refused, or waiting for a connection
            key, group, first = handed.key, handed.group, handed.routing
        else:
            try:
                key, group = self._keys(call.metadata)
            except RouterError as error:
                return call.refuse(h2.INVALID_ARGUMENT, error.message, error.reason)
            fleet = self.context.fleet
            if fleet is not None and key is not None and await fleet.via_owner(
                    key, fleet.hopped(call.mark), lambda member: to_owner(call, fleet, member)):
                return
            first = None
        if call.finished:
            if first is not None:  # the client left before the attempt began: the decision and the replica go back
                given_back(self.context, first, down=False)
            return

        async def send(routing: Routing) -> None:
            if handed is not None and handed.refusal is not None:  # ``_here``'s attempt, refused
                refusal, handed.refusal = handed.refusal, None
                raise refusal
            await self._attempt(call, routing)

        try:
            await forward(self.context, key, send, grpc=True, group=group, first=first)
        except NoReplicaError:
            self.refused("no_replica")
            call.answer(h2.UNAVAILABLE, self.context.replicas.unavailable(grpc=True))
        except AllRefused as error:
            self.refused("all_refused")
            call.answer(h2.UNAVAILABLE, str(error))
        except OutOfDescriptors as error:
            self.refused("out_of_descriptors")
            call.answer(h2.UNAVAILABLE, str(error))
        except Paused as paused:
            self.refused(paused.reason)
            call.answer(h2.UNAVAILABLE, f"{paused.message} (in {paused.retry_after} s)")

    @staticmethod
    def _begin(call: Call, routing: Routing) -> None:
        """An attempt dispatched on ``routing``: its clock and turn started, the turn measured if it should be. A
        kept turn that is not measured has no ``Turn`` (``_here`` routes with ``attempts.taken``, as the HTTP lane
        does): the call keeps its first message's time alone (``first_at``), which ``_record`` hands to
        ``outcome.answered``."""
        turn = routing.turn
        routing.start = time.monotonic()
        if turn is None:
            call.turn = call.last = None
            return
        turn.begin(routing.start)
        call.turn, call.last = turn, LastMessage() if turn.measure and call.path == call.proxy.generate else None

    def _record(self, call: Call, routing: Routing) -> None:
        """How an attempt the replica saw ended, recorded (``outcome.answered``)."""
        turn = routing.turn
        if call.last is not None and call.code == h2.OK and turn is not None:
            turn.prefill = call.last.prefill()
        status = SERVER_ERROR_CODES.get(call.code or 0, 200) if call.answered else 0
        answered(self.context, routing, h2.status_name(call.code), status, call.failure, call.accepted(),
                 time.monotonic(), call.first_at)

    async def _attempt(self, call: Call, routing: Routing) -> None:
        """One attempt on the routed replica, its end recorded (``outcome.answered``). Raises ``Refused`` to retry
        elsewhere."""
        replica = routing.replica
        assert replica.grpc_target is not None  # routed with grpc=True
        self._begin(call, routing)
        try:
            outcome = await call.attempt(replica.grpc_target, replica.id, False)
        except TimeoutError:  # before OSError, its base class
            raise Refused(f"connecting to {replica.id} timed out", TIMEOUT) from None
        except OSError as error:
            raise refused_or_short(error, str(error)) from None
        if outcome == REFUSED:
            raise Refused(f"{replica.id} closed the connection before answering")
        self._record(call, routing)

    def _keys(self, metadata: list[h2.Header]) -> tuple[str | None, str | None]:
        """The session key and the GRPO group key from the metadata their headers name (gRPC has no JSON
        body). The names are looked up once for both (``KeyNames`` recomputes only when the settings change)."""
        settings, names = self.context.settings, self._key_names
        names.of(settings.session, settings.group)  # the pairs up to date with the settings
        group = names.group_pairs
        return (_find(names.session_pairs, metadata, settings.session, "session"),
                _find(group, metadata, settings.session, "group") if group else None)

    # the sweep
    def tick(self, elapsed: float) -> None:
        """Once a sweep: first-byte and mid-response timeouts, slow one-message requests, the end of a
        stream-limit episode."""
        settings, now = self.context.settings, self.now
        if self._streams_full and len(self.calls) < settings.max_grpc_streams:
            self._streams_full = False
        first_byte, idle = settings.first_byte_timeout_seconds, settings.upstream_timeout_seconds
        for call in list(self.active):
            slack = FORWARD_SLACK_SECONDS if call.forwarded else 0.0  # the owner router times out first, and says so
            if first_byte is not None and call.single and not call.first and call.waiting_since is not None \
                    and now - call.waiting_since >= first_byte + slack:
                call.timeout()
            elif idle is not None and call.request_ended and (call.first or (call.answered and not call.single)):
                call.sweep_silence(elapsed, idle, slack)  # (a client still sending may be what the replica awaits)
        limits = self.limits()
        for call in list(self.calls):
            if not call.request_ended:
                self._check_body(call, now - call.started_at, limits)
        flush_dirty()

    def _check_body(self, call: Call, elapsed: float, limits: Limits) -> None:
        """A one-message request must arrive as an HTTP body must (bodyTimeoutSeconds, minBodyBytesPerSecond); a
        client-streaming call (any method but vLLM's) must end its request within bodyTimeoutSeconds too, or one
        connection's never-ending calls could hold every call slot."""
        if limits.body_timeout is not None and elapsed > limits.body_timeout:
            call.refuse(h2.DEADLINE_EXCEEDED, "request message not complete within "
                        f"bodyTimeoutSeconds={limits.body_timeout:g}", "body_timeout")
        elif call.single and elapsed > BODY_GRACE_SECONDS and call.received / elapsed < limits.min_body_rate:
            call.refuse(h2.DEADLINE_EXCEEDED, f"request message arrives at {call.received / elapsed:.0f} bytes/s, "
                        f"slower than minBodyBytesPerSecond={limits.min_body_rate}", "body_too_slow")


"""Endpoints about the router itself: health, readiness, metrics, status, sessions.

Plain functions of the router's context that return an ``AdminAnswer``, found
through one route table (``ROUTES``), so any listener can serve them: the
admin listener serves them all; the traffic port serves only the probes
(``Route.probe``), so kubelet and load balancers can check it too. A new admin
endpoint is one more ``Route`` in the table.
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from urllib.parse import unquote

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..fleet.release import AWAY, NOT_PINNED, RELEASED, others, release_at_peers
from .context import RouterContext
from .errors import error_body


@dataclasses.dataclass(frozen=True, slots=True)
class AdminAnswer:
    status: int
    body: bytes
    content_type: str = "application/json"


@dataclasses.dataclass(frozen=True, slots=True)
class Deferred(AdminAnswer):
    """An answer that takes I/O (the RL fan-out): the admin listener awaits ``then`` for the real one."""

    then: Callable[[], Awaitable[AdminAnswer]] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Stream(AdminAnswer):
    """An answer of JSON lines (``application/x-ndjson``, chunked) written as ``lines`` yields them, until the
    client goes: a fleet peer's watch of this router's loads."""

    lines: Callable[[], AsyncGenerator[bytes, None]] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class AdminRequest:
    """What an admin handler may read: the method, the path's ``{name}`` parameters (decoded), query and body."""

    method: str
    path: str
    params: dict[str, str] = dataclasses.field(default_factory=dict)
    query: str = ""
    body: bytes = b""


Handler = Callable[[RouterContext, AdminRequest], AdminAnswer]


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """``pattern`` is a path whose ``{name}`` segments match one non-empty segment each."""

    pattern: str
    methods: tuple[str, ...]
    handler: Handler
    probe: bool = False  # kubelet's: no token needed, also answered on the traffic port

    def match(self, path: str) -> dict[str, str] | None:
        """The parameters (as sent, percent-encoded) when ``path`` matches, else None."""
        want, got = self.pattern.split("/"), path.split("/")
        if len(want) != len(got):
            return None
        params = {}
        for pattern, segment in zip(want, got):
            if pattern.startswith("{") and pattern.endswith("}"):
                if not segment:
                    return None
                params[pattern[1:-1]] = segment  # still percent-encoded: ``admin_answer`` decodes it
            elif pattern != segment:
                return None
        return params


class BadParameter(ValueError):
    """A path parameter that is not valid percent-encoded UTF-8: answered 400 naming it, never taken literally
    (``%zz`` would have released a session named ``%zz``, ``%ff`` one named U+FFFD)."""

    def __init__(self, name: str, segment: str):
        super().__init__(f"path parameter {name} ({segment[:200]}) is not valid percent-encoded UTF-8")
        self.name = name


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _decoded(segment: str, name: str) -> str:
    if _BAD_ESCAPE.search(segment):
        raise BadParameter(name, segment)
    try:
        return unquote(segment, errors="strict")
    except UnicodeDecodeError:
        raise BadParameter(name, segment) from None


def _json(document: dict, code: int = 200) -> AdminAnswer:
    return AdminAnswer(code, json.dumps(document).encode())


def error(code: int, message: str, param: str | None = None) -> AdminAnswer:
    return _json(error_body(code, message, param), code)


def healthz(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    return _json({"status": "ok"})


def readyz(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    """Ready once some replica can take a request, so Services skip an empty router; not once it is stopping
    (SIGTERM: it leaves its fleet, if any), so Services stop sending it new traffic; not before it has heard from its fleet
    (``Fleet.settled``), and a ``--workers`` worker not before it sees its siblings (``Fleet.quorate``)."""
    if context.fleet is not None and context.fleet.leaving:
        return error(503, "this router is leaving its fleet: its sessions are handed to the other routers")
    if context.draining:
        return error(503, "this router is stopping: it finishes the requests it accepted and takes no new ones")
    if context.fleet is not None and not context.fleet.quorate():
        return error(503, f"this worker sees {1 + context.fleet.siblings_seen()} of the "
                          f"{1 + len(context.fleet.siblings)} workers "
                          "of its pod (serve --workers): not ready until it sees them all")
    if context.fleet is not None and not context.fleet.settled():
        return error(503, f"this router has not heard from its fleet yet ({context.fleet.unasked()} candidate "
                          "peers not polled, or the router pods not listed): not ready until it has")
    ready = context.replicas.ready_count()
    if ready == 0:
        return error(503, "no replica is ready")
    return _json({"status": "ready", "backends_ready": ready, "backends_ready_http": len(context.replicas.loads()),
                  "backends_ready_grpc": len(context.replicas.loads(grpc=True))})


def metrics(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    return AdminAnswer(200, generate_latest(context.metrics.registry), CONTENT_TYPE_LATEST)


def status_document(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    return _json(context.metrics.status())


def session_document(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    """Where one session is pinned here: its replica, how long it has been pinned there and idle (seconds); in a
    fleet, a session another router owns is a 404 naming that router, whose admin port knows."""
    key = request.params["key"]
    balancer = context.balancer
    replica, used = balancer.pinned(key), balancer.last_used(key)
    if replica is None or used is None:
        owner = context.fleet.owner_of(key) if context.fleet is not None else None
        where = f"; its owner is {owner.id}: ask it" if owner is not None else ""
        return error(404, f"session {key!r} is not pinned on this router{where}", "key")
    age = balancer.pin_age(key)
    return _json({"session": key, "replica": replica, "pinnedSeconds": age,
                  "idleSeconds": round(max(0.0, context.clock() - used), 3)})


def release_session(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    """Drop a finished conversation's pin now instead of waiting for the idle timeout: here, and in a fleet at
    every live router (``fleet/release.py``), whichever router the call reaches."""
    key = request.params["key"]
    released = context.balancer.release_session(key)
    fleet = context.fleet
    if fleet is None or not others(fleet):
        return _json({"session": key, "released": True}) if released \
            else error(404, f"session {key!r} is not pinned", "key")

    async def everywhere() -> AdminAnswer:
        routers = {fleet.self_id: RELEASED if released else NOT_PINNED, **await release_at_peers(fleet, key)}
        return _released_in_fleet(key, routers)
    return Deferred(200, b"", then=everywhere)


def _released_in_fleet(key: str, routers: dict[str, str]) -> AdminAnswer:
    """200 when some router held the pin; 404 when every router answered that none did, or did not answer and
    is not live here either (named: most likely gone); 503 otherwise, naming the live routers that did not
    answer (the pin may be theirs: retry)."""
    if RELEASED in routers.values():
        return _json({"session": key, "released": True, "routers": routers})
    away = sorted(peer for peer, outcome in routers.items() if outcome.startswith(AWAY))
    silent = sorted(peer for peer, outcome in routers.items() if outcome != NOT_PINNED and peer not in away)
    if not silent:
        answered = len(routers) - len(away)
        return error(404, f"session {key!r} is not pinned on any of the {answered} routers that answered"
                          + (f"; {', '.join(away)} did not and {'is' if len(away) == 1 else 'are'} not live"
                             if away else ""), "key")
    return error(503, f"session {key!r} is not pinned on the routers that answered; "
                      f"{', '.join(f'{peer} ({routers[peer]})' for peer in silent)}: retry")


GET = ("GET", "HEAD")
ROUTES: list[Route] = [
    Route("/healthz", GET, healthz, probe=True),
    Route("/readyz", GET, readyz, probe=True),
    Route("/metrics", GET, metrics),
    Route("/status", GET, status_document),
    Route("/v1/sessions/{key}", ("DELETE",), release_session),
    Route("/v1/sessions/{key}", GET, session_document),
]


def find(path: str, probes_only: bool = False, routes: Sequence[Route] = ROUTES) -> list[tuple[Route, dict[str, str]]]:
    """The routes matching ``path`` with their parameters (several when they differ by method)."""
    found = []
    for route in routes:
        if probes_only and not route.probe:
            continue
        params = route.match(path)
        if params is not None:
            found.append((route, params))
    return found


def admin_answer(context: RouterContext, method: str, path: str, query: str = "", body: bytes = b"",
                 probes_only: bool = False, routes: Sequence[Route] = ROUTES) -> AdminAnswer | None:
    """The answer to an admin route, a 405 for a wrong method on one, None for any other path."""
    found = find(path, probes_only, routes)
    if not found:
        return None
    for route, params in found:
        if method in route.methods:
            try:
                decoded = {name: _decoded(segment, name) for name, segment in params.items()}
            except BadParameter as bad:
                return error(400, str(bad), bad.name)
            return route.handler(context, AdminRequest(method, path, decoded, query, body))
    return error(405, f"Method Not Allowed: {method} {path}")

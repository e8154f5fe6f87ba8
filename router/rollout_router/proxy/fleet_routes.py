"""Routes between routers, on the admin listener (token-protected like the other admin routes).

- ``GET /fleet/v1/info``: ``{"id", "http", "grpc", "leaving"}``, where this router's traffic is served.
- ``GET /fleet/v1/loads``: ``{"id", "loads": {replica: n}, "leaving", "rl"}``, this router's own in-flight counts
  (never the peers' it added: each count is reported by the one router that holds it); ``leaving``: it
  owns no key any more (``fleet/leaving.py``); ``rl``: its RL pause state with its epoch (``fleet/rlstate.py``).
  With ``?watch=S&heartbeat=H`` the same document as a line (JSON lines, chunked) whenever it changed, looked at
  every S seconds, and at least every H: how peers follow each other (``Fleet._poll``).
- ``POST /fleet/v1/handoff`` ``{"key": K}``: give up K's pin to its new owner; ``{"key", "replica", "idleSeconds"}``
  (``replica`` null and no ``idleSeconds`` when this router held no pin for K; ``idleSeconds``: since
  the pin's last use, so a router that finds two pins keeps the fresher).
- ``POST /fleet/v1/release`` ``{"key": K}``: drop K's pin here (``DELETE /v1/sessions/K`` at a peer, which asks
  every router: ``fleet/release.py``); ``{"key", "released": bool}``.
- ``POST /fleet/v1/leave`` ``{"id": PEER, "done": bool}``: that peer is leaving (``done``: it handed over
  every pin it held); ``{"id"}``.
- ``POST /fleet/v1/adopt`` ``{"from": PEER, "pins": [{"key", "replica", "idleSeconds"}, ...], "redirect"}``: pins
  pushed by a peer that is leaving; a pin held here and used more recently is kept; with ``redirect``, a pin that
  is a third member's in this router's view is not taken but named. ``{"adopted": n, "kept": n,
  "elsewhere": {key: member}}``.

A router without session ownership answers 404 on each.
"""
from __future__ import annotations

import asyncio
import json
import urllib.parse
import weakref
import zlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from .. import jsonbody
from .admin import GET, AdminAnswer, AdminRequest, Route, Stream, error
from .context import RouterContext

if TYPE_CHECKING:
    from ..fleet.node import Fleet

# A watch of the loads (``?watch=S&heartbeat=H``): its bounds, so a caller cannot make this router spin or go silent.
MIN_WATCH_SECONDS, MAX_WATCH_SECONDS, MAX_HEARTBEAT_SECONDS = 0.01, 1.0, 10.0
# Each fleet's last loads line and when it was made (the loop clock): the peers watching at one interval wake on
# the same ticks and share it, so a member's cost of being watched does not grow with its peers' number.
_LINES: weakref.WeakKeyDictionary[Fleet, tuple[float, bytes]] = weakref.WeakKeyDictionary()
SHARED_FOR = 1 / 8  # a line is shared for this fraction of a watch's interval: how much older it may be
MAX_REPLICA_CHARS = 2048  # a pushed pin's replica URL


def _json(document: dict) -> AdminAnswer:
    return AdminAnswer(200, json.dumps(document).encode())


def _off() -> AdminAnswer:
    return error(404, "session ownership is off on this router (no --peer, fleet.peers or --peer-selector)")


def info(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    fleet = context.fleet
    if fleet is None:
        return _off()
    return _json({"id": fleet.self_id, "http": fleet.http_url, "grpc": fleet.grpc_target, "leaving": fleet.leaving})


def loads(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    fleet = context.fleet
    if fleet is None:
        return _off()
    if not request.query:
        return _json(_loads(context, fleet))
    every = _watch_query(request.query)
    if isinstance(every, AdminAnswer):
        return every
    return Stream(200, b"", "application/x-ndjson", lines=lambda: _watch(context, fleet, *every))


def _loads(context: RouterContext, fleet: Fleet) -> dict:
    return {"id": fleet.self_id, "loads": context.replicas.own_loads(), "leaving": fleet.leaving,
            "rl": context.rl.shared()}


def _watch_query(query: str) -> tuple[float, float] | AdminAnswer:
    """``watch=S&heartbeat=H``: look for a change every S seconds, send the loads at least every H."""
    fields = urllib.parse.parse_qs(query)
    found: dict[str, float] = {}
    for name, low, high in (("watch", MIN_WATCH_SECONDS, MAX_WATCH_SECONDS),
                            ("heartbeat", MIN_WATCH_SECONDS, MAX_HEARTBEAT_SECONDS)):
        try:
            [value] = fields.pop(name)
            found[name] = float(value)
        except (KeyError, ValueError):
            return error(400, f"loads watch needs {name}=SECONDS, one number between {low:g} and {high:g}", name)
        if not low <= found[name] <= high:
            return error(400, f"loads watch {name}={found[name]:g} is outside {low:g}..{high:g} seconds", name)
    if fields:
        name = sorted(fields)[0]
        return error(400, f"loads has no query parameter {name!r}; it takes watch and heartbeat", name)
    return found["watch"], found["heartbeat"]


async def _watch(context: RouterContext, fleet: Fleet, every: float, heartbeat: float) -> AsyncGenerator[bytes, None]:
    """The loads as a line whenever they changed (looked at every ``every`` s), and at least every ``heartbeat``
    s: an idle peer costs a line per heartbeat, not a request per poll. The looks fall on the multiples of
    ``every`` shifted by a phase of this router's own (its workers do not all wake at once)."""
    loop = asyncio.get_running_loop()
    phase = zlib.crc32(fleet.self_id.encode()) % 1024 / 1024 * every
    last, sent = b"", float("-inf")
    while True:
        now = loop.time()
        made, line = _LINES.get(fleet, (float("-inf"), b""))
        if now - made > every * SHARED_FOR:
            line = json.dumps(_loads(context, fleet)).encode() + b"\n"
            _LINES[fleet] = (now, line)
        if line != last or now - sent >= heartbeat:
            last, sent = line, now
            yield line
        await asyncio.sleep(every - (loop.time() - phase) % every)


def _key(request: AdminRequest, route: str) -> str | AdminAnswer:
    """The ``{"key": K}`` body of a route about one session, or the 400 naming what is wrong with it."""
    try:
        body = jsonbody.parse(request.body or b"null")
    except ValueError:
        return error(400, f"{route} body is not JSON; expected {{\"key\": SESSION_KEY}}")
    key = body.get("key") if isinstance(body, dict) else None
    if not isinstance(key, str) or not key:
        return error(400, f"{route} body needs \"key\": a non-empty session key", "key")
    return key


def handoff(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    fleet = context.fleet
    if fleet is None:
        return _off()
    key = _key(request, "handoff")
    if isinstance(key, AdminAnswer):
        return key
    used = context.balancer.last_used(key)
    replica = fleet.handoff.surrender(key)
    answer: dict = {"key": key, "replica": replica}
    if replica is not None and used is not None:
        answer["idleSeconds"] = round(max(0.0, context.clock() - used), 3)
    return _json(answer)


def release(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    """Drop this router's own pin of a key (a peer took ``DELETE /v1/sessions/KEY``); asks no one further."""
    if context.fleet is None:
        return _off()
    key = _key(request, "release")
    if isinstance(key, AdminAnswer):
        return key
    return _json({"key": key, "released": context.balancer.release_session(key)})


def peer_leaving(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    fleet = context.fleet
    if fleet is None:
        return _off()
    body = _body(request)
    body = body if isinstance(body, dict) else {}
    peer = body.get("id")
    if not isinstance(peer, str) or not peer.startswith(("http://", "https://")):
        return error(400, "leave body needs \"id\": the leaving router's admin URL", "id")
    done = body.get("done", False)
    if not isinstance(done, bool):
        return error(400, "leave body's \"done\" must be true or false", "done")
    fleet.peer_leaving(peer.rstrip("/"), done)
    return _json({"id": fleet.self_id})


def adopt(context: RouterContext, request: AdminRequest) -> AdminAnswer:
    fleet = context.fleet
    if fleet is None:
        return _off()
    body = _body(request)
    items = body.get("pins") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return error(400, "adopt body needs \"pins\": [{\"key\", \"replica\", \"idleSeconds\"}, ...]", "pins")
    pins = []
    max_key = context.settings.session.max_key_bytes  # as a client's key is bounded: what a pin may make us hold
    for index, item in enumerate(items):
        pin = _pin(item, max_key)
        if pin is None:
            return error(400, f"pins[{index}] needs a \"key\" of 1-{max_key} bytes (session.maxKeyBytes), a "
                              f"\"replica\" URL of at most {MAX_REPLICA_CHARS} characters and \"idleSeconds\" >= 0",
                         f"pins[{index}]")
        pins.append(pin)
    assert isinstance(body, dict)
    pusher, redirect = body.get("from"), body.get("redirect", False)
    if pusher is not None and not isinstance(pusher, str):
        return error(400, "adopt body's \"from\" must be the pushing router's admin URL", "from")
    if not isinstance(redirect, bool):
        return error(400, "adopt body's \"redirect\" must be true or false", "redirect")
    if fleet.leaving:  # it would take pins after its own last push: the pusher keeps them, where owners ask first
        return error(503, "this router is leaving its fleet: it takes no pins; push them to another member")
    adopted, elsewhere = fleet.adopt(pins, pusher.rstrip("/") if pusher else None, redirect)
    return _json({"adopted": adopted, "kept": len(pins) - adopted - len(elsewhere), "elsewhere": elsewhere})


def _pin(item: object, max_key: int) -> tuple[str, str, float] | None:
    if not isinstance(item, dict):
        return None
    key, replica, idle = item.get("key"), item.get("replica"), item.get("idleSeconds")
    if not (isinstance(key, str) and 0 < len(key.encode("utf-8", "surrogatepass")) <= max_key
            and isinstance(replica, str) and 0 < len(replica) <= MAX_REPLICA_CHARS):
        return None
    if isinstance(idle, bool) or not isinstance(idle, (int, float)) or not idle >= 0:
        return None
    return key, replica, float(idle)


def _body(request: AdminRequest) -> object:
    try:
        return jsonbody.parse(request.body or b"null")
    except ValueError:
        return None


ROUTES = [
    Route("/fleet/v1/info", GET, info),
    Route("/fleet/v1/loads", GET, loads),
    Route("/fleet/v1/handoff", ("POST",), handoff),
    Route("/fleet/v1/release", ("POST",), release),
    Route("/fleet/v1/leave", ("POST",), peer_leaving),
    Route("/fleet/v1/adopt", ("POST",), adopt),
]

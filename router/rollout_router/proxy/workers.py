"""The worker API of SGLang's router and vllm-router: register, list and remove replicas at run time.

RL frameworks that start and stop rollout engines themselves (slime, for one)
register each engine with their router over HTTP. These routes answer the
calls those routers serve, with the same paths, parameters and JSON keys:

- ``POST /add_worker?url=U``, ``POST /remove_worker?url=U``, ``GET /list_workers``
  (SGLang's router up to 0.2.1, vllm-router): plain-text answers, ``{"urls": [...]}``.
- ``POST /workers`` with ``{"url": U}``, ``GET /workers``, ``GET /workers/{id}``,
  ``DELETE /workers/{id}`` (SGLang's router 0.2.2 on, vllm-router): ``{id}`` is
  the worker's id from ``GET /workers`` or its URL, percent-encoded.

A worker added here is an ordinary replica whose source is ``api``: a static
list reload or discovery never removes it, and these routes never remove a
static or discovered one. Removal answers at once: new requests stop going
there, and the requests in flight finish (``ReplicaSet.remove`` drains them).
An id is a UUID derived from the URL, so it is the same on every router
replica and across restarts. Errors are this router's JSON errors, with the
status codes those routers use.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from urllib.parse import parse_qs, unquote, urlsplit

from .. import addresses, jsonbody
from ..replicas import API, Replica, grpc_only
from ..settings import Backend, SettingsError, parse_settings
from .admin import GET, AdminAnswer, Route
from .context import RouterContext
from .errors import error_body

WORKERS, WORKERS_PREFIX = "/workers", "/workers/"
Handler = Callable[[RouterContext, str, str, bytes], AdminAnswer]  # (context, path, query, body)


def worker_id(url: str) -> str:
    """A worker's id: a UUID (as SGLang's router gives) derived from its URL, stable across router replicas."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, url))


def _json(document: dict, code: int = 200) -> AdminAnswer:
    return AdminAnswer(code, json.dumps(document).encode())


def _text(message: str) -> AdminAnswer:
    return AdminAnswer(200, message.encode(), "text/plain; charset=utf-8")


def _error(code: int, message: str, param: str | None = None) -> AdminAnswer:
    return _json(error_body(code, message, param), code)


def _valid_url(context: RouterContext, url: object, registering: bool = True) -> str | AdminAnswer:
    """The worker URL normalised as a static backend's is (no trailing slash), or a 400 naming the problem
    (``addresses.refusal``: link-local and metadata addresses, the allowlist)."""
    if not isinstance(url, str) or not url:
        return _error(400, "the worker URL is required: ?url=http://HOST:PORT, or {\"url\": ...} in a JSON body", "url")
    try:
        parsed = parse_settings({"url": url}, Backend).url
    except SettingsError as error:
        return _error(400, f"invalid worker URL: {error}", "url")
    if not registering:  # a worker registered before the allowlist changed can still be removed
        return parsed
    host = urlsplit(parsed).hostname or ""
    refused = addresses.refusal(host, addresses.networks(context.settings.worker_api.allowed_networks))
    return parsed if refused is None else _error(400, f"worker {parsed} is refused: {refused}", "url")


def _entry(context: RouterContext, replica: Replica) -> dict:
    """One worker as SGLang's router lists it (and vllm-router's keys), plus the sources naming it."""
    only_grpc = grpc_only(replica.id)  # a grpc:// worker, as SGLang's gateway registers gRPC engines
    return {"id": worker_id(replica.id), "url": replica.id, "model_id": "unknown", "priority": 50, "cost": 1.0,
            "worker_type": "regular", "is_healthy": replica.id in context.replicas.loads(grpc=only_grpc),
            "load": replica.inflight, "connection_mode": "gRPC" if only_grpc else "HTTP", "metadata": {},
            "disable_health_check": False, "sources": sorted(replica.sources)}


def _add(context: RouterContext, url: str) -> bool:
    """Register ``url`` as an API worker; False if the API had registered it already.

    A new worker takes no traffic until its first probe passes (as SGLang's router polls ``/health`` before
    adding one): an engine still loading its weights must not get the requests. The probe runs at once.
    """
    replica = context.replicas.get(url)
    if replica is not None and API in replica.sources:
        return False
    context.replicas.add(url, None, API, healthy=context.settings.health.probe_interval_seconds is None)
    context.prober.wake()
    return True


def _remove(context: RouterContext, replica: Replica) -> AdminAnswer | None:
    """Drop the API's entry for a replica; a 409 if the API did not add it (static and discovered ones stay)."""
    if API not in replica.sources:
        return _error(409, f"worker {replica.id} comes from the {' and '.join(sorted(replica.sources))} "
                           "replicas, not from the worker API; change that source to remove it", "url")
    context.replicas.remove(replica.id, API)
    return None


def _query_url(query: str, body: bytes) -> object:
    """The ``url`` query parameter, else a JSON body's ``url`` (as slime's own router also accepts); a 400 naming
    what is wrong with either (two URLs, a body that is not JSON or a URL that is not a string), never a guess."""
    values = parse_qs(query).get("url")
    if values:
        return values[0] if len(values) == 1 else _error(400, "give one url, not several", "url")
    try:
        document = jsonbody.parse(body) if body.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return _error(400, f"request body is not valid JSON ({error}); send ?url=http://HOST:PORT or "
                           "{\"url\": \"http://HOST:PORT\"}")
    if not isinstance(document, dict):
        return _error(400, "request body must be a JSON object with the worker's url")
    url = document.get("url")
    if url is not None and not isinstance(url, str):
        return _error(400, f"url must be a string, not {url!r}", "url")
    return url


def add_worker(context: RouterContext, path: str, query: str, body: bytes) -> AdminAnswer:
    """``POST /add_worker?url=U``: 200 text, 400 if it is registered already (as both routers answer)."""
    given = _query_url(query, body)
    url = given if isinstance(given, AdminAnswer) else _valid_url(context, given)
    if isinstance(url, AdminAnswer):
        return url
    if not _add(context, url):
        return _error(400, f"Worker {url} already exists", "url")
    return _text(f"Worker {url} added successfully; probed now, it takes traffic while "
                 f"{url}{context.settings.health.probe_path} answers 200")


def remove_worker(context: RouterContext, path: str, query: str, body: bytes) -> AdminAnswer:
    """``POST /remove_worker?url=U``: 200 text, 400 for a worker this router does not have (SGLang's answer)."""
    given = _query_url(query, body)
    url = given if isinstance(given, AdminAnswer) else _valid_url(context, given, registering=False)
    if isinstance(url, AdminAnswer):
        return url
    replica = context.replicas.get(url)
    if replica is None:
        return _error(400, f"Worker {url} not found", "url")
    return _remove(context, replica) or _text(f"Worker {url} removed successfully")


def list_workers(context: RouterContext, path: str, query: str, body: bytes) -> AdminAnswer:
    """``GET /list_workers``: every live replica's URL, whatever its source."""
    return _json({"urls": [replica.id for replica in context.replicas.replicas()]})


def create_worker(context: RouterContext, path: str, query: str, body: bytes) -> AdminAnswer:
    """``POST /workers`` with ``{"url": U, "worker_type": "regular", ...}``: 202, idempotent (SGLang's router)."""
    try:
        document = jsonbody.parse(body) if body else None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return _error(400, f"request body is not valid JSON ({error}); send {{\"url\": \"http://HOST:PORT\"}}")
    if not isinstance(document, dict):
        return _error(400, "request body must be a JSON object with the worker's url")
    worker_type = document.get("worker_type", "regular")
    if worker_type is None:
        worker_type = "regular"  # SGLang's clients send null for the default
    if worker_type != "regular":
        return _error(400, f"worker_type {worker_type!r} is not supported: this router has no prefill/decode "
                           "disaggregation, only regular workers", "worker_type")
    url = _valid_url(context, document.get("url"))
    if isinstance(url, AdminAnswer):
        return url
    added = _add(context, url)
    ident = worker_id(url)
    return _json({"status": "accepted", "success": True, "worker_id": ident, "url": url,
                  "location": f"{WORKERS_PREFIX}{ident}",
                  "message": f"Worker {url} added" if added else f"Worker {url} was registered already"}, 202)


def workers_document(context: RouterContext, path: str, query: str, body: bytes) -> AdminAnswer:
    """``GET /workers``: every live replica, in SGLang's router's shape."""
    entries = [_entry(context, replica) for replica in context.replicas.replicas()]
    return _json({"workers": entries, "total": len(entries),
                  "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": len(entries)}})


def _find(context: RouterContext, path: str) -> Replica | None:
    """The live replica that ``/workers/{id}`` names, by id or by (percent-encoded) URL."""
    wanted = unquote(path[len(WORKERS_PREFIX):])
    replica = context.replicas.get(wanted.rstrip("/"))
    if replica is not None:
        return replica
    return next((r for r in context.replicas.replicas() if worker_id(r.id) == wanted), None)


def get_worker(context: RouterContext, path: str, query: str, body: bytes) -> AdminAnswer:
    replica = _find(context, path)
    if replica is None:
        return _error(404, f"Worker {unquote(path[len(WORKERS_PREFIX):])} not found", "worker_id")
    return _json({**_entry(context, replica), "job_status": None})  # SGLang's pending add/remove; ours are done


def delete_worker(context: RouterContext, path: str, query: str, body: bytes) -> AdminAnswer:
    """``DELETE /workers/{id}``: 202 at once; the worker gets no new request and drains those in flight."""
    replica = _find(context, path)
    if replica is None:
        return _error(404, f"Worker {unquote(path[len(WORKERS_PREFIX):])} not found", "worker_id")
    refused = _remove(context, replica)
    if refused is not None:
        return refused
    return _json({"status": "accepted", "success": True, "worker_id": worker_id(replica.id), "url": replica.id,
                  "message": f"Worker {replica.id} removed; {replica.inflight} requests in flight drain"}, 202)


def _route(pattern: str, methods: tuple[str, ...], handler: Handler) -> Route:
    return Route(pattern, methods, lambda context, request: handler(context, request.path, request.query, request.body))


ROUTES: list[Route] = [
    _route("/add_worker", ("POST",), add_worker),
    _route("/remove_worker", ("POST",), remove_worker),
    _route("/list_workers", GET, list_workers),
    _route(WORKERS, ("POST",), create_worker),
    _route(WORKERS, GET, workers_document),
    _route(WORKERS_PREFIX + "{id}", GET, get_worker),
    _route(WORKERS_PREFIX + "{id}", ("DELETE",), delete_worker),
]

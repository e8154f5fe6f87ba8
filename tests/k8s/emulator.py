"""A kmock Kubernetes emulator with the gaps that matter to kopf and our tests filled.

kmock 0.8 stores objects as plain dicts. Filled here: server-set metadata
(namespace from the URL, uid, resourceVersion, creationTimestamp, generation
bumped on spec changes), 201 on create, label selectors on list and watch,
the status subresource (status writes only via /status, and /status writes
nothing else), no-op patches that change nothing, JSON patches and removals
(computed here, handed to kmock as a merge; a failed
``test`` op is 422 as kopf expects), server-side apply creating a
missing object, ``/api/v1/namespaces``, watches ending after ``timeoutSeconds``,
and 410 Gone for a watch from a resourceVersion older than the last ``compact()``
(as after etcd compaction). Not filled: garbage collection, strategic merge of
lists (lists are replaced whole), replay of missed events on a watch from a
resourceVersion (every watch starts with ADDED for all objects), admission,
schema validation.

Faults: ``fault`` (a function of the raw request) may answer any request in the
emulator's place, e.g. a 503 or a 409 (``tests/k8s/faults.py``), and
``drop_watches()`` cuts every open watch connection, as an API server restart does.
"""
from __future__ import annotations

import asyncio
import contextvars
import copy
import datetime
import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import dicts, enums

# The request whose reaction kmock is choosing, in the task serving it (see ``Emulator.__iter__``).
_dispatching: contextvars.ContextVar[kmock.Request | None] = contextvars.ContextVar("dispatching", default=None)
_REQUIREMENT = re.compile(r"^\s*(!?)([\w./-]+)\s*(?:(=|==|!=|\s+in\s+|\s+notin\s+)\s*(.*?))?\s*$")


def selector_matches(query: str, labels: dict[str, str] | None) -> bool:
    """The ``labelSelector`` query syntax: ``a=b,c!=d,e in (f,g),h notin (i),j,!k``."""
    labels = labels or {}
    for term in re.split(r",(?![^()]*\))", query or ""):
        if not term.strip():
            continue
        match = _REQUIREMENT.match(term)
        if match is None:
            raise ValueError(f"bad label selector term {term!r}")
        negated, key, op, value = match.groups()
        op = (op or "").strip()
        values = [v.strip() for v in (value or "").strip("()").split(",")]
        ok = {
            "": key not in labels if negated else key in labels,
            "=": labels.get(key) == value, "==": labels.get(key) == value,
            "!=": labels.get(key) != value,
            "in": labels.get(key) in values,
            "notin": labels.get(key) not in values,
        }[op]
        if not ok:
            return False
    return True


def _merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch turning ``old`` into ``new`` (None removes a key)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old or old[key] != value:
            patch[key] = _merge_diff(old.get(key), value)
    return patch


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    _versions: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)
    namespaces: set[str] = attrs.field(factory=lambda: {"default", "kube-system"})
    _compacted: int = attrs.field(default=0, init=False)  # resourceVersions below this are gone
    # Answers a request in the emulator's place when it returns a response (fault injection); None: no fault.
    fault: Callable[[aiohttp.web.BaseRequest], aiohttp.web.StreamResponse | None] | None = None
    _watching: dict[int, aiohttp.web.BaseRequest] = attrs.field(factory=dict, init=False)  # by id: unhashable

    def drop_watches(self) -> None:
        """Cut every open watch connection (call it on the emulator's loop: ``EmulatorServer.drop_watches``)."""
        for request in list(self._watching.values()):
            if request.transport is not None:
                request.transport.close()

    def __iter__(self) -> Iterator[kmock.Request]:
        """The request log; while a request is dispatched, only that request.

        kmock picks a request's reaction by asking each reaction's view whether the
        request is in it, and a view answers by filtering the whole log: every request
        then cost time in proportion to the requests before it, and a module's emulator
        slowed to hundreds of milliseconds a call (a status poll a second adds four).
        Only the request itself can be the one asked about, so in its task the log is it.
        """
        dispatching = _dispatching.get()
        if dispatching is not None:
            yield dispatching
            return
        yield from super().__iter__()

    async def _dispatch(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """kmock's handling of ``request`` (state, then its reaction), with ``__iter__`` narrowed to it."""
        token = _dispatching.set(request)
        try:
            return await super()._handle(request)
        finally:
            _dispatching.reset(token)

    def _has_status(self, resource: Any) -> bool:
        return resource in self.resources and "status" in self.resources[resource].subresources

    def _stamp(self) -> str:
        return str(next(self._versions))

    def _current(self, request: kmock.Request) -> dict | None:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        injected = self.fault(raw_request) if self.fault is not None else None
        if injected is not None:
            return injected
        if raw_request.query.get("watch") not in ("true", "1"):
            return await self._answer(raw_request)
        self._watching[id(raw_request)] = raw_request
        try:
            return await self._answer(raw_request)
        finally:
            self._watching.pop(id(raw_request), None)

    async def _answer(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock's path parser fails on the namespaces collection itself.
        if raw_request.path.rstrip("/") == "/api/v1/namespaces":
            if raw_request.method == "POST":
                body = await raw_request.json()
                self.namespaces.add(body["metadata"]["name"])
                return aiohttp.web.json_response(body, status=201)
            names = {ns for _, ns, _ in self.objects if ns} | self.namespaces
            items = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "resourceVersion": "1"},
                      "status": {"phase": "Active"}} for name in sorted(names)]
            if raw_request.query.get("watch") == "true":  # the existing ones, then silence until the timeout
                response = aiohttp.web.StreamResponse()
                await response.prepare(raw_request)
                for item in items:
                    await response.write(json.dumps({"type": "ADDED", "object": item}).encode() + b"\n")
                await asyncio.sleep(float(raw_request.query.get("timeoutSeconds", 600)))
                return response
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "NamespaceList",
                                              "metadata": {"resourceVersion": self._stamp()}, "items": items})
        return await super().__call__(raw_request)

    def _rewrite(self, old: kmock.Request, new: kmock.Request) -> kmock.Request:
        """kmock routes only requests it has recorded (by identity): record the rewritten one instead."""
        for index in range(len(self._requests) - 1, -1, -1):
            if self._requests[index] is old:
                self._requests[index] = new
                break
        return new

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.action == enums.action.UPDATE:
            request = self._rewrite(request, self._prepare_update(request))
        if request.resource is not None and request.action == enums.action.CREATE:
            request = self._rewrite(request, self._prepare_create(request))
            response = await self._dispatch(request)
            if response.status == 200 and not response.prepared:
                response.set_status(201)
            return response
        return await self._dispatch(request)

    def _prepare_create(self, request: kmock.Request) -> kmock.Request:
        body = copy.deepcopy(request.data) or {}
        meta = body.setdefault("metadata", {})
        meta.update(uid=str(uuid.uuid4()), resourceVersion=self._stamp(), generation=1,
                    creationTimestamp=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        if request.namespace:
            meta["namespace"] = request.namespace
        if self._has_status(request.resource):
            body.pop("status", None)
        return attrs.evolve(request, data=body)

    def _prepare_update(self, request: kmock.Request) -> kmock.Request:
        old = self._current(request)
        content_type = request.headers.get("Content-Type", "")
        if old is None:
            if "apply-patch" in content_type:  # server-side apply creates what is missing
                return attrs.evolve(request, action=enums.action.CREATE, method="POST", name=None)
            return request  # kmock answers 404
        patch = request.data if request.data is not None else {}
        try:
            new = (jsonpatch.apply_patch(old, patch) if isinstance(patch, list)
                   else dicts.merge_patch_dict(old, patch))
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(error)) from None  # as the API does
        new = copy.deepcopy(dict(new))
        if request.subresource == "status":
            new = {**old, "status": new.get("status")}
        elif self._has_status(request.resource):
            new["status"] = old.get("status")
        if new.get("status") is None:
            new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for field in ("uid", "creationTimestamp", "namespace", "name", "generation", "deletionTimestamp"):
            if field in old["metadata"]:
                meta[field] = old["metadata"][field]
        if new == old:  # a no-op: no new version, no watch event
            return attrs.evolve(request, action=enums.action.FETCH, method="GET")
        spec_changed = {k: v for k, v in new.items() if k not in ("metadata", "status")} != \
                       {k: v for k, v in old.items() if k not in ("metadata", "status")}
        if spec_changed:
            meta["generation"] = old["metadata"].get("generation", 1) + 1
        meta["resourceVersion"] = self._stamp()
        return attrs.evolve(request, data=_merge_diff(old, new))

    async def _serve_list(self, request: kmock.Request) -> Any:
        result = await super()._serve_list(request)
        query = request.params.get("labelSelector", "")
        result["items"] = [o for o in result["items"] if selector_matches(query, o.get("metadata", {}).get("labels"))]
        result["metadata"]["resourceVersion"] = self._stamp()
        return result

    def compact(self) -> None:
        """Forget the history so far: a watch from any resourceVersion issued until now gets 410 Gone."""
        self._compacted = int(self._stamp())

    async def _serve_watch(self, request: kmock.Request) -> Any:
        since = request.params.get("resourceVersion", "")
        if since.isdigit() and int(since) < self._compacted:
            yield b""  # the headers, then the API's answer to a compacted version: an ERROR event, end of stream
            yield {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                                               "reason": "Expired", "message": f"too old resource version: {since}"}}
            return
        query = request.params.get("labelSelector", "")
        seconds = request.params.get("timeoutSeconds")
        deadline = asyncio.get_running_loop().time() + float(seconds) if seconds else None
        events = aiter(super()._serve_watch(request))
        while True:
            try:  # the deadline covers the wait for an event only, never the time the caller holds one
                async with asyncio.timeout_at(deadline):
                    event = await anext(events)
            except (StopAsyncIteration, TimeoutError):
                return
            obj = event.get("object", {}) if isinstance(event, dict) else None
            if obj is None or selector_matches(query, obj.get("metadata", {}).get("labels")):
                yield event


class EmulatorServer:
    """The emulator on 127.0.0.1 in its own thread, so sync clients and subprocesses can use it."""

    def __init__(self, emulator: Emulator):
        self.emulator = emulator
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="k8s-emulator", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with self.emulator, kmock.Server(self.emulator) as server:
            self.url = f"http://127.0.0.1:{server.port}"
            self._started.set()
            await self._stop.wait()

    def start(self) -> EmulatorServer:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the Kubernetes emulator did not start")
        return self

    def drop_watches(self) -> None:
        """Cut every open watch connection, from any thread."""
        self._loop.call_soon_threadsafe(self.emulator.drop_watches)

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

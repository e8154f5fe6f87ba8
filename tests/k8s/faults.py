"""Injected API faults for the emulator's ``fault`` hook: what an unlucky operator meets.

Only requests carrying ``token`` (the operator's kubeconfig) are touched, so a
test keeps changing objects while the operator's API calls fail. 409 is injected
on the writes our own code makes (children, deletes, the status subresource),
not on kopf's merge patches of the RolloutRouter itself: a real API server never
answers 409 to a merge patch without a resourceVersion, and kopf does not retry one.
"""
from __future__ import annotations

import collections
import random
import re

from aiohttp import web

ROLLOUTROUTER = re.compile(r"/apis/rolloutrouter\.dev/[^/]+/namespaces/[^/]+/rolloutrouters/[^/]+$")
REASONS = {403: "Forbidden", 409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}


def _ours(request: web.BaseRequest) -> bool:
    """A write by the operator's own code: a child, a delete, or the status subresource."""
    return request.method in ("PATCH", "DELETE", "POST", "PUT") and not ROLLOUTROUTER.search(request.path) \
        and not request.path.endswith("/events")


class Faults:
    """Set ``rate`` (a share of requests answered with an error), ``outage`` (every request 503),
    ``status_conflicts`` (every status patch 409), or ``pods_forbidden`` (listing pods 403, as with RBAC
    that lacks it); ``injected`` counts what was answered.

    Under ``rate`` every fifth write of ours is a 409, so conflicts are always exercised; other
    faults are drawn at random. ``redeleted`` counts DELETEs of a path after one had gone through.
    """

    def __init__(self, token: str = "operator", seed: int = 7):
        self.token = token
        self.rate = 0.0
        self.outage = False
        self.status_conflicts = False
        self.pods_forbidden = False
        self.injected: collections.Counter[int] = collections.Counter()
        self.redeleted: collections.Counter[str] = collections.Counter()
        self._deleted: set[str] = set()
        self._writes = 0
        self._random = random.Random(seed)

    def _choose(self, request: web.BaseRequest) -> int | None:
        if self.outage:
            return 503
        if self.status_conflicts and request.method == "PATCH" and request.path.endswith("/status"):
            return 409
        if self.pods_forbidden and request.method == "GET" and request.path.endswith("/pods"):
            return 403
        if self.rate and _ours(request):
            self._writes += 1
            if self._writes % 5 == 0:
                return 409
        if self.rate and self._random.random() < self.rate:
            return self._random.choice([500, 503, 429])
        return None

    def __call__(self, request: web.BaseRequest) -> web.Response | None:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return None
        status = self._choose(request)
        if status is None:
            if request.method == "DELETE":
                self._note_delete(request.path)
            return None
        self.injected[status] += 1
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status, "reason": REASONS[status],
                "message": f"injected fault: {request.method} {request.path}"}
        return web.json_response(body, status=status, headers={"Retry-After": "1"} if status == 429 else None)

    def _note_delete(self, path: str) -> None:
        if path in self._deleted:
            self.redeleted[path] += 1
        self._deleted.add(path)

"""The public admin port of ``serve --workers N``: the pod seen as one router, answered from its workers.

The parent of the workers (``multicore``) serves it; each request goes on loopback to the workers' own admin
listeners, with the client's ``Authorization`` header (each worker checks the token itself):

- ``/healthz``: answered here, 200 while every worker process runs (the parent ends the pod otherwise);
- ``/readyz``: ready when every worker is;
- ``/status``: the workers' documents summed (counts add; settings, names and lists of names are worker 0's),
  with ``"workers": N``: the operator's status sums stay right, one pod counted once;
- ``/metrics``: every series summed over the workers (a family that is one router's view of the pod, such as a
  replica's health or the fleet's members, is worker 0's);
- changes to the replica set (``/add_worker``, ``/remove_worker``, ``/workers``) go to every worker; the first
  success is the answer;
- ``/fleet/v1/*``: 404; the parent is no member of a fleet, its workers are (each at its own admin port): a router
  that took it for one would count worker 0 twice;
- anything else (the RL routes and ``DELETE /v1/sessions/KEY``, which a worker fans out to its siblings and
  its fleet itself) goes to worker 0.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from .listening import bound_socket
from .proxy.errors import error_body

FORWARD_TIMEOUT = 10.0
ALL_WORKERS_GET = ("/readyz", "/status", "/metrics")
ALL_WORKERS_CHANGE = ("/add_worker", "/remove_worker", "/workers")
FLEET_PREFIX = "/fleet/v1/"  # the routes routers of a fleet call each other on: the workers', not the parent's
# /status keys whose value is one router's view, not a count to add
NOT_SUMMED = frozenset({"affinity_break_margin", "backends_ready", "backends_ready_http", "backends_ready_grpc",
                        "backends_ejected", "fleet_inflight", "ejected_until", "consecutive_failures", "mean",
                        "break_gap_mean", "rl", "peerLoadAgeSeconds", "pushed", "started_at"})
RL_SUMMED = ("queued", "queue", "pinsCleared")  # the rl section's counts of each worker's own
# /metrics families that are one router's view of the pod (settings, replica health, members), not counts to add
NOT_SUMMED_FAMILIES = frozenset({
    "rolloutrouter_affinity_break_margin", "rolloutrouter_backend_grpc_healthy", "rolloutrouter_backend_healthy",
    "rolloutrouter_backends", "rolloutrouter_backends_ejected", "rolloutrouter_backends_ready",
    "rolloutrouter_fleet_members", "rolloutrouter_peer_load_age_seconds", "rolloutrouter_rl_paused",
    "process_start_time_seconds", "process_max_fds"})


class WorkerAdmin:
    """The pod's admin listener over ``urls`` (the workers' loopback admin URLs, worker 0 first)."""

    def __init__(self, urls: Sequence[str], processes: Sequence[subprocess.Popen]):
        self.urls, self.processes = list(urls), processes
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (``::``: every address of both families); returns the port."""
        app = web.Application(client_max_size=1 << 20)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT))
        sock = bound_socket(host, port)
        site = web.SockSite(self._runner, sock)
        await site.start()
        return sock.getsockname()[1]

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        path, method = request.path, request.method
        if path == "/healthz" and method in ("GET", "HEAD"):
            alive = all(p.poll() is None for p in self.processes)
            return web.json_response({"status": "ok" if alive else "a worker exited", "workers": len(self.urls)},
                                     status=200 if alive else 503)
        if path.startswith(FLEET_PREFIX):
            return web.json_response(error_body(404, f"{path}: this admin port is the parent of the pod's workers, "
                                                     "not a fleet member; each worker is one, at the pod's container "
                                                     "port fleet-<i> (docs/fleet.md, 'Several cores')"), status=404)
        every = (path in ALL_WORKERS_GET and method == "GET") or (
            method in ("POST", "DELETE") and path.startswith(ALL_WORKERS_CHANGE))
        body = await request.read()
        answers = await asyncio.gather(*(self._forward(url, request, body) for url in
                                         (self.urls if every else self.urls[:1])))
        failed = next((a for a in answers if a.status >= 300), None)
        if path == "/status" and method == "GET" and failed is None:
            documents = [json.loads(a.body) for a in answers]
            return web.json_response({**summed(documents), **rl_summed(documents), "workers": len(documents)})
        if path == "/metrics" and method == "GET" and failed is None:
            return web.Response(body=summed_metrics([a.text for a in answers]),
                                headers={"Content-Type": answers[0].content_type})
        ok = next((a for a in answers if a.status < 300), None)
        chosen = (ok if path.startswith(ALL_WORKERS_CHANGE) else failed) or answers[0]
        return web.Response(status=chosen.status, body=chosen.body, headers={"Content-Type": chosen.content_type})

    async def _forward(self, url: str, request: web.Request, body: bytes) -> _Answer:
        assert self._client is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        try:
            async with self._client.request(request.method, url + request.path_qs, headers=headers,
                                            data=body) as answer:
                return _Answer(answer.status, await answer.read(),
                               answer.headers.get("Content-Type", "application/json"))
        except (aiohttp.ClientError, TimeoutError) as error:
            message = json.dumps({"error": {"message": f"worker {url} did not answer: {error or 'timeout'}"}})
            return _Answer(503, message.encode(), "application/json")


class _Answer:
    __slots__ = ("status", "body", "content_type")

    def __init__(self, status: int, body: bytes, content_type: str):
        self.status, self.body, self.content_type = status, body, content_type

    @property
    def text(self) -> str:
        return self.body.decode()


def summed(documents: Sequence[Any], key: str = "") -> Any:
    """Several workers' /status (or a part of it) as one: numbers added, dicts by key, equal-length lists item by
    item; anything else, and the ``NOT_SUMMED`` keys, worker 0's. A ``{turns, seconds, mean}`` gets its mean anew."""
    first = documents[0]
    if key in NOT_SUMMED or isinstance(first, bool) or not isinstance(first, int | float | dict | list):
        return first
    if isinstance(first, int | float):
        return sum(d for d in documents if isinstance(d, int | float) and not isinstance(d, bool))
    if isinstance(first, dict):
        if not all(isinstance(d, dict) for d in documents):
            return first
        merged = {k: summed([d.get(k, v) for d in documents], k) for k, v in first.items()}
        if {"turns", "seconds", "mean"} <= merged.keys() and merged["turns"]:
            merged["mean"] = round(merged["seconds"] / merged["turns"], 6)
        return merged
    if all(isinstance(d, list) and len(d) == len(first) for d in documents):
        return [summed(items, key) for items in zip(*documents, strict=True)]
    return first


def rl_summed(documents: Sequence[Any]) -> dict[str, Any]:
    """The ``rl`` section: worker 0's (the pause, the versions and the updates are the fleet's, seen by every
    worker alike), with what each worker counts of its own added: its queue and the pins it cleared."""
    sections = [d.get("rl") for d in documents]
    if not all(isinstance(section, dict) for section in sections):
        return {}
    return {"rl": {**sections[0], **{k: summed([section.get(k, 0) for section in sections], k) for k in RL_SUMMED
                                     if k in sections[0]}}}


def summed_metrics(texts: Sequence[str]) -> bytes:
    """Several workers' Prometheus text as one: each series' samples added (``NOT_SUMMED_FAMILIES``: worker 0's)."""
    families: dict[str, Metric] = {}
    values: dict[tuple[str, str, tuple], float] = {}
    for index, text in enumerate(texts):
        for family in text_string_to_metric_families(text):
            kept = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for sample in family.samples:
                where = (family.name, sample.name, tuple(sorted(sample.labels.items())))
                if where not in values:
                    values[where] = 0.0
                    kept.samples.append(sample)
                if index == 0 or family.name not in NOT_SUMMED_FAMILIES:
                    values[where] += sample.value
    for family in families.values():
        family.samples = [s._replace(value=values[(family.name, s.name, tuple(sorted(s.labels.items())))])
                          for s in family.samples]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed:
    """A collector of families already built."""

    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families

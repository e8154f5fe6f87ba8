"""Active health: probe each replica's HTTP health path (vLLM's ``/health``) in rounds.

A probe is one ``GET`` on a fresh connection; it passes on a 200 response head
and fails on anything else: refused or reset connection, no head within
``probeTimeoutSeconds``, another status, bytes that are not HTTP, an answer a
rollout-router relayed (a router's own traffic port registered as a worker). A failed
probe takes the replica out of rotation until a probe passes (a probe never
ends an ejection early: a replica whose engine hangs can still answer
``/health``). A replica with a gRPC address is also probed over gRPC
(``grpc_probe``), and each protocol's verdict takes the replica out of that
protocol's rotation only; a gRPC-only replica (``grpc://``) is probed over
gRPC alone.

Rounds run on the router's event loop, at most ``CONCURRENCY`` probes at a
time, so 1,000 replicas cost a few hundred small connections per interval.
The replicas are read from the ``ReplicaSet`` at each round: whatever adds a
replica (static list, discovery, registration) has it probed without more.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

from .. import descriptors
from ..replicas import ReplicaSet, grpc_only
from ..settings import HealthSettings
from .grpc_probe import grpc_probe

log = logging.getLogger(__name__)

CONCURRENCY = 64  # probes in flight at once
MAX_HEAD = 64 * 1024  # a health answer's head is a few hundred bytes; more is not a health answer
IDLE_RECHECK = 1.0  # with probing off, how often the settings are looked at again

Failure = tuple[str, str]  # (reason for metrics, detail for the log)
LOCAL = "local"  # a probe the router could not make (no descriptor left): no verdict on the replica


ROUTER_HEADER = b"x-rolloutrouter-replica"  # on every answer a rollout-router relays (proxy.http.wire.routes)


class _Head:
    """httptools callbacks: the status of the final (not 1xx) response head, once it is complete, and whether a
    rollout-router relayed it."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.relayed = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == ROUTER_HEADER:
            self.relayed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status >= 200:
            self.status = status


async def probe(url: str, path: str, timeout: float, context: ssl.SSLContext | None = None) -> Failure | None:
    """Probe ``url`` + ``path`` once: None when it answered 200, else (reason, detail)."""
    parts = urlsplit(url)
    https = parts.scheme == "https"
    host, port = parts.hostname or "localhost", parts.port or (443 if https else 80)
    request = (b"GET %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: rollout-router-probe\r\nConnection: close\r\n\r\n"
               % (parts.path.rstrip("/").encode(), path.encode(), parts.netloc.encode("idna")))
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=(context or ssl.create_default_context()) if https else None)
            try:
                writer.write(request)
                return await _verdict(reader)
            finally:
                writer.transport.abort()
    except TimeoutError:
        return "timeout", f"no answer within {timeout:g} s"
    except OSError as error:
        if descriptors.local_shortage(error):  # the router's own shortage says nothing of the replica
            descriptors.report("probe")
            return LOCAL, str(error)
        return "connection_failed", str(error) or type(error).__name__


async def _verdict(reader: asyncio.StreamReader) -> Failure | None:
    head = _Head()
    seen = 0
    while not head.status:
        data = await reader.read(4096)
        if not data:
            return "closed", "closed the connection before answering"
        seen += len(data)
        try:
            head.parser.feed_data(data)
        except httptools.HttpParserError as error:
            return "invalid_response", f"answered something that is not HTTP ({error})"
        if not head.status and seen > MAX_HEAD:
            return "invalid_response", f"response head exceeds {MAX_HEAD} bytes"
    if head.relayed:  # a router's traffic port (this one's, by a mistake, would send its requests round in a loop)
        return "router", "answered through a rollout-router (X-RolloutRouter-Replica): a router is not a replica"
    return None if head.status == 200 else ("bad_status", f"answered {head.status}")


class Prober:
    """Probes every live replica each ``probeIntervalSeconds``; ``wake`` starts a round now."""

    def __init__(self, replicas: ReplicaSet, settings: Callable[[], HealthSettings],
                 on_failure: Callable[[str, str], None]):
        self._replicas, self._settings, self._on_failure = replicas, settings, on_failure
        self._wake = asyncio.Event()
        self._ssl: ssl.SSLContext | None = None
        self.first_round = asyncio.Event()  # set once every replica known at start was probed (serve's warning)

    def wake(self) -> None:
        """Probe now rather than at the end of the interval (e.g. after replicas were registered)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()  # a wake during the round below starts the next one at once
            settings = self._settings()
            interval = settings.probe_interval_seconds
            if interval is None:
                for replica in self._replicas.replicas():  # probing turned off: nobody stays out for it
                    self._replicas.set_healthy(replica.id, True)
                    self._replicas.set_healthy(replica.id, True, grpc=True)
            else:
                try:
                    await self.round(settings)
                except Exception:  # a bug must not end probing for good: log it, try again next round
                    log.exception("health probe round failed")
            self.first_round.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval or IDLE_RECHECK)

    async def round(self, settings: HealthSettings) -> None:
        """Probe every live replica once per protocol it serves, ``CONCURRENCY`` at a time."""
        live = self._replicas.replicas()
        pending = iter([*((r.id, None) for r in live if not grpc_only(r.id)),
                        *((r.id, r.grpc_target) for r in live if r.grpc_target is not None)])

        async def worker() -> None:
            for replica_id, target in pending:  # one iterator shared by the workers: each probe runs once
                if target is None:
                    self.record(replica_id, await probe(replica_id, settings.probe_path,
                                                        settings.probe_timeout_seconds, self._context()))
                else:
                    self.record(replica_id, await grpc_probe(target, settings.grpc_probe,
                                                             settings.probe_timeout_seconds), grpc=True)

        await asyncio.gather(*(worker() for _ in range(min(CONCURRENCY, len(live) * 2))))

    def record(self, replica_id: str, failure: Failure | None, grpc: bool = False) -> None:
        """Apply one probe's verdict for one protocol; state changes are logged. A probe the router could not
        make (``LOCAL``) leaves the replica as it was."""
        if failure is not None and failure[0] == LOCAL:
            return
        if failure is not None:
            self._on_failure(replica_id, failure[0])
        if self._replicas.set_healthy(replica_id, failure is None, grpc=grpc):
            protocol = "gRPC" if grpc else "HTTP"
            if failure is None:
                log.info("replica %s passed its %s health probe: back in rotation", replica_id, protocol)
            else:
                log.warning("replica %s failed its %s health probe (%s): out of %s rotation", replica_id, protocol,
                            failure[1], protocol)

    def _context(self) -> ssl.SSLContext:
        """One TLS context for every https probe (making one loads the CA store)."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

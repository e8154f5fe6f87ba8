"""Kubernetes pod discovery: keep the replica set equal to the Ready pods a selector matches.

``pod_endpoint`` (pod -> URL or None) and ``PodTracker`` (events -> replica set)
are pure; ``run`` is the list-then-watch loop around them. The API is reached
with aiohttp, using the ``kubernetes`` package only to load credentials
(in-cluster service account, else ``KUBECONFIG``), so the watch is cancellable
and needs no thread.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import ssl
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp

from ..replicas import ReplicaSet
from ..settings import DiscoverySettings
from .selectors import matches, to_query

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCH_SECONDS = 240  # the server ends each watch after this; we re-watch from the last resourceVersion
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0


class Endpoint(NamedTuple):
    url: str
    grpc_target: str | None


def resolve_port(pod: dict, port: int | str | None) -> int | None:
    """A number as is; a name looked up among the pod's container ports."""
    if port is None or isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    for container in pod.get("spec", {}).get("containers", []):
        for candidate in container.get("ports") or []:
            if candidate.get("name") == port:
                return candidate.get("containerPort")
    return None


def is_ready(pod: dict) -> bool:
    """Running, Ready and not terminating: the only pods that may take requests."""
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def pod_endpoint(pod: dict, settings: DiscoverySettings) -> Endpoint | None:
    """The pod's replica entry, or None while it cannot serve (or its port cannot be resolved)."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or not is_ready(pod) or not matches(settings.selector, pod.get("metadata", {}).get("labels")):
        return None
    port = resolve_port(pod, settings.port)
    if port is None:
        log.warning("pod %s has no container port named %r; skipped", pod["metadata"].get("name"), settings.port)
        return None
    host = f"[{ip}]" if ":" in ip else ip
    grpc_port = resolve_port(pod, settings.grpc_port)
    return Endpoint(f"http://{host}:{port}", f"{host}:{grpc_port}" if grpc_port is not None else None)


class PodTracker:
    """Applies pod snapshots and watch events to a ``ReplicaSet``, touching only what changed."""

    def __init__(self, settings: DiscoverySettings, replicas: ReplicaSet):
        self.settings, self.replicas = settings, replicas
        self._pods: dict[str, Endpoint] = {}  # pod name -> endpoint, serving pods only
        # url -> grpc target, as last written to the set. It starts as whatever the set holds (a previous
        # watch's pods, static backends), so the first listing removes what no longer matches.
        self._applied: dict[str, str | None] = {r.id: r.grpc_target for r in replicas.replicas()}

    def reset(self, pods: Iterable[dict]) -> None:
        """A full listing: pods not in it are gone."""
        self._pods = {}
        for pod in pods:
            self._store(pod)
        self._sync()

    def apply(self, event_type: str, pod: dict) -> None:
        if event_type == "DELETED":
            self._pods.pop(pod["metadata"]["name"], None)
        else:
            self._store(pod)
        self._sync()

    def _store(self, pod: dict) -> None:
        name = pod["metadata"]["name"]
        endpoint = pod_endpoint(pod, self.settings)
        if endpoint is None:
            self._pods.pop(name, None)
        else:
            self._pods[name] = endpoint

    def _sync(self) -> None:
        wanted = {e.url: e.grpc_target for e in self._pods.values()}
        for url in self._applied.keys() - wanted.keys():
            self.replicas.remove(url)
            log.info("replica removed: %s", url)
        for url, grpc_target in wanted.items():
            if url not in self._applied or self._applied[url] != grpc_target:
                self.replicas.add(url, grpc_target)
                log.info("replica added: %s", url)
        self._applied = wanted


def resolve_namespace(settings: DiscoverySettings) -> str:
    """The settings' namespace, else POD_NAMESPACE, else the service account's namespace."""
    if settings.namespace:
        return settings.namespace
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    raise RuntimeError("discovery needs a namespace: set discovery.namespace or POD_NAMESPACE")


def load_configuration() -> Any:
    """API credentials: the in-cluster service account, else ``KUBECONFIG`` (or ~/.kube/config).

    KUBECONFIG is read at call time, not when the client was imported (tests set it late).
    """
    from kubernetes import client, config  # heavy; only routers with discovery (and the operator) pay for it

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    return configuration


class ApiError(Exception):
    """The API answered with an error status; ``status`` 410 means the resourceVersion expired."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class PodApi:
    """Just enough of the Kubernetes API for list and watch of pods, on aiohttp."""

    def __init__(self, configuration: Any):
        self._config = configuration
        self.host = configuration.host.rstrip("/")
        self.ssl: ssl.SSLContext | bool = False
        if self.host.startswith("https://"):
            if configuration.verify_ssl:
                self.ssl = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            else:
                self.ssl = ssl.create_default_context()
                self.ssl.check_hostname, self.ssl.verify_mode = False, ssl.CERT_NONE
            if configuration.cert_file:
                self.ssl.load_cert_chain(configuration.cert_file, configuration.key_file)

    @classmethod
    def from_environment(cls) -> PodApi:
        return cls(load_configuration())

    def headers(self) -> dict[str, str]:
        """Re-read each time: in-cluster tokens rotate, and the hook re-reads the file."""
        token = self._config.get_api_key_with_prefix("BearerToken", alias="authorization")
        return {"Authorization": token} if token else {}

    async def list(self, session: aiohttp.ClientSession, namespace: str, selector: str) -> tuple[list[dict], str]:
        url = f"{self.host}/api/v1/namespaces/{namespace}/pods"
        async with session.get(url, params={"labelSelector": selector}, headers=self.headers(), ssl=self.ssl) as response:
            if response.status != 200:
                raise ApiError(response.status, await response.text())
            body = await response.json(content_type=None)
        return body.get("items") or [], body.get("metadata", {}).get("resourceVersion", "")

    async def watch(self, session: aiohttp.ClientSession, namespace: str, selector: str,
                    resource_version: str) -> AsyncIterator[dict]:
        """Watch events until the server ends the stream; ERROR events raise ``ApiError``."""
        url = f"{self.host}/api/v1/namespaces/{namespace}/pods"
        params = {"watch": "true", "labelSelector": selector, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(WATCH_SECONDS)}
        if resource_version:
            params["resourceVersion"] = resource_version
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=WATCH_SECONDS + 30)
        async with session.get(url, params=params, headers=self.headers(), ssl=self.ssl, timeout=timeout) as response:
            if response.status != 200:
                raise ApiError(response.status, await response.text())
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            status = event.get("object") or {}
                            raise ApiError(status.get("code", 500), status.get("message", "watch error"))
                        yield event


async def _connect(settings: DiscoverySettings, api: PodApi | None) -> tuple[PodApi, str]:
    """Credentials and namespace, retried with backoff: a router must not stay blind after a bad start."""
    delay = BACKOFF_MIN
    while True:
        try:
            return api or await asyncio.to_thread(PodApi.from_environment), resolve_namespace(settings)
        except Exception as error:  # noqa: BLE001 - any failure here is logged and retried
            log.error("pod discovery cannot start: %s; retrying in %.1fs", error, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)


async def run(settings: DiscoverySettings, replicas: ReplicaSet, api: PodApi | None = None) -> None:
    """Keep ``replicas`` equal to the serving pods until cancelled; API errors back off and retry.

    Each round lists (a fresh snapshot, so missed events cannot leave stale
    replicas) and then watches from the listing's resourceVersion until the
    server ends the stream.
    """
    api, namespace = await _connect(settings, api)
    selector = to_query(settings.selector)
    tracker = PodTracker(settings, replicas)
    log.info("watching pods in %s matching %r at %s", namespace, selector, api.host)
    loop = asyncio.get_running_loop()
    delay = BACKOFF_MIN
    async with aiohttp.ClientSession() as session:
        while True:
            started = loop.time()
            try:
                pods, resource_version = await api.list(session, namespace, selector)
                tracker.reset(pods)
                async for event in api.watch(session, namespace, selector, resource_version):
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        tracker.apply(event["type"], event["object"])
                problem = None if loop.time() - started > 1 else "watch ended at once"
            except asyncio.CancelledError:
                raise
            except ApiError as error:
                problem = None if error.status == 410 else str(error)  # 410: resourceVersion expired
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as error:
                problem = repr(error)
            if problem is None:
                delay = BACKOFF_MIN
                continue
            log.warning("pod discovery: %s; retrying in %.1fs", problem, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX) * random.uniform(0.8, 1.2)

"""rollout_router.kube, the cluster access shared by discovery and the operator, against the API emulator."""
from __future__ import annotations

import asyncio
import logging
import ssl

import pytest

from rollout_router.kube import credentials, objects, watching
from rollout_router.kube.client import ApiError, Client
from rollout_router.kube.pods import container_port, is_ready
from rollout_router.kube.resources import PODS, UnknownKind, find
from rollout_router.kube.selectors import labels_query, matches, to_query
from rollout_router.kube.watching import Event, Listing, follow
from rollout_router.settings import LabelSelector
from tests.k8s.cluster import Cluster, cluster  # noqa: F401  (fixture)
from tests.k8s.pods import add_pod, delete_pod
from tests.support import wait_for

WATCH_SECONDS = 2  # the emulator ends each watch after this, as a server (or a proxy cutting idle streams) would


@pytest.fixture
async def client(cluster: Cluster, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    async with await Client.connect() as connected:
        yield connected


def requests(cluster: Cluster, selector: str, watch: bool) -> list[dict]:
    """The query parameters of every pod list (or watch) the emulator answered for ``selector``."""
    return [dict(r.params) for r in cluster.emulator
            if r.url.path == f"/api/v1/namespaces/{cluster.namespace}/pods" and r.method == "GET"
            and r.params.get("labelSelector") == selector and (r.params.get("watch") == "true") == watch]


class Follower:
    """Runs ``follow`` in a task and keeps what it yields."""

    def __init__(self, client: Client, namespace: str, selector: str):
        self.changes: list[Listing | Event] = []
        self.task = asyncio.create_task(self._run(client, namespace, selector))

    async def _run(self, client: Client, namespace: str, selector: str) -> None:
        async for change in follow(client, PODS, namespace, selector, timeout_seconds=WATCH_SECONDS):
            self.changes.append(change)

    def listings(self) -> list[Listing]:
        return [c for c in self.changes if isinstance(c, Listing)]

    def names(self, kind: str) -> list[str]:
        return [c.object["metadata"]["name"] for c in self.changes if isinstance(c, Event) and c.type == kind]

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def test_a_dropped_watch_resumes_from_the_last_resource_version(cluster, client):
    if not cluster.emulated:
        pytest.skip("reads the emulator's request log")
    selector = "app=resume"
    await asyncio.to_thread(add_pod, cluster, "r1", {"app": "resume"}, "127.0.0.51")
    follower = Follower(client, cluster.namespace, selector)
    try:
        await wait_for(lambda: "r1" in follower.names("ADDED") + follower.names("MODIFIED"), timeout=10)
        last_seen = follower.changes[-1].object["metadata"]["resourceVersion"]
        await wait_for(lambda: len(requests(cluster, selector, watch=True)) >= 2, timeout=WATCH_SECONDS + 10)
        await asyncio.to_thread(add_pod, cluster, "r2", {"app": "resume"}, "127.0.0.52")
        await wait_for(lambda: "r2" in follower.names("ADDED"), timeout=10)  # the resumed watch delivers
        first, second = requests(cluster, selector, watch=True)[:2]
        assert second["resourceVersion"] == last_seen != first["resourceVersion"]
        assert len(requests(cluster, selector, watch=False)) == 1 and len(follower.listings()) == 1  # no re-list
    finally:
        await follower.stop()


async def test_410_gone_lists_again(cluster, client):
    if not cluster.emulated:
        pytest.skip("needs the emulator's compact(); a real cluster compacts on its own schedule")
    selector = "app=gone"
    for name, ip in (("g1", "127.0.0.53"), ("g2", "127.0.0.54")):
        await asyncio.to_thread(add_pod, cluster, name, {"app": "gone"}, ip)
    follower = Follower(client, cluster.namespace, selector)
    try:
        await wait_for(lambda: len(follower.listings()) == 1, timeout=10)
        await asyncio.to_thread(delete_pod, cluster, "g1")
        await wait_for(lambda: "g1" in follower.names("DELETED"), timeout=10)
        cluster.emulator.compact()  # the last resourceVersion the follower saw is now too old to watch from
        await wait_for(lambda: len(follower.listings()) == 2, timeout=WATCH_SECONDS + 10)
        assert [p["metadata"]["name"] for p in follower.listings()[1].items] == ["g2"]
        assert len(requests(cluster, selector, watch=False)) == 2
    finally:
        await follower.stop()


async def test_a_watch_from_a_compacted_version_raises_410(cluster, client):
    if not cluster.emulated:
        pytest.skip("needs the emulator's compact()")
    _, resource_version = await objects.list_objects(client, PODS, cluster.namespace)
    cluster.emulator.compact()
    with pytest.raises(ApiError) as error:
        async for _ in watching.watch(client, PODS, cluster.namespace, "", resource_version, timeout_seconds=5):
            pass
    assert error.value.status == 410 and not error.value.retryable


async def test_apply_creates_then_updates_and_delete_reports_what_it_did(cluster, client):
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied", "namespace": cluster.namespace},
                "data": {"a": "1"}}
    await objects.apply(client, manifest, "kube-tests")
    await objects.apply(client, {**manifest, "data": {"a": "2"}}, "kube-tests")
    stored = await asyncio.to_thread(cluster.core.read_namespaced_config_map, "applied", cluster.namespace)
    assert stored.data == {"a": "2"}
    assert await objects.delete(client, "v1", "ConfigMap", cluster.namespace, "applied") is True
    assert await objects.delete(client, "v1", "ConfigMap", cluster.namespace, "applied") is False


async def test_plurals_come_from_discovery_custom_resources_included(client):
    assert (await find(client, "apps/v1", "Deployment")).path("ns", "d") == "/apis/apps/v1/namespaces/ns/deployments/d"
    assert (await find(client, "rolloutrouter.dev/v1alpha1", "RolloutRouter")).plural == "rolloutrouters"
    for api_version, kind in (("v1", "NoSuchKind"), ("monitoring.coreos.com/v1", "ServiceMonitor")):  # no CRD
        with pytest.raises(UnknownKind) as error:
            await find(client, api_version, kind)
        assert error.value.status == 404 and error.value.message == f"the API serves no {kind} in {api_version}"


async def test_deleting_a_kind_the_api_does_not_serve_finds_it_gone(client):
    """An optional child whose CRD is not installed (a ServiceMonitor) cannot exist: cleanup passes over it."""
    assert await objects.delete(client, "monitoring.coreos.com/v1", "ServiceMonitor", "ns", "x") is False


async def test_server_side_filtering_matches_the_local_matcher(cluster, client):
    pools = {"s-a": {"app": "sel", "pool": "a"}, "s-b": {"app": "sel", "pool": "b", "canary": "1"}, "s-c": {"app": "sel"}}
    for name, labels in pools.items():
        await asyncio.to_thread(add_pod, cluster, name, labels, None, False)
    for selector in [{"matchLabels": {"app": "sel", "pool": "a"}},
                     {"matchLabels": {"app": "sel"}, "matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]},
                     {"matchLabels": {"app": "sel"}, "matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}]}]:
        parsed = LabelSelector.model_validate(selector)
        items, _ = await objects.list_objects(client, PODS, cluster.namespace, to_query(parsed))
        assert {p["metadata"]["name"] for p in items} == {n for n, labels in pools.items() if matches(parsed, labels)}


@pytest.mark.parametrize("selector, query", [
    ({}, ""),
    ({"matchLabels": {"tier": "b", "app": "vllm"}}, "app=vllm,tier=b"),
    ({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]}, "pool in (a,b)"),
    ({"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]}, "pool notin (a)"),
    ({"matchLabels": {"app": "vllm"}, "matchExpressions": [{"key": "canary", "operator": "Exists"},
                                                          {"key": "legacy", "operator": "DoesNotExist"}]},
     "app=vllm,canary,!legacy"),
])
def test_selector_rendering(selector, query):
    assert to_query(LabelSelector.model_validate(selector)) == query


def test_labels_query_is_sorted_equality_terms():
    assert labels_query({"b": "2", "a": "1"}) == "a=1,b=2" and labels_query({}) == ""


def pod(phase="Running", ready="True", deleting=False, conditions=True) -> dict:
    meta = {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {"name": "p"}
    return {"metadata": meta, "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8001}]}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}] if conditions else []}}


@pytest.mark.parametrize("body, ready", [
    (pod(), True), (pod(ready="False"), False), (pod(phase="Pending"), False), (pod(deleting=True), False),
    (pod(conditions=False), False), ({}, False),
])
def test_readiness(body, ready):
    assert is_ready(body) is ready


@pytest.mark.parametrize("port, number", [(8000, 8000), ("9000", 9000), ("http", 8001), ("grpc", None), (None, None)])
def test_container_ports_by_number_or_name(port, number):
    assert container_port(pod(), port) == number


async def test_credentials_from_kubeconfig(cluster, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    creds = await asyncio.to_thread(credentials.load)
    if cluster.emulated:
        assert creds.server.startswith("http://127.0.0.1:") and creds.ssl_context() is False
        assert creds.authorization() == "Bearer emulator"
    insecure = credentials.Credentials("https://api", None, True, None, None, creds.authorization).ssl_context()
    assert isinstance(insecure, ssl.SSLContext) and insecure.verify_mode == ssl.CERT_NONE


def test_credentials_in_a_pod_read_the_service_account_files_each_call(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("first\n")
    (tmp_path / "ca.crt").write_text("")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    creds = credentials.load(tmp_path)
    assert creds.server == "https://10.96.0.1:443" and creds.ca_path == str(tmp_path / "ca.crt")
    assert creds.authorization() == "Bearer first"
    (tmp_path / "token").write_text("rotated")
    assert creds.authorization() == "Bearer rotated"


def test_credentials_outside_a_pod_without_kubeconfig_say_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(credentials.CredentialsError, match="no usable kubeconfig"):
        credentials.load(tmp_path)  # no token there, and KUBECONFIG names a missing file



async def test_peer_discovery_outside_a_pod_without_a_namespace_keeps_retrying_and_leaks_nothing(
        monkeypatch, caplog, tmp_path):
    """No --peer-namespace, no POD_NAMESPACE, no service account: the peer watch says what to set and tries
    again (a router must not silently run alone), and no client is opened that would leak."""
    from rollout_router.fleet.peerpods import watch_peers
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(watching, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    monkeypatch.setattr(watching, "BACKOFF_MIN", 0.01)
    opened: list[object] = []

    async def connect() -> object:
        opened.append(object())
        return opened[-1]
    monkeypatch.setattr(Client, "connect", connect)
    task = asyncio.create_task(watch_peers("app=router", None, lambda peers: None))

    def attempts() -> list[str]:
        return [r.getMessage() for r in caplog.records if "peer discovery cannot start" in r.getMessage()]
    await wait_for(lambda: len(attempts()) >= 3 or task.done())
    assert not task.done()
    assert "set --peer-namespace or POD_NAMESPACE" in attempts()[0]
    assert opened == []
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_backoff_never_waits_longer_than_its_cap(monkeypatch):
    """The jitter is applied before the cap: at most 30 s, not 30 s * 1.2."""
    from rollout_router.kube import backoff
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)
    monkeypatch.setattr(backoff.asyncio, "sleep", sleep)
    monkeypatch.setattr(backoff.random, "uniform", lambda low, high: high)
    retrying = backoff.Backoff(logging.getLogger("test"), first=1.0)
    for _ in range(8):
        await retrying.wait("down")
    assert max(waited) <= backoff.BACKOFF_MAX and retrying.delay == backoff.BACKOFF_MAX

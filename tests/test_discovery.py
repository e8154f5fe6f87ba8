"""Pod discovery: the pure pieces, then the watch loop against the API (emulated or real)."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollout_router.discovery import kubernetes as discovery
from rollout_router.kube import watching
from rollout_router.kube.client import ApiError
from rollout_router.kube.selectors import matches, to_query
from rollout_router.replicas import ReplicaSet
from rollout_router.settings import DiscoverySettings, LabelSelector
from tests.k8s.cluster import cluster  # noqa: F401  (fixture)
from tests.k8s.emulator import selector_matches
from tests.k8s.pods import add_pod, delete_pod, set_status
from tests.support import wait_for

SELECTORS = [
    {"matchLabels": {"app": "vllm"}},
    {"matchLabels": {"app": "vllm", "pool": "a"}},
    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]},
    {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]},
    {"matchExpressions": [{"key": "canary", "operator": "Exists"}]},
    {"matchLabels": {"app": "vllm"}, "matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}]},
]
LABELS = [{}, {"app": "vllm"}, {"app": "vllm", "pool": "a"}, {"app": "vllm", "pool": "b", "canary": "1"}, {"pool": "c"}]


@pytest.mark.parametrize("selector", SELECTORS)
def test_query_string_and_local_matcher_agree(selector):
    parsed = LabelSelector.model_validate(selector)
    for labels in LABELS:  # the emulator's parser stands in for the API server's
        assert matches(parsed, labels) == selector_matches(to_query(parsed), labels), labels


def pod(name="p1", ip="10.0.0.1", ready=True, phase="Running", labels=None, deleting=False, ports=None) -> dict:
    meta = {"name": name, "labels": {"app": "vllm"} if labels is None else labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta,
            "spec": {"containers": [{"ports": [{"name": n, "containerPort": p} for n, p in (ports or {}).items()]}]},
            "status": {"phase": phase, "podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]}}


SETTINGS = DiscoverySettings(selector={"matchLabels": {"app": "vllm"}}, port=8000)


@pytest.mark.parametrize("body, expected", [
    (pod(), discovery.Endpoint("http://10.0.0.1:8000", None)),
    (pod(ready=False), None),
    (pod(phase="Pending"), None),
    (pod(ip=None), None),
    (pod(deleting=True), None),
    (pod(labels={"app": "other"}), None),
    (pod(ip="fd00::1"), discovery.Endpoint("http://[fd00::1]:8000", None)),
])
def test_pod_endpoint(body, expected):
    assert discovery.pod_endpoint(body, SETTINGS) == expected


def test_named_ports_resolve_per_pod():
    settings = DiscoverySettings(selector={"matchLabels": {"app": "vllm"}}, port="http", grpc_port="grpc")
    assert discovery.pod_endpoint(pod(ports={"http": 8001, "grpc": 50051}), settings) == \
        discovery.Endpoint("http://10.0.0.1:8001", "10.0.0.1:50051")
    assert discovery.pod_endpoint(pod(ports={"metrics": 9000}), settings) is None


@pytest.mark.parametrize("port", [0, 70000, -1, "Http", "a--b", "-http", "http-", "abcdefghijklmnop", "99999", 8000.0,
                                  True])
def test_a_port_that_no_pod_could_serve_is_refused_naming_the_field(port):
    """Out of range, a port would become a URL the data path cannot connect to (every request to it stuck), and a
    name a container port cannot have would never resolve; both are refused when the settings are read."""
    with pytest.raises(ValueError, match=r"(?s)port\n.*a port is a number from 1 to 65535"):
        DiscoverySettings(selector={"matchLabels": {"app": "vllm"}}, port=port, grpc_port=9000)


@pytest.mark.parametrize(("port", "expected"), [(1, 1), (65535, 65535), ("8000", 8000), ("http", "http"),
                                                ("vllm-http2", "vllm-http2"), ("h", "h")])
def test_ports_in_range_and_container_port_names_are_kept(port, expected):
    assert DiscoverySettings(selector={"matchLabels": {"app": "vllm"}}, port=port).port == expected


def test_tracker_follows_pods():
    replicas = ReplicaSet()
    tracker = discovery.PodTracker(SETTINGS, replicas)
    tracker.reset([pod("a", "10.0.0.1"), pod("b", "10.0.0.2", ready=False)])
    assert [r.id for r in replicas.replicas()] == ["http://10.0.0.1:8000"]
    tracker.apply("MODIFIED", pod("b", "10.0.0.2"))
    assert len(replicas) == 2
    lease = replicas.acquire("http://10.0.0.1:8000")
    tracker.apply("MODIFIED", pod("a", "10.0.0.9"))  # new IP: old URL leaves (draining), new one joins
    assert {r.id for r in replicas.replicas()} == {"http://10.0.0.2:8000", "http://10.0.0.9:8000"}
    lease.release()
    tracker.apply("DELETED", pod("b", "10.0.0.2"))
    tracker.apply("MODIFIED", pod("a", "10.0.0.9", deleting=True))
    assert len(replicas) == 0
    tracker.reset([pod("c", "10.0.0.3")])
    assert [r.id for r in replicas.replicas()] == ["http://10.0.0.3:8000"]


def test_a_new_watch_takes_over_the_set_and_drops_what_no_longer_matches():
    """Discovery restarts (selector or port changed, static -> discovery) leave no stale replica."""
    replicas = ReplicaSet()
    replicas.replace([("http://static:8000", None)])
    discovery.PodTracker(SETTINGS, replicas).reset([pod("a", "10.0.0.1"), pod("b", "10.0.0.2")])
    assert {r.id for r in replicas.replicas()} == {"http://10.0.0.1:8000", "http://10.0.0.2:8000"}
    narrower = DiscoverySettings(selector={"matchLabels": {"app": "vllm", "tier": "a"}}, port=9000)
    discovery.PodTracker(narrower, replicas).reset([pod("a", "10.0.0.1", labels={"app": "vllm", "tier": "a"}), pod("b", "10.0.0.2")])
    assert [r.id for r in replicas.replicas()] == ["http://10.0.0.1:9000"]


async def test_discovery_that_cannot_start_keeps_retrying(monkeypatch, caplog):
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(watching, "SERVICE_ACCOUNT_NAMESPACE", Path("/nonexistent/namespace"))
    monkeypatch.setattr(watching, "BACKOFF_MIN", 0.01)
    task = asyncio.create_task(discovery.run(SETTINGS, ReplicaSet(), api=object()))

    def attempts() -> int:
        return sum("pod discovery cannot start" in record.getMessage() for record in caplog.records)
    await wait_for(lambda: attempts() >= 3 or task.done())
    assert not task.done() and attempts() >= 3  # no namespace yet: tried again and again, not dead
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_namespace_resolution(monkeypatch, tmp_path):
    assert discovery.resolve_namespace(SETTINGS.model_copy(update={"namespace": "a"})) == "a"
    monkeypatch.setenv("POD_NAMESPACE", "b")
    assert discovery.resolve_namespace(SETTINGS) == "b"
    monkeypatch.delenv("POD_NAMESPACE")
    monkeypatch.setattr(watching, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "namespace")
    with pytest.raises(RuntimeError):
        discovery.resolve_namespace(SETTINGS)
    (tmp_path / "namespace").write_text("c\n")
    assert discovery.resolve_namespace(SETTINGS) == "c"


async def test_watch_keeps_the_set_live(cluster, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    settings = DiscoverySettings(namespace=cluster.namespace, selector={"matchLabels": {"app": "vllm-d"}}, port="http")
    add_pod(cluster, "d1", {"app": "vllm-d"}, "127.0.0.21", ports={"http": 8000})
    add_pod(cluster, "other", {"app": "else"}, "127.0.0.29", ports={"http": 8000})
    replicas = ReplicaSet()
    task = asyncio.create_task(discovery.run(settings, replicas))

    def urls() -> set[str]:
        return {r.id for r in replicas.replicas()}
    try:
        await wait_for(lambda: urls() == {"http://127.0.0.21:8000"}, timeout=10)
        await asyncio.to_thread(add_pod, cluster, "d2", {"app": "vllm-d"}, "127.0.0.22", True, {"http": 8001})
        await wait_for(lambda: urls() == {"http://127.0.0.21:8000", "http://127.0.0.22:8001"}, timeout=10)
        await asyncio.to_thread(set_status, cluster, "d1", "127.0.0.21", False)
        await wait_for(lambda: urls() == {"http://127.0.0.22:8001"}, timeout=10)
        await asyncio.to_thread(set_status, cluster, "d1", "127.0.0.23", True)
        await wait_for(lambda: urls() == {"http://127.0.0.23:8000", "http://127.0.0.22:8001"}, timeout=10)
        await asyncio.to_thread(delete_pod, cluster, "d2")
        await wait_for(lambda: urls() == {"http://127.0.0.23:8000"}, timeout=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_watch_survives_api_errors():
    """A server that fails, then answers: the loop backs off and recovers, never raises."""
    class Flaky:  # stands in for rollout_router.kube.client.Client
        server, calls = "http://flaky", 0

        async def request(self, method, path, params=None, **_):
            self.calls += 1
            if self.calls < 3:
                raise ApiError(503, "ServiceUnavailable", "unavailable")
            return {"items": [pod("a", "10.0.0.1")], "metadata": {"resourceVersion": "1"}}

        async def stream(self, path, params, read_seconds):
            await asyncio.sleep(3600)
            yield {}

    replicas = ReplicaSet()
    api = Flaky()
    task = asyncio.create_task(discovery.run(SETTINGS.model_copy(update={"namespace": "x"}), replicas, api))
    try:
        await wait_for(lambda: len(replicas) == 1, timeout=10)
        assert api.calls == 3
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

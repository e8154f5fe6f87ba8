"""End to end with real processes: API (emulated, or KUBECONFIG's cluster) + operator + router + fake vLLMs.

The stack is ``tests/k8s/stack.py``: the API server, one operator and three
replica processes shared by the module; a RolloutRouter, replica Pod objects,
router process and metric baseline of its own for every test. Any test runs
alone, in any order; each step waits for its condition with a bounded loop.
"""
from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import kmock
import pytest
from kubernetes.client.exceptions import ApiException

from rollout_router.localfleet import Service, stop
from rollout_router_operator.render import child_refs, token_secret_name
from tests.k8s.cluster import GROUP, PLURAL, VERSION, Cluster, cluster  # noqa: F401  (fixture)
from tests.k8s.pods import set_status
from tests.k8s.resources import SERVICE_MONITOR
from tests.k8s.stack import (
    ROUTER_IMAGE,
    VLLM_IPS,
    Operator,
    Stack,
    default_children,
    fake_replicas,
    get_object,
    loopback_address,
    missing,
    own_stack,
    start_operator,
)
from tests.support import wait_until as wait_for


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """One operator for the module."""
    started = start_operator(cluster, tmp_path_factory.mktemp("operator"))
    try:
        yield started
    finally:
        stop(started.process)


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[Service]]:
    """Three fake vLLM processes, shared: each test puts Pod objects of its own in front of them."""
    with fake_replicas() as services:
        yield services


@pytest.fixture
def stack(cluster: Cluster, operator: Operator, replicas: list[Service], tmp_path: Path) -> Iterator[Stack]:
    """This test's own RolloutRouter, replica pods and metric baseline (and router, once started)."""
    with own_stack(cluster, operator, replicas, tmp_path) as own:
        yield own


def test_children_appear_owned_labelled_and_locked_down(stack: Stack):
    c, name = stack.cluster, stack.name
    uid = stack.create()["metadata"]["uid"]
    deployment = wait_for(lambda: c.apps.read_namespaced_deployment(f"{name}-router", c.namespace), "the Deployment")
    for api_version, kind, child in child_refs(name):
        if (api_version, kind, child) not in default_children(name):  # one replica: no PDB; ClusterIP: one Service
            assert get_object(c, api_version, kind, child) is None  # no networkPolicy or serviceMonitor asked
            continue
        meta = wait_for(lambda: get_object(c, api_version, kind, child), kind)["metadata"]
        assert meta["ownerReferences"][0]["uid"] == uid and meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["app.kubernetes.io/instance"] == name
    role = get_object(c, "rbac.authorization.k8s.io/v1", "Role", f"{name}-router")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = get_object(c, "rbac.authorization.k8s.io/v1", "RoleBinding", f"{name}-router")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{name}-router", "namespace": c.namespace}]
    pod = deployment.spec.template.spec
    container = pod.containers[0]
    assert pod.security_context.run_as_non_root and pod.security_context.seccomp_profile.type == "RuntimeDefault"
    assert container.security_context.read_only_root_filesystem is True
    assert container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]
    assert container.readiness_probe.http_get.path == "/readyz"
    assert container.liveness_probe.http_get.path == "/healthz"
    assert container.image == ROUTER_IMAGE  # the spec names no image: the operator's --router-image (from its env)


def test_router_discovers_the_replicas(stack: Stack):
    stack.create()
    stack.start_router()
    stack.wait_for_discovery()


async def chat(session: aiohttp.ClientSession, url: str, key: str, max_tokens: int = 4) -> dict:
    async with session.post(f"{url}/v1/chat/completions", headers={"X-Session-ID": key}, json={
            "model": "tiny", "messages": [{"role": "user", "content": f"hello from {key}"}],
            "max_tokens": max_tokens}) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def test_traffic_flows_and_status_matches_the_router(stack: Stack):
    stack.start_discovering()
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            for index in range(6):
                await chat(session, stack.router_url, f"s{index}")
    router = stack.status()
    assert router["new_sessions"] == 6 and router["affinity_kept"] == 12 and router["sessions"] == 6
    with pytest.raises(urllib.error.HTTPError) as refused:  # the router wants the token the operator rendered
        urllib.request.urlopen(f"{stack.admin_url}/status", timeout=3)
    assert refused.value.code == 401

    def matches() -> bool:
        status = stack.rr().get("status", {})
        affinity = status.get("affinity", {})
        return (affinity.get("kept") == router["affinity_kept"] and affinity.get("broken") == router["affinity_broken"]
                and affinity.get("newSessions") == 6 and status["backends"]["summary"] == "3/3"
                and status["routers"]["summary"] == "1/1" and affinity.get("unreachable") == [])
    wait_for(matches, "the resource status to show the router's counters (read with the token)")
    assert stack.rr()["status"]["fleet"] == {"forwarded": 0, "handoffs": 0, "ownerUnreachable": 0, "replaced": 0,
                                             "lookups": 0}
    conditions = {c["type"]: c for c in stack.rr()["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True" and conditions["Degraded"]["status"] == "False"


def test_operator_metrics_count_reconciles_polls_and_conditions(stack: Stack):
    stack.start_discovering()
    grown, metric = stack.metric_growth, stack.operator_metric
    assert grown("rolloutrouter_operator_reconciles_total", handler="create", outcome="success") >= 1
    assert grown("rolloutrouter_operator_reconcile_duration_seconds_count", handler="create") >= 1
    wait_for(lambda: grown("rolloutrouter_operator_resources", condition="Ready", status="True") == 1, "Ready=True counted")
    assert grown("rolloutrouter_operator_resources", condition="Degraded", status="False") == 1
    assert grown("rolloutrouter_operator_resources", condition="Degraded", status="True") == 0
    wait_for(lambda: grown("rolloutrouter_operator_status_polls_total", result="ok") >= 1, "a poll of our router")
    polls, last = metric("rolloutrouter_operator_status_polls_total", result="ok"), \
        metric("rolloutrouter_operator_last_status_poll_timestamp_seconds")
    assert polls >= 1 and time.time() - last < 10
    wait_for(lambda: metric("rolloutrouter_operator_status_polls_total", result="ok") > polls, "another poll (1 s interval)")
    assert metric("rolloutrouter_operator_last_status_poll_timestamp_seconds") > last


async def _skewed_request(stack: Stack, session: aiohttp.ClientSession, key: str) -> str:
    """Hold one streaming request on ``key``'s replica, send ``key`` again; return the second one's outcome."""
    before = stack.status()
    async with session.post(f"{stack.router_url}/v1/chat/completions", headers={"X-Session-ID": key}, json={
            "model": "tiny", "messages": [{"role": "user", "content": f"hello from {key}"}],
            "max_tokens": 2000, "stream": True}) as held:
        await held.content.readline()  # the stream started: one request in flight on the pinned replica
        await chat(session, stack.router_url, key)
    after = stack.status()
    return "broken" if after["affinity_broken"] > before["affinity_broken"] else "kept"


async def test_changing_the_margin_changes_behaviour_without_losing_pins(stack: Stack):
    stack.start_discovering()
    async with aiohttp.ClientSession() as session:
        for index in range(6):  # pinned sessions, as traffic before the change leaves them
            await chat(session, stack.router_url, f"s{index}")
        assert await _skewed_request(stack, session, "s0") == "kept"  # margin null: pins never break
        sessions = stack.status()["sessions"]
        stack.cluster.patch_rr(stack.name, {"affinityBreakMargin": 0})
        wait_for(lambda: "affinityBreakMargin: 0" in stack.config_text(), "the ConfigMap to carry the margin")
        stack.sync_config()
        wait_for(lambda: stack.status()["affinity_break_margin"] == 0, "the router to reload")
        assert stack.status()["sessions"] == sessions  # pins survived the reload
        assert await _skewed_request(stack, session, "s1") == "broken"  # margin 0: the skew moves the session
    wait_for(lambda: stack.rr()["status"]["affinity"]["broken"] == stack.status()["affinity_broken"],
             "the broken count in the resource status")
    margin = stack.status()["margin"]
    assert margin["repin_prefill_turns"] == 1 and margin["repin_prefill_tokens"] > 0  # the broken turn's prefill
    wait_for(lambda: stack.rr()["status"]["affinity"].get("repinPrefillTokens") == margin["repin_prefill_tokens"],
             "the re-prefilled tokens in the resource status")
    assert re.fullmatch(r"\d+\.\d{3}s/\d+\.\d{3}s", stack.rr()["status"]["affinity"]["ttfbMovedVsKept"])
    deployment = stack.cluster.apps.read_namespaced_deployment(f"{stack.name}-router", stack.cluster.namespace)
    assert deployment.metadata.generation == 1


async def test_an_unready_pod_stops_receiving_requests(stack: Stack):
    stack.start_discovering()
    gone = stack.replicas[1].url
    set_status(stack.cluster, stack.replica_pod(1), VLLM_IPS[1], ready=False)
    wait_for(lambda: gone not in {b["url"] for b in stack.status()["backends"]}, "the router to drop replica 1")
    served_before = _served_by(stack, gone)
    async with aiohttp.ClientSession() as session:
        for index in range(12):
            await chat(session, stack.router_url, f"s{index % 6}")
    assert _served_by(stack, gone) == served_before
    wait_for(lambda: stack.rr()["status"]["backends"]["summary"] == "2/3", "backends 2/3 in the resource status")


def _served_by(stack: Stack, backend: str) -> float:
    text = stack.admin_get("/metrics").decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("rolloutrouter_requests_total{") and f'backend="{backend}"' in line)


def test_image_and_replicas_roll_and_an_unreachable_router_is_reported(stack: Stack):
    stack.start_discovering()
    c, name = stack.cluster, stack.name
    before = c.apps.read_namespaced_deployment(f"{name}-router", c.namespace)
    c.patch_rr(name, {"router": {"replicas": 2, "image": "example.com/rollout-router:next"}})
    wait_for(lambda: get_object(c, "policy/v1", "PodDisruptionBudget", f"{name}-router"), "the PDB for 2 replicas")
    after = c.apps.read_namespaced_deployment(f"{name}-router", c.namespace)
    assert after.spec.template.spec.containers[0].image == "example.com/rollout-router:next"
    assert after.spec.replicas == 2 and after.metadata.generation > before.metadata.generation
    silent = stack.add_router_pod(1, loopback_address())  # nothing listens there: reported, not fatal

    def reported() -> bool:
        status = stack.rr()["status"]
        degraded = {x["type"]: x for x in status["conditions"]}["Degraded"]
        return (status["affinity"]["unreachable"] == [silent] and degraded["reason"] == "RoutersUnreachable"
                and status["affinity"]["kept"] == stack.status()["affinity_kept"] and status["routers"]["summary"] == "2/2")
    wait_for(reported, "the unreachable router in the status")
    c.core.delete_namespaced_pod(silent, c.namespace, grace_period_seconds=0)
    c.patch_rr(name, {"router": {"replicas": 1}})
    wait_for(lambda: get_object(c, "policy/v1", "PodDisruptionBudget", f"{name}-router") is None, "the PDB to go")
    wait_for(lambda: stack.rr()["status"]["affinity"]["unreachable"] == [], "the router list to recover")


def test_an_exposed_service_moves_the_admin_port_to_a_service_of_its_own_and_back(stack: Stack):
    c, name = stack.cluster, stack.name
    stack.create()
    stack.wait_for_children()

    def ports(service: str) -> list[str] | None:
        body = get_object(c, "v1", "Service", service)
        return None if body is None else [p["name"] for p in body["spec"]["ports"]]
    assert ports(f"{name}-router") == ["http", "admin"] and ports(f"{name}-router-admin") is None
    c.patch_rr(name, {"router": {"service": {"type": "NodePort"}}})
    wait_for(lambda: ports(f"{name}-router-admin") == ["admin"] and ports(f"{name}-router") == ["http"],
             "the admin port on its own ClusterIP Service")
    assert get_object(c, "v1", "Service", f"{name}-router-admin")["spec"]["type"] == "ClusterIP"
    c.patch_rr(name, {"router": {"service": {"type": "ClusterIP"}}})
    wait_for(lambda: ports(f"{name}-router-admin") is None and ports(f"{name}-router") == ["http", "admin"],
             "one Service again")


def test_invalid_spec_gets_its_condition_and_no_children(stack: Stack):
    c, bad = stack.cluster, f"{stack.name}-bad"
    c.custom.create_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "RolloutRouter", "metadata": {"name": bad},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "rollout-router"}}}})

    def degraded() -> dict | None:
        conditions = {c["type"]: c for c in stack.rr(bad).get("status", {}).get("conditions", [])}
        return conditions.get("Degraded") if conditions.get("Degraded", {}).get("status") == "True" else None
    condition = wait_for(degraded, "the Degraded condition")
    assert condition["reason"] == "InvalidSpec" and "spec.selector" in condition["message"]
    # the status timer may write the condition first (it judges the spec too): the create handler's count follows
    wait_for(lambda: stack.metric_growth("rolloutrouter_operator_reconciles_total", handler="create",
                                         outcome="invalid_spec") >= 1, "the create handler counted as invalid_spec")
    wait_for(lambda: stack.metric_growth("rolloutrouter_operator_resources", condition="Degraded", status="True") == 1,
             "the invalid resource counted as Degraded")
    with pytest.raises(ApiException) as error:
        c.apps.read_namespaced_deployment(f"{bad}-router", c.namespace)
    assert error.value.status == 404
    stack.remove(bad)
    wait_for(lambda: stack.metric_growth("rolloutrouter_operator_resources", condition="Degraded", status="True") == 0,
             "the deleted invalid resource to stop counting")


def test_service_monitor_waits_for_its_crd_then_names_the_token_and_goes_when_turned_off(stack: Stack):
    c, name = stack.cluster, stack.name
    if c.emulator is None:
        pytest.skip("adds the Prometheus Operator's kind to the API: emulator only (tests/realk8s installs its CRD)")
    stack.create()
    stack.wait_for_children()
    resource = c.patch_rr(name, {"serviceMonitor": {"enabled": True}})
    generation = resource["metadata"]["generation"]

    def condition(kind: str) -> dict:
        status = stack.rr().get("status", {})
        found = {x["type"]: x for x in status.get("conditions", [])}
        return found.get(kind, {}) if status.get("observedGeneration") == generation else {}
    wait_for(lambda: condition("Degraded").get("status") == "True", "Degraded for the missing kind")
    assert "the API serves no ServiceMonitor in monitoring.coreos.com/v1" in condition("Degraded")["message"]
    assert get_object(c, "monitoring.coreos.com/v1", "ServiceMonitor", f"{name}-router") is None

    c.emulator.resources[f"{SERVICE_MONITOR.api_version}/{SERVICE_MONITOR.plural}"] = kmock.ResourceInfo(
        namespaced=True, kind=SERVICE_MONITOR.kind, singular="servicemonitor",
        verbs={"create", "delete", "get", "list", "patch", "update", "watch"})  # the Prometheus Operator installed
    assert stack.rr()["metadata"]["generation"] == generation
    # no spec change: the operator looks again by itself (every 6 status intervals)
    monitor = wait_for(lambda: get_object(c, "monitoring.coreos.com/v1", "ServiceMonitor", f"{name}-router"),
                       "the ServiceMonitor, once its kind is served")
    wait_for(lambda: condition("Degraded").get("reason") not in (None, "InvalidSpec"), "the condition cleared")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["interval"] == "30s"
    assert endpoint["authorization"]["credentials"] == {"name": token_secret_name(name), "key": "token"}
    assert stack.admin_token()  # the Secret it names exists, holding the routers' token
    service = c.core.read_namespaced_service(f"{name}-router", c.namespace)
    assert service.metadata.labels["rolloutrouter.dev/service-monitor"] == "own"

    stack.reconciled(c.patch_rr(name, {"serviceMonitor": {"enabled": False}}))
    wait_for(lambda: get_object(c, "monitoring.coreos.com/v1", "ServiceMonitor", f"{name}-router") is None,
             "the ServiceMonitor deleted")
    # The Service's label goes too, by server-side apply, which the emulator only approximates with a merge:
    # checked on a real API server (tests/realk8s/test_service_monitor.py).


def test_operator_metrics_saw_the_unreachable_router_the_updates_and_the_removal(stack: Stack):
    stack.reconciled(stack.create())
    grown = stack.metric_growth
    for margin in (0, 1, 2):  # three updates, each reconciled before the next (never folded into one)
        stack.reconciled(stack.cluster.patch_rr(stack.name, {"affinityBreakMargin": margin}))
    stack.add_router_pod(0, loopback_address())  # a Ready router pod that does not answer
    wait_for(lambda: grown("rolloutrouter_operator_status_polls_total", result="unreachable") >= 1,
             "a poll of the unreachable router")
    wait_for(lambda: grown("rolloutrouter_operator_resources", condition="Degraded", status="True") == 1,
             "the resource counted as Degraded")
    stack.remove(stack.name)
    assert grown("rolloutrouter_operator_reconciles_total", handler="update", outcome="success") >= 3
    wait_for(lambda: grown("rolloutrouter_operator_resources", condition="Degraded", status="True") == 0,
             "the deleted resource to stop counting")
    assert grown("rolloutrouter_operator_reconciles_total", handler="delete", outcome="success") >= 1
    assert grown("rolloutrouter_operator_reconciles_total", outcome="error") == 0


def test_deleting_the_resource_removes_the_children(stack: Stack):
    c = stack.cluster
    stack.create()
    stack.wait_for_children()
    wait_for(lambda: grown_resources(stack) > 0, "the resource counted")
    c.custom.delete_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, stack.name)

    wait_for(lambda: all(get_object(c, *ref[:2], ref[2]) is None for ref in child_refs(stack.name)),
             "every child to be deleted")
    wait_for(lambda: missing(c, stack.name), "the resource itself to go (finalizer released)")
    wait_for(lambda: grown_resources(stack) == 0, "the resource no longer counted")


def grown_resources(stack: Stack) -> float:
    """This test's resources as the operator counts them (one per condition each)."""
    return stack.metric_growth("rolloutrouter_operator_resources")

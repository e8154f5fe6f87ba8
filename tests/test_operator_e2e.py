"""End to end with real processes: API (emulated, or KUBECONFIG's cluster) + operator + router + fake vLLMs.

Router pods cannot run here, so the test plays kubelet: it creates a Pod
object with the router's labels and a loopback IP, and starts ``rollout-router
serve`` on that address with the config the operator rendered into the
ConfigMap (re-copied on change, as the kubelet would). The vLLM replicas are
``rollout-router fake-vllm`` processes behind Pod objects.

The API server, one operator and the three replica processes are shared by the
module; everything a test looks at is its own: a RolloutRouter of its own name,
its own replica Pod objects (own labels), its own router process, and operator
metrics read as growth since the test began. Any test runs alone, in any order.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from rollout_router.localfleet import Service, Starting, command, spawn, stop
from rollout_router_operator.kube import _path as kube_path
from rollout_router_operator.render import ROUTER_PORT, child_refs, router_labels
from tests.k8s.cluster import GROUP, PLURAL, VERSION, Cluster, cluster  # noqa: F401  (fixture)
from tests.k8s.pods import add_pod, set_status
from tests.support import wait_until as wait_for

VLLM_IPS = ["127.0.0.31", "127.0.0.32", "127.0.0.33"]
UNSCHEDULABLE = {"rolloutrouter.dev/test": "no-such-node"}  # on a real cluster the Deployment's pods stay Pending
ROUTER_IMAGE = "registry.example.com/mirror/rollout-router:e2e"  # the operator's ROLLOUT_ROUTER_IMAGE
METRICS_PORT = 8080  # the operator's --metrics-port (0 turns metrics off, so it cannot pick one)


def loopback_address() -> str:
    """A random 127.x.y.z: servers that must listen on a fixed port (the router's 8080, as the operator
    polls it) get an address of their own, and one that is taken anyway is retried on another."""
    return f"127.{random.randint(64, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=3) as response:
        return json.load(response)


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(url, timeout=3) as response:
        families = text_string_to_metric_families(response.read().decode())
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in families for sample in family.samples}


def env_for(cluster: Cluster) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "POD_NAMESPACE": cluster.namespace}


@dataclass
class Operator:
    process: subprocess.Popen
    metrics_url: str


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:  # noqa: F811
    """One operator for the module, its metrics on an address of its own (retried while taken)."""
    workdir = tmp_path_factory.mktemp("operator")
    for attempt in range(5):
        host = loopback_address()
        with open(workdir / f"operator-{attempt}.log", "w") as log:
            process = subprocess.Popen(
                command("operator", "--namespace", cluster.namespace, "--status-interval", "1", "--metrics-host", host,
                        "--metrics-port", str(METRICS_PORT)), env={**env_for(cluster), "ROLLOUT_ROUTER_IMAGE": ROUTER_IMAGE},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
        url = f"http://{host}:{METRICS_PORT}/metrics"
        # A taken address fails the operator's start (metrics are bound first); answering while ours runs is ours.
        wait_for(lambda: process.poll() is not None or scrape(url), "the operator's metrics or its exit", 30)
        if process.poll() is None:
            break
    else:
        pytest.fail(f"the operator did not start; see {workdir}")
    try:
        yield Operator(process, url)
    finally:
        stop(process)


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[Service]]:
    """Three fake vLLM processes, shared: each test puts Pod objects of its own in front of them."""
    starting = [spawn(["fake-vllm", "--speed", "10"], ip) for ip in VLLM_IPS]
    try:
        yield [s.bound() for s in starting]
    finally:
        for s in starting:
            stop(s.process)


@dataclass
class Stack:
    """One test's RolloutRouter, its replica pods and (once started) its router process."""

    cluster: Cluster
    operator: Operator
    replicas: list[Service]
    workdir: Path
    name: str = field(default_factory=lambda: f"e2e-{uuid.uuid4().hex[:6]}")
    router: Service | None = None
    router_ip: str = ""
    metrics_before: dict = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        return {"app": f"vllm-{self.name}"}

    @property
    def router_url(self) -> str:
        return f"http://{self.router_ip}:{ROUTER_PORT}"

    def replica_pod(self, index: int) -> str:
        return f"{self.name}-vllm-{index}"

    def replica_url(self, index: int) -> str:
        return self.replicas[index].url

    def create(self) -> dict:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RolloutRouter", "metadata": {"name": self.name},
                "spec": {"selector": {"matchLabels": self.labels}, "backendPort": "http",
                         "router": {"replicas": 1, "nodeSelector": UNSCHEDULABLE}}}
        c = self.cluster
        return c.custom.create_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, body)

    def start_router(self) -> None:
        """Play kubelet for the router pod: its config file, its process on ROUTER_PORT, its Pod object."""
        wait_for(lambda: self.config_text(), "the router ConfigMap")
        self.sync_config()
        for attempt in range(5):
            ip, port_file = loopback_address(), self.workdir / f"router-{attempt}" / "ports.json"
            port_file.parent.mkdir()
            with open(self.workdir / f"router-{attempt}.log", "w") as log:
                process = subprocess.Popen(
                    command("serve", "--config", str(self.workdir / "config.yaml"), "--host", ip,
                            "--port", str(ROUTER_PORT), "--port-file", str(port_file)),
                    env=env_for(self.cluster), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                self.router = Starting(process, ip, port_file).bound()
                self.router_ip = ip
                break
            except RuntimeError:  # the address was taken: another one
                continue
        else:
            pytest.fail(f"no router started; see {self.workdir}")
        add_pod(self.cluster, f"{self.name}-router-0", {**router_labels(self.name), "pod-template-hash": "test"},
                self.router_ip)

    def start_discovering(self) -> None:
        """Create the resource, start its router, wait until the router routes to all three replicas."""
        self.create()
        self.start_router()
        wanted = {self.replica_url(index) for index in range(len(self.replicas))}
        wait_for(lambda: {b["url"] for b in self.status()["backends"]} == wanted, "3 discovered replicas", 30)

    def rr(self, name: str | None = None) -> dict:
        return self.cluster.get_rr(name or self.name)

    def config_text(self) -> str:
        cm = self.cluster.core.read_namespaced_config_map(f"{self.name}-router-config", self.cluster.namespace)
        return cm.data["config.yaml"]

    def sync_config(self) -> None:
        """What the kubelet does for a mounted ConfigMap: replace the file's content."""
        path = self.workdir / "config.yaml"
        text = self.config_text()
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            if self.router is not None:
                self.router.process.send_signal(signal.SIGHUP)

    def status(self) -> dict:
        return get_json(f"{self.router_url}/status")

    def operator_metric(self, name: str, **labels: str) -> float:
        """One sample from the operator's /metrics, summed over the labels not given."""
        return _metric(scrape(self.operator.metrics_url), name, labels)

    def metric_growth(self, name: str, **labels: str) -> float:
        """How much a sample grew since this test began (other tests' earlier counts excluded)."""
        return self.operator_metric(name, **labels) - _metric(self.metrics_before, name, labels)

    def remove(self, name: str) -> None:
        """Delete one of this test's resources and wait until it is gone (its finalizer released)."""
        c = self.cluster
        try:
            c.custom.delete_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, name)
        except ApiException as error:
            if error.status != 404:
                raise
        wait_for(lambda: _missing(c, name), f"{name} to go (finalizer released)")


def _metric(samples: dict[tuple[str, frozenset], float], name: str, labels: dict[str, str]) -> float:
    return sum(value for (sample, sample_labels), value in samples.items()
               if sample == name and labels.items() <= dict(sample_labels).items())


@pytest.fixture
def stack(cluster: Cluster, operator: Operator, replicas: list[Service],  # noqa: F811
          tmp_path: Path) -> Iterator[Stack]:
    """This test's own stack: replica Pod objects under its own labels; torn down whatever happened."""
    s = Stack(cluster, operator, replicas, tmp_path)
    for index, replica in enumerate(replicas):
        port = int(replica.url.rsplit(":", 1)[1])
        add_pod(cluster, s.replica_pod(index), s.labels, VLLM_IPS[index], ports={"http": port})
    s.metrics_before = scrape(operator.metrics_url)
    try:
        yield s
    finally:
        for name in (s.name, f"{s.name}-bad"):  # first, so the operator polls no router that is already gone
            s.remove(name)
        if s.router is not None:
            s.router.stop()
        for pod in cluster.core.list_namespaced_pod(cluster.namespace).items:
            if pod.metadata.name.startswith(f"{s.name}-"):
                cluster.core.delete_namespaced_pod(pod.metadata.name, cluster.namespace, grace_period_seconds=0)


def test_children_appear_owned_labelled_and_locked_down(stack: Stack):
    c, name = stack.cluster, stack.name
    uid = stack.create()["metadata"]["uid"]
    deployment = wait_for(lambda: c.apps.read_namespaced_deployment(f"{name}-router", c.namespace), "the Deployment")
    for api_version, kind, child in child_refs(name):
        if kind == "PodDisruptionBudget":
            assert get_object(c, api_version, kind, child) is None  # one replica: no PDB
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


def get_object(c: Cluster, api_version: str, kind: str, name: str) -> dict | None:
    """Any child kind by apiVersion and kind; None when it does not exist."""
    response = c.api.call_api(*c.api.param_serialize("GET", kube_path(api_version, kind, c.namespace, name),
                                                     auth_settings=["BearerToken"]))
    response.read()
    return json.loads(response.data) if response.status == 200 else None


def test_router_discovers_the_replicas(stack: Stack):
    stack.create()
    stack.start_router()
    wanted = {stack.replica_url(index) for index in range(3)}
    wait_for(lambda: {b["url"] for b in stack.status()["backends"]} == wanted, "3 discovered replicas", 30)


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

    def matches() -> bool:
        status = stack.rr().get("status", {})
        affinity = status.get("affinity", {})
        return (affinity.get("kept") == router["affinity_kept"] and affinity.get("broken") == router["affinity_broken"]
                and affinity.get("newSessions") == 6 and status["backends"]["summary"] == "3/3"
                and status["routers"]["summary"] == "1/1")
    wait_for(matches, "the resource status to show the router's counters")
    conditions = {c["type"]: c for c in stack.rr()["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True" and conditions["Degraded"]["status"] == "False"


def test_operator_metrics_count_reconciles_polls_and_conditions(stack: Stack):
    stack.start_discovering()
    grown = stack.metric_growth
    wait_for(lambda: grown("rolloutrouter_operator_resources", condition="Ready", status="True") == 1, "Ready=True counted")
    assert grown("rolloutrouter_operator_reconciles_total", handler="create", outcome="success") >= 1
    assert grown("rolloutrouter_operator_reconcile_duration_seconds_count", handler="create") >= 1
    assert grown("rolloutrouter_operator_resources", condition="Degraded", status="False") == 1
    assert grown("rolloutrouter_operator_resources", condition="Degraded", status="True") == 0
    metric = stack.operator_metric
    wait_for(lambda: grown("rolloutrouter_operator_status_polls_total", result="ok") >= 1, "a poll of the router")
    polls, last = metric("rolloutrouter_operator_status_polls_total", result="ok"), \
        metric("rolloutrouter_operator_last_status_poll_timestamp_seconds")
    assert time.time() - last < 10
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
    deployment = stack.cluster.apps.read_namespaced_deployment(f"{stack.name}-router", stack.cluster.namespace)
    assert deployment.metadata.generation == 1


async def test_an_unready_pod_stops_receiving_requests(stack: Stack):
    stack.start_discovering()
    gone = stack.replica_url(1)
    set_status(stack.cluster, stack.replica_pod(1), VLLM_IPS[1], ready=False)
    wait_for(lambda: gone not in {b["url"] for b in stack.status()["backends"]}, "the router to drop replica 1")
    served_before = _served_by(stack, gone)
    async with aiohttp.ClientSession() as session:
        for index in range(12):
            await chat(session, stack.router_url, f"s{index % 6}")
    assert _served_by(stack, gone) == served_before
    wait_for(lambda: stack.rr()["status"]["backends"]["summary"] == "2/3", "backends 2/3 in the resource status")


def _served_by(stack: Stack, backend: str) -> float:
    with urllib.request.urlopen(f"{stack.router_url}/metrics", timeout=3) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("rolloutrouter_requests_total{") and f'backend="{backend}"' in line)


def _add_silent_router(stack: Stack) -> str:
    """A second router pod whose /status does not answer (nothing listens on its address); returns its name."""
    name = f"{stack.name}-router-1"
    add_pod(stack.cluster, name, {**router_labels(stack.name), "pod-template-hash": "test"}, loopback_address())
    return name


def test_image_and_replicas_roll_and_an_unreachable_router_is_reported(stack: Stack):
    stack.start_discovering()
    c, name = stack.cluster, stack.name
    before = c.apps.read_namespaced_deployment(f"{name}-router", c.namespace)
    c.patch_rr(name, {"router": {"replicas": 2, "image": "example.com/rollout-router:next"}})
    wait_for(lambda: get_object(c, "policy/v1", "PodDisruptionBudget", f"{name}-router"), "the PDB for 2 replicas")
    after = c.apps.read_namespaced_deployment(f"{name}-router", c.namespace)
    assert after.spec.template.spec.containers[0].image == "example.com/rollout-router:next"
    assert after.spec.replicas == 2 and after.metadata.generation > before.metadata.generation
    silent = _add_silent_router(stack)  # reported, not fatal

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
    assert stack.metric_growth("rolloutrouter_operator_reconciles_total", handler="create", outcome="invalid_spec") >= 1
    wait_for(lambda: stack.metric_growth("rolloutrouter_operator_resources", condition="Degraded", status="True") == 1,
             "the invalid resource counted as Degraded")
    with pytest.raises(ApiException) as error:
        c.apps.read_namespaced_deployment(f"{bad}-router", c.namespace)
    assert error.value.status == 404
    stack.remove(bad)
    wait_for(lambda: stack.metric_growth("rolloutrouter_operator_resources", condition="Degraded", status="True") == 0,
             "the deleted invalid resource to stop counting")


def test_operator_metrics_saw_the_unreachable_router_the_updates_and_the_removal(stack: Stack):
    stack.start_discovering()
    grown = stack.metric_growth
    for margin in (0, 1, 2):  # three updates, each reconciled before the next
        stack.cluster.patch_rr(stack.name, {"affinityBreakMargin": margin})
        wait_for(lambda: f"affinityBreakMargin: {margin}" in stack.config_text(), f"the ConfigMap to carry margin {margin}")
    _add_silent_router(stack)
    wait_for(lambda: grown("rolloutrouter_operator_status_polls_total", result="unreachable") >= 1,
             "a poll of the unreachable router")
    stack.remove(stack.name)
    assert grown("rolloutrouter_operator_reconciles_total", handler="update", outcome="success") >= 3
    assert grown("rolloutrouter_operator_reconciles_total", handler="delete", outcome="success") >= 1
    assert stack.operator_metric("rolloutrouter_operator_reconciles_total", outcome="error") == 0


def test_deleting_the_resource_removes_the_children(stack: Stack):
    stack.start_discovering()
    c, name = stack.cluster, stack.name
    counted = {"condition": "Ready"}  # each resource counts once per condition
    wait_for(lambda: stack.metric_growth("rolloutrouter_operator_resources", **counted) == 1, "the resource counted")
    c.custom.delete_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, name)

    wait_for(lambda: all(get_object(c, *ref[:2], ref[2]) is None for ref in child_refs(name)),
             "every child to be deleted")
    wait_for(lambda: _missing(c, name), "the resource itself to go (finalizer released)")
    wait_for(lambda: stack.metric_growth("rolloutrouter_operator_resources", **counted) == 0,
             "the resource no longer counted")


def _missing(c: Cluster, name: str) -> bool:
    try:
        c.get_rr(name)
    except ApiException as error:
        return error.status == 404
    return False

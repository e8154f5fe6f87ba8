"""End to end with real processes: API (emulated, or KUBECONFIG's cluster) + operator + router + fake vLLMs.

Router pods cannot run here, so the test plays kubelet: it creates a Pod
object with the router's labels and IP 127.0.0.x, and starts
``rollout-router serve`` on that address with the config the operator
rendered into the ConfigMap (re-copied on change, as the kubelet would). The
vLLM replicas are ``rollout-router fake-vllm`` processes behind Pod objects.
Tests run in order and share one stack; each step waits with a bounded loop.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from rollout_router.localfleet import Starting, free_port
from rollout_router_operator.render import child_refs, router_labels
from tests.k8s.cluster import GROUP, PLURAL, VERSION, Cluster, cluster  # noqa: F401  (fixture)
from tests.k8s.pods import add_pod, add_router_pod, set_status
from tests.k8s.resources import object_path as kube_path

SCRIPT = str(Path(sys.executable).with_name("rollout-router"))
NAME, LABELS = "e2e", {"app": "vllm-e2e"}
VLLM_IPS = ["127.0.0.31", "127.0.0.32", "127.0.0.33"]
UNSCHEDULABLE = {"rolloutrouter.dev/test": "no-such-node"}  # on a real cluster the Deployment's pods stay Pending
ROUTER_IMAGE = "registry.example.com/mirror/rollout-router:e2e"  # the operator's ROLLOUT_ROUTER_IMAGE


def wait_for(check: Callable[[], object], what: str, timeout: float = 20.0) -> object:
    """Poll ``check`` until it returns something truthy (exceptions count as not yet)."""
    last: object = None
    for _ in range(int(timeout / 0.1)):
        try:
            last = check()
            if last:
                return last
        except Exception as error:  # noqa: BLE001  (not there yet)
            last = error
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def loopback_address() -> str:
    """A random 127.x.y.z for a server that must listen on a fixed port (the router's 8080, which the
    operator polls): concurrent runs do not meet on it, and one taken anyway is retried on another."""
    return f"127.{random.randint(64, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=3) as response:
        return json.load(response)


@dataclass
class Stack:
    cluster: Cluster
    workdir: Path
    vllm_port: int
    metrics_port: int
    router_ip: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)
    router: subprocess.Popen | None = None

    @property
    def router_url(self) -> str:
        return f"http://{self.router_ip}:8080"

    def spawn(self, *args: str, log: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig), "POD_NAMESPACE": self.cluster.namespace,
               **(env or {})}
        proc = subprocess.Popen([SCRIPT, *args], env=env, stdout=open(self.workdir / log, "w"),
                                stderr=subprocess.STDOUT, cwd=self.workdir)
        self.procs.append(proc)
        return proc

    def rr(self, name: str = NAME) -> dict:
        return self.cluster.get_rr(name)

    def config_text(self) -> str:
        cm = self.cluster.core.read_namespaced_config_map(f"{NAME}-router-config", self.cluster.namespace)
        return cm.data["config.yaml"]

    def sync_config(self) -> None:
        """What the kubelet does for a mounted ConfigMap: replace the file's content."""
        path = self.workdir / "config.yaml"
        text = self.config_text()
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            if self.router is not None:
                self.router.send_signal(signal.SIGHUP)

    @property
    def admin_url(self) -> str:
        return f"http://{self.router_ip}:8081"  # where the operator's poller reads /status (render.ROUTER_ADMIN_PORT)

    def status(self) -> dict:
        return get_json(f"{self.admin_url}/status")

    def operator_metric(self, name: str, **labels: str) -> float:
        """One sample from the operator's /metrics, summed over the labels not given."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=3) as response:
            families = text_string_to_metric_families(response.read().decode())
        return sum(sample.value for family in families for sample in family.samples
                   if sample.name == name and labels.items() <= sample.labels.items())


@pytest.fixture(scope="module")
def stack(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # noqa: F811
    vllm_port = free_port(VLLM_IPS[0])
    s = Stack(cluster, tmp_path_factory.mktemp("e2e"), vllm_port, free_port("127.0.0.1"))
    try:
        for index, ip in enumerate(VLLM_IPS):
            s.spawn("fake-vllm", "--host", ip, "--port", str(vllm_port), "--speed", "10", log=f"vllm-{index}.log")
            add_pod(cluster, f"vllm-{index}", LABELS, ip, ports={"http": vllm_port})
        s.spawn("operator", "--namespace", cluster.namespace, "--status-interval", "1", "--metrics-host", "127.0.0.1",
                "--metrics-port", str(s.metrics_port), log="operator.log", env={"ROLLOUT_ROUTER_IMAGE": ROUTER_IMAGE})
        yield s
    finally:
        for proc in s.procs:
            proc.terminate()
        for proc in s.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_children_appear_owned_labelled_and_locked_down(stack: Stack):
    c = stack.cluster
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RolloutRouter", "metadata": {"name": NAME},
            "spec": {"selector": {"matchLabels": LABELS}, "backendPort": "http",
                     "router": {"replicas": 1, "nodeSelector": UNSCHEDULABLE}}}
    created = c.custom.create_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, body)
    uid = created["metadata"]["uid"]
    deployment = wait_for(lambda: c.apps.read_namespaced_deployment(f"{NAME}-router", c.namespace), "the Deployment")
    for api_version, kind, name in child_refs(NAME):
        if kind in ("PodDisruptionBudget", "NetworkPolicy"):
            assert get_object(c, api_version, kind, name) is None  # one replica: no PDB; no networkPolicy asked
            continue
        meta = wait_for(lambda: get_object(c, api_version, kind, name), kind)["metadata"]
        assert meta["ownerReferences"][0]["uid"] == uid and meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["app.kubernetes.io/instance"] == NAME
    role = get_object(c, "rbac.authorization.k8s.io/v1", "Role", f"{NAME}-router")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = get_object(c, "rbac.authorization.k8s.io/v1", "RoleBinding", f"{NAME}-router")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{NAME}-router", "namespace": c.namespace}]
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
    stack.sync_config()
    for attempt in range(5):  # an address already taken fails the router's start: another one
        ip, port_file = loopback_address(), stack.workdir / f"router-{attempt}" / "ports.json"
        port_file.parent.mkdir()
        router = stack.spawn("serve", "--config", str(stack.workdir / "config.yaml"), "--host", ip, "--port", "8080",
                             "--admin-host", ip, "--admin-port", "8081", "--port-file", str(port_file),
                             log=f"router-{attempt}.log")
        with contextlib.suppress(RuntimeError):
            Starting(router, ip, port_file).bound()
            stack.router, stack.router_ip = router, ip
            break
    assert stack.router is not None, f"no router started; logs in {stack.workdir}"
    add_router_pod(stack.cluster, f"{NAME}-router", f"{NAME}-router-0", {**router_labels(NAME), "pod-template-hash": "test"},
                   stack.router_ip)
    wanted = {f"http://{ip}:{stack.vllm_port}" for ip in VLLM_IPS}
    wait_for(lambda: {b["url"] for b in stack.status()["backends"]} == wanted, "3 discovered replicas", 30)


async def chat(session: aiohttp.ClientSession, url: str, key: str, max_tokens: int = 4) -> dict:
    async with session.post(f"{url}/v1/chat/completions", headers={"X-Session-ID": key}, json={
            "model": "tiny", "messages": [{"role": "user", "content": f"hello from {key}"}],
            "max_tokens": max_tokens}) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def test_traffic_flows_and_status_matches_the_router(stack: Stack):
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
    metric = stack.operator_metric
    assert metric("rolloutrouter_operator_reconciles_total", handler="create", outcome="success") >= 1
    assert metric("rolloutrouter_operator_reconcile_duration_seconds_count", handler="create") >= 1
    wait_for(lambda: metric("rolloutrouter_operator_resources", condition="Ready", status="True") == 1, "Ready=True counted")
    assert metric("rolloutrouter_operator_resources", condition="Degraded", status="False") == 1
    assert metric("rolloutrouter_operator_resources", condition="Degraded", status="True") == 0
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
    async with aiohttp.ClientSession() as session:
        assert await _skewed_request(stack, session, "s0") == "kept"  # margin null: pins never break
        sessions = stack.status()["sessions"]
        stack.cluster.patch_rr(NAME, {"affinityBreakMargin": 0})
        wait_for(lambda: "affinityBreakMargin: 0" in stack.config_text(), "the ConfigMap to carry the margin")
        stack.sync_config()
        wait_for(lambda: stack.status()["affinity_break_margin"] == 0, "the router to reload")
        assert stack.status()["sessions"] == sessions  # pins survived the reload
        assert await _skewed_request(stack, session, "s1") == "broken"  # margin 0: the skew moves the session
    wait_for(lambda: stack.rr()["status"]["affinity"]["broken"] == stack.status()["affinity_broken"],
             "the broken count in the resource status")
    assert stack.cluster.apps.read_namespaced_deployment(f"{NAME}-router", stack.cluster.namespace).metadata.generation == 1


async def test_an_unready_pod_stops_receiving_requests(stack: Stack):
    gone = f"http://{VLLM_IPS[1]}:{stack.vllm_port}"
    set_status(stack.cluster, "vllm-1", VLLM_IPS[1], ready=False)
    wait_for(lambda: gone not in {b["url"] for b in stack.status()["backends"]}, "the router to drop vllm-1")
    served_before = _served_by(stack, gone)
    async with aiohttp.ClientSession() as session:
        for index in range(12):
            await chat(session, stack.router_url, f"s{index % 6}")
    assert _served_by(stack, gone) == served_before
    wait_for(lambda: stack.rr()["status"]["backends"]["summary"] == "2/3", "backends 2/3 in the resource status")


def _served_by(stack: Stack, backend: str) -> float:
    with urllib.request.urlopen(f"{stack.admin_url}/metrics", timeout=3) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("rolloutrouter_requests_total{") and f'backend="{backend}"' in line)


def test_image_and_replicas_roll_and_an_unreachable_router_is_reported(stack: Stack):
    c = stack.cluster
    before = c.apps.read_namespaced_deployment(f"{NAME}-router", c.namespace)
    c.patch_rr(NAME, {"router": {"replicas": 2, "image": "example.com/rollout-router:next"}})
    wait_for(lambda: get_object(c, "policy/v1", "PodDisruptionBudget", f"{NAME}-router"), "the PDB for 2 replicas")
    after = c.apps.read_namespaced_deployment(f"{NAME}-router", c.namespace)
    assert after.spec.template.spec.containers[0].image == "example.com/rollout-router:next"
    assert after.spec.replicas == 2 and after.metadata.generation > before.metadata.generation
    # A second router pod whose /status does not answer: reported, not fatal.
    silent_ip = loopback_address()  # nothing listens there
    add_router_pod(c, f"{NAME}-router", f"{NAME}-router-1", {**router_labels(NAME), "pod-template-hash": "test"}, silent_ip)

    def reported() -> bool:
        status = stack.rr()["status"]
        degraded = {x["type"]: x for x in status["conditions"]}["Degraded"]
        return (status["affinity"]["unreachable"] == [f"{NAME}-router-1"] and degraded["reason"] == "RoutersUnreachable"
                and status["affinity"]["kept"] == stack.status()["affinity_kept"] and status["routers"]["summary"] == "2/2")
    wait_for(reported, "the unreachable router in the status")
    c.core.delete_namespaced_pod(f"{NAME}-router-1", c.namespace, grace_period_seconds=0)
    c.patch_rr(NAME, {"router": {"replicas": 1}})
    wait_for(lambda: get_object(c, "policy/v1", "PodDisruptionBudget", f"{NAME}-router") is None, "the PDB to go")
    wait_for(lambda: stack.rr()["status"]["affinity"]["unreachable"] == [], "the router list to recover")


def test_invalid_spec_gets_its_condition_and_no_children(stack: Stack):
    c = stack.cluster
    c.custom.create_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "RolloutRouter", "metadata": {"name": "bad"},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "rollout-router"}}}})

    def degraded() -> dict | None:
        conditions = {c["type"]: c for c in stack.rr("bad").get("status", {}).get("conditions", [])}
        return conditions.get("Degraded") if conditions.get("Degraded", {}).get("status") == "True" else None
    condition = wait_for(degraded, "the Degraded condition")
    assert condition["reason"] == "InvalidSpec" and "spec.selector" in condition["message"]
    assert stack.operator_metric("rolloutrouter_operator_reconciles_total", handler="create", outcome="invalid_spec") >= 1
    wait_for(lambda: stack.operator_metric("rolloutrouter_operator_resources", condition="Degraded", status="True") == 1,
             "the invalid resource counted as Degraded")
    with pytest.raises(ApiException) as error:
        c.apps.read_namespaced_deployment("bad-router", c.namespace)
    assert error.value.status == 404
    c.custom.delete_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, "bad")


def test_operator_metrics_saw_the_unreachable_router_the_updates_and_the_removal(stack: Stack):
    metric = stack.operator_metric
    assert metric("rolloutrouter_operator_status_polls_total", result="unreachable") >= 1
    assert metric("rolloutrouter_operator_reconciles_total", handler="update", outcome="success") >= 3
    wait_for(lambda: metric("rolloutrouter_operator_resources", condition="Degraded", status="True") == 0,
             "the deleted invalid resource to stop counting")
    assert metric("rolloutrouter_operator_reconciles_total", handler="delete", outcome="success") >= 1
    assert metric("rolloutrouter_operator_reconciles_total", outcome="error") == 0


def test_deleting_the_resource_removes_the_children(stack: Stack):
    c = stack.cluster
    c.custom.delete_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, NAME)

    wait_for(lambda: all(get_object(c, *ref[:2], ref[2]) is None for ref in child_refs(NAME)),
             "every child to be deleted")
    wait_for(lambda: _missing(c, NAME), "the resource itself to go (finalizer released)")
    wait_for(lambda: stack.operator_metric("rolloutrouter_operator_resources") == 0, "no resource counted any more")


def _missing(c: Cluster, name: str) -> bool:
    try:
        c.get_rr(name)
    except ApiException as error:
        return error.status == 404
    return False

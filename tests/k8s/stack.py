"""The operator end-to-end stack (``tests/test_operator_e2e.py``), as real processes.

Router pods cannot run here, so a test plays kubelet: it creates a Pod
object with the router's labels and a loopback IP, and starts ``rollout-router
serve`` on that address with the config the operator rendered into the
ConfigMap (re-copied on change, as the kubelet would) and the admin token it
rendered into the Secret, which the test also sends to the router's admin routes. The vLLM replicas are
``rollout-router fake-vllm`` processes behind Pod objects.

The API server, one operator and the three replica processes are shared by a
module (``start_operator``, ``fake_replicas``); everything a test looks at is its
own (``own_stack``): a RolloutRouter of its own name, its own replica Pod objects
(own labels), its own router process when it needs one, and operator metrics read
as growth since the test began.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from rollout_router.localfleet import Service, Starting, command, spawn, stop
from rollout_router_operator.render import (
    ROUTER_ADMIN_PORT,
    ROUTER_PORT,
    admin_service_name,
    child_refs,
    router_labels,
    token_secret_name,
)
from tests.support import wait_until as wait_for

from .cluster import GROUP, PLURAL, VERSION, Cluster
from .pods import add_pod, add_router_pod
from .resources import object_path as kube_path

VLLM_IPS = ["127.0.0.31", "127.0.0.32", "127.0.0.33"]
UNSCHEDULABLE = {"rolloutrouter.dev/test": "no-such-node"}  # on a real cluster the Deployment's pods stay Pending
ROUTER_IMAGE = "registry.example.com/mirror/rollout-router:e2e"  # the operator's ROLLOUT_ROUTER_IMAGE
METRICS_PORT = 8080  # the operator's --metrics-port (0 turns metrics off, so it cannot pick one)
# rendered for 2+ replicas, for spec.networkPolicy, for spec.serviceMonitor
OPTIONAL_CHILDREN = ("PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor")


def default_children(name: str) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of what a one-replica ClusterIP spec renders: every child but the optional
    kinds and the admin Service of a NodePort or LoadBalancer router."""
    return [ref for ref in child_refs(name) if ref[1] not in OPTIONAL_CHILDREN and ref[2] != admin_service_name(name)]


def loopback_address() -> str:
    """A random 127.x.y.z for a server that must listen on a fixed port (the router's 8080, which the
    operator polls): concurrent runs do not meet on it, and one taken anyway is retried on another."""
    return f"127.{random.randint(64, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def get_json(url: str, token: str | None = None) -> dict:
    return json.loads(get_bytes(url, token))


def get_bytes(url: str, token: str | None = None) -> bytes:
    """GET ``url``, with ``Authorization: Bearer <token>`` when a token is given."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=3) as response:
        return response.read()


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(url, timeout=3) as response:
        families = text_string_to_metric_families(response.read().decode())
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in families for sample in family.samples}


def _metric(samples: dict[tuple[str, frozenset], float], name: str, labels: dict[str, str]) -> float:
    """One sample, summed over the labels not given."""
    return sum(value for (sample, sample_labels), value in samples.items()
               if sample == name and labels.items() <= dict(sample_labels).items())


def env_for(cluster: Cluster) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "POD_NAMESPACE": cluster.namespace}


@dataclass
class Operator:
    process: subprocess.Popen
    metrics_url: str
    workdir: Path  # its log


def start_operator(cluster: Cluster, workdir: Path) -> Operator:
    """The operator, its metrics on an address of its own (another one while taken), its admin token key
    in a file (as the chart mounts it); logs in ``workdir``."""
    key = workdir / "admin-token-key"
    key.write_text(secrets.token_hex(32))
    for attempt in range(5):
        host = loopback_address()
        with open(workdir / f"operator-{attempt}.log", "w") as log:
            process = subprocess.Popen(
                command("operator", "--namespace", cluster.namespace, "--status-interval", "1",
                        "--metrics-host", host, "--metrics-port", str(METRICS_PORT), "--admin-token-key-file", str(key)),
                env={**env_for(cluster), "ROLLOUT_ROUTER_IMAGE": ROUTER_IMAGE},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
        url = f"http://{host}:{METRICS_PORT}/metrics"
        # A taken address fails the operator's start (metrics are bound first); an answer while ours runs is ours.
        wait_for(lambda: process.poll() is not None or scrape(url), "the operator's metrics or its exit", 30)
        if process.poll() is None:
            return Operator(process, url, workdir)
    raise RuntimeError(f"the operator did not start; logs in {workdir}")


@contextlib.contextmanager
def fake_replicas() -> Iterator[list[Service]]:
    """Three fake vLLM processes, one on each of ``VLLM_IPS``; stopped on exit."""
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
    token: str = ""  # the router's admin token, from the Secret the operator rendered
    metrics_before: dict = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        return {"app": f"vllm-{self.name}"}

    @property
    def router_url(self) -> str:
        return f"http://{self.router_ip}:{ROUTER_PORT}"

    @property
    def admin_url(self) -> str:
        """The router's admin listener, where the operator's poller reads /status."""
        return f"http://{self.router_ip}:{ROUTER_ADMIN_PORT}"

    def replica_pod(self, index: int) -> str:
        return f"{self.name}-vllm-{index}"

    def create(self) -> dict:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RolloutRouter", "metadata": {"name": self.name},
                "spec": {"selector": {"matchLabels": self.labels}, "backendPort": "http",
                         "router": {"replicas": 1, "nodeSelector": UNSCHEDULABLE}}}
        c = self.cluster
        return c.custom.create_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, body)

    def reconciled(self, resource: dict) -> None:
        """Wait until the operator has reconciled this version of the resource (and counted the run)."""
        generation = resource["metadata"]["generation"]
        wait_for(lambda: self.rr().get("status", {}).get("observedGeneration") == generation,
                 f"generation {generation} reconciled")

    def wait_for_children(self) -> None:
        """Every child a one-replica spec renders, applied by the operator."""
        for api_version, kind, child in default_children(self.name):
            wait_for(lambda: get_object(self.cluster, api_version, kind, child), kind)

    def add_router_pod(self, index: int, ip: str) -> str:
        """A router pod of our Deployment (as its ReplicaSet would make it) at ``ip``; returns its name."""
        name = f"{self.name}-router-{index}"
        wait_for(lambda: self.cluster.apps.read_namespaced_deployment(f"{self.name}-router", self.cluster.namespace),
                 "the Deployment")
        add_router_pod(self.cluster, f"{self.name}-router", name, {**router_labels(self.name), "pod-template-hash": "test"},
                       ip)
        return name

    def start_router(self) -> None:
        """Play kubelet for the router pod: its config file, its process on ROUTER_PORT, its Pod object."""
        wait_for(self.config_text, "the router ConfigMap")
        self.sync_config()
        self.token = str(wait_for(self.admin_token, "the router's admin token Secret"))
        token_file = self.workdir / "admin-token"
        token_file.write_text(self.token)
        for attempt in range(5):  # an address already taken fails the router's start: another one
            ip, port_file = loopback_address(), self.workdir / f"router-{attempt}" / "ports.json"
            port_file.parent.mkdir()
            with open(self.workdir / f"router-{attempt}.log", "w") as log:
                process = subprocess.Popen(
                    command("serve", "--config", str(self.workdir / "config.yaml"), "--host", ip,
                            "--port", str(ROUTER_PORT), "--admin-host", ip, "--admin-port", str(ROUTER_ADMIN_PORT),
                            "--port-file", str(port_file), "--admin-token-file", str(token_file)),
                    env=env_for(self.cluster), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            with contextlib.suppress(RuntimeError):
                self.router, self.router_ip = Starting(process, ip, port_file).bound(), ip
                break
        assert self.router is not None, f"no router started; logs in {self.workdir}"
        self.add_router_pod(0, self.router_ip)

    def start_discovering(self) -> None:
        """Create the resource (reconciled), start its router, wait until it routes to all three replicas."""
        self.reconciled(self.create())
        self.start_router()
        self.wait_for_discovery()

    def wait_for_discovery(self) -> None:
        wanted = {replica.url for replica in self.replicas}
        wait_for(lambda: {b["url"] for b in self.status()["backends"]} == wanted, "3 discovered replicas", 30)

    def rr(self, name: str | None = None) -> dict:
        return self.cluster.get_rr(name or self.name)

    def admin_token(self) -> str:
        secret = self.cluster.core.read_namespaced_secret(token_secret_name(self.name), self.cluster.namespace)
        return base64.b64decode(secret.data["token"]).decode()

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
        return get_json(f"{self.admin_url}/status", self.token)

    def admin_get(self, path: str) -> bytes:
        """An admin route of the router, with its token."""
        return get_bytes(f"{self.admin_url}{path}", self.token)

    def operator_metric(self, name: str, **labels: str) -> float:
        """One sample from the operator's /metrics, summed over the labels not given."""
        return _metric(scrape(self.operator.metrics_url), name, labels)

    def metric_growth(self, name: str, **labels: str) -> float:
        """How much a sample grew since this test began (other tests' counts excluded)."""
        return self.operator_metric(name, **labels) - _metric(self.metrics_before, name, labels)

    def remove(self, name: str) -> None:
        """Delete one of this test's resources and wait until it is gone (its finalizer released)."""
        c = self.cluster
        with contextlib.suppress(ApiException):  # 404: never created, or already gone
            c.custom.delete_namespaced_custom_object(GROUP, VERSION, c.namespace, PLURAL, name)
        wait_for(lambda: missing(c, name), f"{name} to go (finalizer released)")

    def clean_up(self) -> None:
        """The resources first (so the operator polls no router already stopped), then the router and pods."""
        for name in (self.name, f"{self.name}-bad"):
            self.remove(name)
        if self.router is not None:
            self.router.stop()
        c = self.cluster
        for pod in c.core.list_namespaced_pod(c.namespace).items:
            if pod.metadata.name.startswith(f"{self.name}-"):
                c.core.delete_namespaced_pod(pod.metadata.name, c.namespace, grace_period_seconds=0)
        for rs in c.apps.list_namespaced_replica_set(c.namespace).items:
            if rs.metadata.name.startswith(f"{self.name}-"):  # the emulator collects no garbage
                c.apps.delete_namespaced_replica_set(rs.metadata.name, c.namespace)


def missing(c: Cluster, name: str) -> bool:
    try:
        c.get_rr(name)
    except ApiException as error:
        return error.status == 404
    return False


def get_object(c: Cluster, api_version: str, kind: str, name: str) -> dict | None:
    """Any child kind by apiVersion and kind; None when it does not exist."""
    response = c.api.call_api(*c.api.param_serialize("GET", kube_path(api_version, kind, c.namespace, name),
                                                     auth_settings=["BearerToken"]))
    response.read()
    return json.loads(response.data) if response.status == 200 else None


@contextlib.contextmanager
def own_stack(cluster: Cluster, operator: Operator, replicas: list[Service], workdir: Path) -> Iterator[Stack]:
    """A test's own stack: replica Pod objects under its own labels, its metric baseline; torn down
    whatever happened. No test may make the operator fail a handler: checked after each one."""
    s = Stack(cluster, operator, replicas, workdir)
    for index, replica in enumerate(replicas):
        add_pod(cluster, s.replica_pod(index), s.labels, VLLM_IPS[index], ports={"http": int(replica.url.rsplit(":", 1)[1])})
    s.metrics_before = scrape(operator.metrics_url)
    try:
        yield s
    finally:
        s.clean_up()
    assert s.metric_growth("rolloutrouter_operator_reconciles_total", outcome="error") == 0, \
        f"the operator failed a handler; log in {operator.workdir}"

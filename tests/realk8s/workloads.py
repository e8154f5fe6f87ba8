"""What the README's user puts in the cluster, and how the tests talk to it."""
from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any

import openai

from .cluster import Cluster, eventually

VLLM_LABELS = {"app": "vllm"}  # the selector of docs/examples/rolloutrouter.yaml
ROUTER_SELECTOR = "app.kubernetes.io/instance=rollouts,app.kubernetes.io/component=router"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
# The admin token of each namespace's routers (the operator's Secret rollouts-router-admin-token), read once by
# deploy_rollouts: the routers want it on /status. Namespaces are unique per test.
ADMIN_TOKENS: dict[str, str] = {}


def vllm_deployment(replicas: int) -> dict:
    """A vLLM Deployment as one would write it (the node agent runs the fake replica for the image)."""
    container = {
        "name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
        "args": ["--model", MODEL, "--served-model-name", MODEL, "--port", "8000"],
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1,
                           "timeoutSeconds": 1, "failureThreshold": 2},
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "vllm", "labels": VLLM_LABELS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": VLLM_LABELS},
                     "template": {"metadata": {"labels": VLLM_LABELS}, "spec": {"containers": [container]}}}}


def deploy_rollouts(cluster: Cluster, namespace: str, vllm_replicas: int = 3, routers: int = 1) -> dict:
    """vLLM fleet + ``kubectl apply -f docs/examples/rolloutrouter.yaml`` (with ``router.replicas`` when
    ``routers`` > 1); returns the first ready router pod once every router sees every replica."""
    vllm_fleet(cluster, namespace, vllm_replicas)
    cluster.kubectl("apply", "-n", namespace, "-f", "docs/examples/rolloutrouter.yaml")
    if routers != 1:
        cluster.kubectl("patch", "rr", "rollouts", "-n", namespace, "--type=merge",
                        "-p", json.dumps({"spec": {"router": {"replicas": routers}}}))
    return routers_serving(cluster, namespace, vllm_replicas, routers)[0]


def vllm_fleet(cluster: Cluster, namespace: str, replicas: int) -> None:
    """The vLLM Deployment the example RolloutRouter selects, its pods Ready."""
    cluster.apply(vllm_deployment(replicas), namespace)
    cluster.wait_ready_pods(namespace, "app=vllm", replicas)


def routers_serving(cluster: Cluster, namespace: str, vllm_replicas: int, routers: int = 1) -> list[dict]:
    """The example RolloutRouter's router pods, once ready and each seeing every vLLM replica (the admin token,
    which /status wants, read from the operator's Secret first)."""
    ADMIN_TOKENS[namespace] = admin_token(cluster, namespace)
    pods = cluster.wait_ready_pods(namespace, ROUTER_SELECTOR, routers, timeout=180)
    for pod in pods:
        eventually(lambda pod=pod: router_status(pod)["backends_ready"] == vllm_replicas, 60,
                   f"router {pod['metadata']['name']} sees {vllm_replicas} ready backends")
    return pods


def admin_token(cluster: Cluster, namespace: str) -> str:
    """The routers' admin token, from the Secret the operator writes (read as the cluster admin)."""
    secret = eventually(lambda: cluster.get("secret", "rollouts-router-admin-token", "-n", namespace), 60,
                        "the routers' admin token Secret")
    return base64.b64decode(secret["data"]["token"]).decode()


def router_url(pod: dict) -> str:
    """The router pod's traffic port (forwarding, /healthz and /readyz only)."""
    return f"http://{pod['status']['podIP']}:8080"


def router_admin_url(pod: dict) -> str:
    """The router pod's admin listener (/status, /metrics, session deletion), as the operator's poller reads it."""
    return f"http://{pod['status']['podIP']}:8081"


def router_status(pod: dict) -> dict[str, Any]:
    """The router's ``/status`` from its admin listener, with the admin token when its routers want one."""
    token = ADMIN_TOKENS.get(pod["metadata"]["namespace"])
    request = urllib.request.Request(f"{router_admin_url(pod)}/status",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def chat(pod: dict, session: str, turns: int) -> list[str]:
    """``turns`` turns of one conversation through the router with the openai client; the replicas used."""
    client = openai.OpenAI(base_url=f"{router_url(pod)}/v1", api_key="unused", max_retries=0, timeout=30)
    messages: list[dict] = []
    replicas = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"turn {turn} of {session}"})
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=8, extra_headers={"X-Session-ID": session})
        completion = raw.parse()
        messages.append({"role": "assistant", "content": completion.choices[0].message.content})
        replicas.append(raw.headers["x-rolloutrouter-replica"])
    return replicas


def rr_table(cluster: Cluster, namespace: str) -> dict[str, str]:
    """``kubectl get rr`` as the user sees it, parsed into column -> value for the one resource."""
    lines = cluster.kubectl("get", "rr", "-n", namespace).stdout.splitlines()
    header, row = lines[0].split(), lines[1].split()
    return dict(zip(header, row, strict=True))

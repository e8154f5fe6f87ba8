"""What the README's user puts in the cluster, and how the tests talk to it."""
from __future__ import annotations

import json
import urllib.request
from typing import Any

import openai

from .cluster import Cluster, eventually

VLLM_LABELS = {"app": "vllm"}  # the selector of docs/examples/rolloutrouter.yaml
ROUTER_SELECTOR = "app.kubernetes.io/instance=rollouts,app.kubernetes.io/component=router"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


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


def deploy_rollouts(cluster: Cluster, namespace: str, vllm_replicas: int = 3) -> dict:
    """vLLM fleet + ``kubectl apply -f docs/examples/rolloutrouter.yaml``; returns the ready router pod."""
    cluster.apply(vllm_deployment(vllm_replicas), namespace)
    cluster.wait_ready_pods(namespace, "app=vllm", vllm_replicas)
    cluster.kubectl("apply", "-n", namespace, "-f", "docs/examples/rolloutrouter.yaml")
    router = cluster.wait_ready_pods(namespace, ROUTER_SELECTOR, 1, timeout=180)[0]
    eventually(lambda: router_status(router)["backends_ready"] == vllm_replicas, 60,
               f"router sees {vllm_replicas} ready backends")
    return router


def router_url(pod: dict) -> str:
    """The router pod's traffic port (forwarding, /healthz and /readyz only)."""
    return f"http://{pod['status']['podIP']}:8080"


def router_admin_url(pod: dict) -> str:
    """The router pod's admin listener (/status, /metrics, session deletion), as the operator's poller reads it."""
    return f"http://{pod['status']['podIP']}:8081"


def router_status(pod: dict) -> dict[str, Any]:
    with urllib.request.urlopen(f"{router_admin_url(pod)}/status", timeout=5) as response:
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

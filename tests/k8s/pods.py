"""Pod objects standing in for real pods: a process on 127.0.0.x plays the container.

Pods are created, then their status is written through the status subresource,
as a kubelet would. A scheduling gate keeps them off every node, so on a real
cluster neither the scheduler, a kubelet nor the pod GC touches them.
"""
from __future__ import annotations

from .cluster import Cluster


def pod_manifest(name: str, labels: dict[str, str], ports: dict[str, int] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"schedulingGates": [{"name": "rolloutrouter.dev/test-stand-in"}], "containers": [{
                "name": "main", "image": "example.invalid/none",
                "ports": [{"name": n, "containerPort": p} for n, p in (ports or {}).items()]}]}}


def set_status(cluster: Cluster, name: str, ip: str | None, ready: bool) -> None:
    status = {"phase": "Running" if ip else "Pending", "podIP": ip,
              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    cluster.core.patch_namespaced_pod_status(name, cluster.namespace, {"status": status})


def add_pod(cluster: Cluster, name: str, labels: dict[str, str], ip: str | None, ready: bool = True,
            ports: dict[str, int] | None = None) -> None:
    cluster.core.create_namespaced_pod(cluster.namespace, pod_manifest(name, labels, ports))
    set_status(cluster, name, ip, ready)


def delete_pod(cluster: Cluster, name: str) -> None:
    cluster.core.delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=0)

"""Pod objects standing in for real pods: a process on 127.0.0.x plays the container.

Pods are created, then their status is written through the status subresource,
as a kubelet would. A scheduling gate keeps them off every node, so on a real
cluster neither the scheduler, a kubelet nor the pod GC touches them.
"""
from __future__ import annotations

from kubernetes.client.exceptions import ApiException

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
            ports: dict[str, int] | None = None, owner: dict | None = None) -> None:
    manifest = pod_manifest(name, labels, ports)
    if owner is not None:
        manifest["metadata"]["ownerReferences"] = [owner]
    cluster.core.create_namespaced_pod(cluster.namespace, manifest)
    set_status(cluster, name, ip, ready)


def controller_ref(obj: object) -> dict:
    """A controller owner reference to ``obj`` (a kubernetes client model)."""
    return {"apiVersion": obj.api_version, "kind": obj.kind, "name": obj.metadata.name, "uid": obj.metadata.uid,
            "controller": True}


def add_router_pod(cluster: Cluster, deployment: str, name: str, labels: dict[str, str], ip: str) -> None:
    """A router pod as the Deployment controller makes it: owned by a ReplicaSet that ``deployment`` owns
    (the operator counts no other). The emulator runs no controllers, so the ReplicaSet is made here."""
    owner = cluster.apps.read_namespaced_deployment(deployment, cluster.namespace)
    rs_name = f"{deployment}-{labels.get('pod-template-hash', 'test')}"
    try:
        rs = cluster.apps.read_namespaced_replica_set(rs_name, cluster.namespace)
    except ApiException as error:
        if error.status != 404:
            raise
        rs = cluster.apps.create_namespaced_replica_set(cluster.namespace, {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": rs_name, "labels": labels, "ownerReferences": [controller_ref(owner)]},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels}, "spec": pod_manifest(name, labels)["spec"]}}})
    rs.api_version, rs.kind = "apps/v1", "ReplicaSet"
    add_pod(cluster, name, labels, ip, owner=controller_ref(rs))


def delete_pod(cluster: Cluster, name: str) -> None:
    cluster.core.delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=0)

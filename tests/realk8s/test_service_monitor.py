"""spec.serviceMonitor on a real API server: without the Prometheus Operator's CRD the resource says so; once the
CRD is installed the operator writes, by itself, a ServiceMonitor whose credential scrapes the routers' /metrics as
Prometheus would; the chart's admission policy holds the operator to that one credential; turning it off removes it
by server-side apply, and a user's own ServiceMonitor of that name is left alone.

The CRD is a stand-in for the Prometheus Operator's (same group, kind and plural; its schema keeps every field):
what is checked is what the operator writes and what the routers accept, not the Prometheus Operator itself.
"""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from .cluster import eventually
from .test_helm_and_rbac import operator_flags
from .workloads import deploy_rollouts, router_admin_url

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(600)]
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "ServiceMonitor", "listKind": "ServiceMonitorList", "plural": "servicemonitors",
                       "singular": "servicemonitor"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}
OWN = "rolloutrouter.dev/service-monitor"


def scrape(pod: dict, token: str | None) -> tuple[int, str]:
    """GET /metrics on the router pod's admin port, as Prometheus does, with the ServiceMonitor's token or none."""
    request = urllib.request.Request(f"{router_admin_url(pod)}/metrics",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def degraded(cluster, namespace: str, generation: int, status: str) -> dict | None:
    """The Degraded condition once the operator has reconciled ``generation`` and it has ``status``."""
    written = cluster.get("rr", "rollouts", "-n", namespace).get("status") or {}
    if written.get("observedGeneration") != generation:
        return None
    return next((c for c in written.get("conditions", []) if c["type"] == "Degraded" and c["status"] == status), None)


def patch_monitor(cluster, namespace: str, monitor: dict) -> int:
    """Set spec.serviceMonitor; the new generation."""
    patched = cluster.kubectl("patch", "rr", "rollouts", "-n", namespace, "--type=merge", "-o", "json",
                              "-p", json.dumps({"spec": {"serviceMonitor": monitor}})).stdout
    return json.loads(patched)["metadata"]["generation"]


def test_service_monitor_waits_for_its_crd_then_scrapes_with_the_routers_token(cluster, operator_release, namespace):
    router = deploy_rollouts(cluster, namespace)
    generation = patch_monitor(cluster, namespace, {"enabled": True})
    condition = eventually(lambda: degraded(cluster, namespace, generation, "True"), 60,
                           "Degraded for the missing ServiceMonitor kind")
    assert "the API serves no ServiceMonitor in monitoring.coreos.com/v1" in condition["message"]

    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(CRD))
    try:
        cluster.kubectl("wait", "--for=condition=Established", "crd/servicemonitors.monitoring.coreos.com",
                        "--timeout=60s")
        # no spec change: the operator looks for the kind again by itself (6 status intervals: 12 s here)
        eventually(lambda: cluster.get("servicemonitors", "-n", namespace)["items"], 90, "the ServiceMonitor")
        eventually(lambda: degraded(cluster, namespace, generation, "False"), 60, "Degraded cleared")
        generation = patch_monitor(cluster, namespace, {"enabled": True, "labels": {"release": "prometheus"}})
        monitor = eventually(lambda: [m for m in cluster.get("servicemonitors", "-n", namespace)["items"]
                                      if m["metadata"]["labels"].get("release") == "prometheus"], 60,
                             "the ServiceMonitor with the labels Prometheus selects")[0]
        assert monitor["metadata"]["name"] == "rollouts-router"

        # What Prometheus does with it: the Service it selects, that Service's port, the Secret it names.
        service = cluster.get("service", "rollouts-router", "-n", namespace)
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert service["metadata"]["labels"][OWN] == "own"  # the chart's ServiceMonitor leaves it alone
        (endpoint,) = monitor["spec"]["endpoints"]
        (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        assert port["port"] == 8081 and endpoint["path"] == "/metrics"
        credentials = endpoint["authorization"]["credentials"]
        secret = cluster.get("secret", credentials["name"], "-n", namespace)
        token = base64.b64decode(secret["data"][credentials["key"]]).decode()
        code, body = scrape(router, token)
        assert code == 200 and "rolloutrouter_affinity_kept_total" in body
        assert scrape(router, None)[0] == 401  # the reason the chart's one ServiceMonitor could not scrape it

        # The admission policy: the operator may write a ServiceMonitor naming only its routers' token.
        as_operator = operator_flags(cluster, operator_release, namespace)
        for name, change in [("rollouts-router", {"authorization": {"type": "Bearer", "credentials": {
                                 "name": "someone-elses", "key": "token"}}}),
                             ("rollouts-router", {"bearerTokenFile": "/var/run/secrets/kubernetes.io/"
                                                                     "serviceaccount/token"}),  # Prometheus' own
                             ("rollouts", {"authorization": {"type": "Bearer", "credentials": {
                                 "name": "rollouts-admin-token", "key": "token"}}})]:  # named for a Secret, not routers
            stolen = {**monitor, "metadata": {"name": name, "labels": monitor["metadata"]["labels"]},
                      "spec": {**monitor["spec"], "endpoints": [{**endpoint, **change}]}}
            refused = cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=intruder",
                                      "-f", "-", *as_operator, stdin=json.dumps(stolen), check=False)
            assert refused.returncode != 0, change
            assert "may only write ServiceMonitors whose one credential is their routers' admin token" in refused.stderr

        patch_monitor(cluster, namespace, {"enabled": False})
        eventually(lambda: not cluster.get("servicemonitors", "-n", namespace)["items"], 60, "the ServiceMonitor gone")
        eventually(lambda: OWN not in cluster.get("service", "rollouts-router", "-n", namespace)["metadata"]["labels"],
                   60, "the Service's label removed by server-side apply")

        # A user's own ServiceMonitor of that name: the operator's deletion is refused (not its object) and passed
        # over, the resource stays healthy, the user's object stays.
        mine = {**monitor, "metadata": {"name": "rollouts-router", "labels": {"team": "rl"}}}
        cluster.apply(mine, namespace)
        generation = cluster.get("rr", "rollouts", "-n", namespace)["metadata"]["generation"]
        cluster.kubectl("patch", "rr", "rollouts", "-n", namespace, "--type=merge", "-p",
                        json.dumps({"spec": {"affinityBreakMargin": 3}}))  # a reconcile, which deletes the unrendered
        eventually(lambda: degraded(cluster, namespace, generation + 1, "False"), 60, "the reconcile done, healthy")
        assert cluster.get("servicemonitor", "rollouts-router", "-n", namespace)["metadata"]["labels"] == {"team": "rl"}
    finally:
        cluster.kubectl("delete", "crd", "servicemonitors.monitoring.coreos.com", "--wait=false", check=False)

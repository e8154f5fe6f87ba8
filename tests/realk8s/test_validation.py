"""Invalid RolloutRouters: what the API server itself rejects, and what only the operator can judge.

The CRD's schema and CEL rules are evaluated by the real kube-apiserver: ``kubectl apply`` fails
with a message naming the field. A spec the schema accepts but that cannot work (here: gRPC on the
HTTP port, a selector matching the router's own pods) gets ``Degraded=True`` with reason
``InvalidSpec`` from the operator, and no children.
"""
from __future__ import annotations

import json

import pytest

from .cluster import eventually

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(300)]


def rollouts(spec: dict) -> str:
    return json.dumps({"apiVersion": "rolloutrouter.dev/v1alpha1", "kind": "RolloutRouter",
                       "metadata": {"name": "rollouts"}, "spec": spec})


@pytest.mark.parametrize(("spec", "expected"), [
    ({"selector": {"matchLabels": {"app": "vllm"}}, "affinityBreakMargin": -1},
     "spec.affinityBreakMargin: Invalid value: -1: spec.affinityBreakMargin in body should be greater than or equal to 0"),
    ({"selector": {"matchLabels": {"app": "vllm"}}, "policy": "sticky"},
     'spec.policy: Unsupported value: "sticky"'),
    ({"selector": {}}, "spec.selector: Invalid value: \"object\": selector must have matchLabels or matchExpressions"),
    ({"selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}},
     "In and NotIn need values"),
    ({"selector": {"matchLabels": {"app": "vllm"}},
      "networkPolicy": {"enabled": True, "clients": [{"podSelector": {"matchExpressions": [
          {"key": "role", "operator": "NotIn"}]}}]}},
     "networkPolicy.clients[0].podSelector.matchExpressions[0]: Invalid value: \"object\": In and NotIn need values"),
    ({"selector": {"matchLabels": {"app": "vllm"}}, "affinityBreakMarginn": 3}, 'unknown field "spec.affinityBreakMarginn"'),
    ({"selector": {"matchLabels": {"app": "vllm"}}, "router": {"sessionOwner": "entry"}},
     'spec.router.sessionOwner: Unsupported value: "entry"'),
    ({"selector": {"matchLabels": {"app": "vllm"}}, "router": {"sessionOwnership": False, "sessionOwner": "Entry"}},
     "sessionOwner Entry needs sessionOwnership true"),
    ({"selector": {"matchLabels": {"app": "vllm"}}, "policy": "cost_affinity", "affinityBreakMargin": None},
     "spec.affinityBreakMargin: Invalid value: \"object\": policy cost_affinity needs a number"),
    ({"selector": {"matchLabels": {"app": "vllm"}}, "serviceMonitor": {"enabled": True, "interval": "5s"}},
     "spec.serviceMonitor.scrapeTimeout: Invalid value: \"object\": scrapeTimeout must be at most the interval"),
    ({"selector": {"matchLabels": {"app": "vllm"}}, "serviceMonitor": {"enabled": True, "interval": "1d"}},
     "spec.serviceMonitor.interval: Invalid value: \"1d\": spec.serviceMonitor.interval in body should match"),
    ({"selector": {"matchLabels": {"app": "vllm"}}, "backendPort": 70000},
     "spec.backendPort: Invalid value: \"object\": a port is a number from 1 to 65535"),
    ({"selector": {"matchLabels": {"app": "vllm"}}, "grpcPort": "Grpc_Port"},
     "spec.grpcPort: Invalid value: \"object\": a port is a number from 1 to 65535"),
], ids=["negative-margin", "unknown-policy", "empty-selector-cel", "in-without-values-cel",
        "peer-notin-without-values-cel", "unknown-field",
        "lower-case-session-owner", "entry-without-ownership-cel", "cost-affinity-without-margin-cel",
        "scrape-timeout-over-interval-cel", "interval-in-days", "port-out-of-range-cel", "port-name-cel"])
def test_api_server_rejects_what_the_crd_schema_catches(cluster, namespace, spec, expected):
    cluster.kubectl("apply", "-f", "crds/")  # the CRD alone, as the README's first step does
    answer = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=rollouts(spec), check=False)
    assert answer.returncode != 0
    assert expected in answer.stderr, answer.stderr
    assert not cluster.get("rr", "-n", namespace)["items"]


@pytest.mark.parametrize("spec", [
    {"selector": {"matchLabels": {"app": "vllm"}}, "policy": "cost_affinity", "affinityBreakMargin": 0},
    {"selector": {"matchLabels": {"app": "vllm"}}, "policy": "cost_affinity", "fullDeterminism": True},
    {"selector": {"matchLabels": {"app": "vllm"}}, "router": {"sessionOwnership": True, "sessionOwner": "Entry"}},
    {"selector": {"matchLabels": {"app": "vllm"}},
     "serviceMonitor": {"enabled": True, "interval": "1m", "scrapeTimeout": "59s500ms"}},
    {"selector": {"matchLabels": {"app": "vllm"}}, "router": {"sessionOwnership": False, "workers": 4}},
    {"selector": {"matchLabels": {"app": "vllm"}}, "router": {"workers": 1}},
    {"selector": {"matchLabels": {"app": "vllm"}}, "router": {"workers": 2}},
    {"selector": {"matchLabels": {"app": "vllm"}}, "backendPort": "http", "grpcPort": "9000"},
    {"selector": {"matchLabels": {"app": "vllm"}}, "backendPort": None, "grpcPort": 65535},
], ids=["cost-affinity-with-margin-0", "cost-affinity-under-full-determinism", "entry-with-ownership",
        "scrape-timeout-within-interval", "workers-without-ownership", "one-worker-with-ownership",
        "workers-with-ownership", "port-name-and-digit-string", "grpc-only-top-port"])
def test_api_server_accepts_what_the_cel_rules_allow(cluster, namespace, spec):
    cluster.kubectl("apply", "-f", "crds/")
    answer = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=rollouts(spec), check=False)
    assert answer.returncode == 0, answer.stderr


@pytest.mark.parametrize(("spec", "message"), [
    ({"selector": {"matchLabels": {"app": "vllm"}}, "grpcPort": 8000}, "spec.grpcPort: must differ from spec.backendPort"),
    ({"selector": {"matchLabels": {"app.kubernetes.io/name": "rollout-router"}}},
     "spec.selector: matches the router's own pods"),
], ids=["grpc-equals-http-port", "selector-matches-router"])
def test_operator_reports_what_only_it_can_judge_as_invalid_spec(cluster, operator_release, namespace, spec, message):
    cluster.apply(rollouts(spec), namespace)

    def degraded() -> dict | None:
        conditions = cluster.get("rr", "rollouts", "-n", namespace).get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"), None)

    condition = eventually(degraded, 60, "Degraded condition on the resource")
    assert condition["reason"] == "InvalidSpec" and message in condition["message"], condition
    assert not cluster.get("deployment,configmap", "-n", namespace, "-l", "app.kubernetes.io/instance=rollouts")["items"]

"""Invalid RolloutRouters: what the API server itself rejects, and what only the operator can judge.

The CRD's schema and CEL rules are evaluated by the real kube-apiserver: ``kubectl apply`` fails
with a message naming the field. Each CEL rule runs on the cases that the operator's own evaluation
of the same rules is tested with (tests/cel_cases.py). A spec the schema accepts but that cannot
work (here: gRPC on the HTTP port, a selector matching the router's own pods) gets
``Degraded=True`` with reason ``InvalidSpec`` from the operator, and no children.
"""
from __future__ import annotations

import json

import pytest

from ..cel_cases import CASES
from ..cel_cases import spec as cel_spec
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
    ({"selector": {"matchLabels": {"app": "vllm"}}, "affinityBreakMarginn": 3}, 'unknown field "spec.affinityBreakMarginn"'),
    ({"selector": {"matchLabels": {"app": "vllm"}}, "router": {"sessionOwner": "entry"}},
     'spec.router.sessionOwner: Unsupported value: "entry"'),
    ({"selector": {"matchLabels": {"app": "vllm"}}, "serviceMonitor": {"enabled": True, "interval": "1d"}},
     "spec.serviceMonitor.interval: Invalid value: \"1d\": spec.serviceMonitor.interval in body should match"),
], ids=["negative-margin", "unknown-policy", "unknown-field", "lower-case-session-owner", "interval-in-days"])
def test_api_server_rejects_what_the_crd_schema_catches(cluster, namespace, spec, expected):
    cluster.kubectl("apply", "-f", "crds/")  # the CRD alone, as the README's first step does
    answer = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=rollouts(spec), check=False)
    assert answer.returncode != 0
    assert expected in answer.stderr, answer.stderr
    assert not cluster.get("rr", "-n", namespace)["items"]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_api_server_refuses_each_cel_rule_broken_and_admits_it_kept(cluster, namespace, case):
    """Every CEL rule of crds/, run by the API server on the cases the operator's quick-tier tests run
    (tests/cel_cases.py): refused naming the field and the rule, and the near resources admitted."""
    cluster.kubectl("apply", "-f", "crds/")
    answer = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=rollouts(cel_spec(case.bad)), check=False)
    field, message = case.refusal.split(": ", 1)
    assert answer.returncode != 0 and f'{field}: Invalid value: "object": {message}' in answer.stderr, answer.stderr
    assert not cluster.get("rr", "-n", namespace)["items"]
    for good in case.good:
        answer = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                                 stdin=rollouts(cel_spec(good)), check=False)
        assert answer.returncode == 0, (good, answer.stderr)


@pytest.mark.parametrize("spec", [
    {"selector": {"matchLabels": {"app": "vllm"}}, "router": {"sessionOwnership": False, "workers": 4}},
    {"selector": {"matchLabels": {"app": "vllm"}}, "router": {"workers": 1}},
    {"selector": {"matchLabels": {"app": "vllm"}}, "router": {"workers": 2}},
], ids=["workers-without-ownership", "one-worker-with-ownership", "workers-with-ownership"])
def test_api_server_accepts_what_the_schema_allows(cluster, namespace, spec):
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

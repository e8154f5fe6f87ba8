"""The chart's least-privilege defaults: namespaced operator, the admission policy narrowing its writes,
its NetworkPolicy, and the router image allowlist reaching the operator (on tests/test_chart.py's helpers)."""
from __future__ import annotations

import pytest

from rollout_router_operator.render import InvalidSpec, child_refs, pod_labels
from rollout_router_operator.render import render as render_children
from tests.k8s.resources import resource_of
from tests.test_chart import NAMESPACE, RELEASE, chart, example_resource, of_kind, one, render  # noqa: F401
from tests.test_chart_operator import operator_args, operator_container


def test_watching_every_namespace_is_opt_in_and_excludes_a_list(chart):
    assert "--all-namespaces" not in operator_container(render(chart, {}))["command"]
    assert operator_args(operator_container(render(chart, {}))).namespace == [NAMESPACE]
    everywhere = render(chart, {"operator": {"watchAllNamespaces": True}})
    assert operator_args(operator_container(everywhere)).all_namespaces is True
    assert len(of_kind(everywhere, "ClusterRole")) == 1 and of_kind(everywhere, "Role") == []
    with pytest.raises(Exception, match="exclude each other"):
        render(chart, {"operator": {"watchAllNamespaces": True, "watchNamespaces": ["team-a"]}})


def test_admission_policy_covers_every_child_kind_for_the_operator_only(chart):
    manifests = render(chart, {})
    policy = one(manifests, "ValidatingAdmissionPolicy")
    binding = one(manifests, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    covered = {(group, resource) for rule in policy["spec"]["matchConstraints"]["resourceRules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               if set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}}
    for api_version, kind, _ in child_refs("x"):
        group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
        assert (group, resource_of(api_version, kind).plural) in covered, kind
    account = one(manifests, "ServiceAccount")["metadata"]["name"]
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{account}"'
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    managed = pod_labels("x")["app.kubernetes.io/managed-by"]  # the label every child carries
    assert "app.kubernetes.io/managed-by" in expressions and f"'{managed}'" in policy["spec"]["variables"][0]["expression"]
    assert of_kind(render(chart, {"rbac": {"admissionPolicy": False}}), "ValidatingAdmissionPolicy") == []
    assert of_kind(render(chart, {"rbac": {"create": False}}), "ValidatingAdmissionPolicyBinding") == []


def test_the_routers_role_passes_the_admission_policys_role_rule():
    """The policy lets Roles grant get/list/watch on pods only: exactly what render() gives each router."""
    (role,) = [c for c in render_children(example_resource()) if c["kind"] == "Role"]
    assert all(rule["apiGroups"] == [""] and rule["resources"] == ["pods"]
               and set(rule["verbs"]) <= {"get", "list", "watch"} for rule in role["rules"])
    (binding,) = [c for c in render_children(example_resource()) if c["kind"] == "RoleBinding"]
    assert binding["roleRef"]["kind"] == "Role"
    assert all(s["kind"] == "ServiceAccount" and s["namespace"] == binding["metadata"]["namespace"]
               for s in binding["subjects"])


def test_operator_network_policy_admits_prometheus_to_metrics_only(chart):
    manifests = render(chart, {})
    policy = one(manifests, "NetworkPolicy")
    pod_labels_ = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels_.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    health, metrics = policy["spec"]["ingress"]
    assert health == {"ports": [{"port": "health", "protocol": "TCP"}]}
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    container_ports = {p["name"] for p in operator_container(manifests)["ports"]}
    assert {"health", "metrics"} == container_ports
    nobody = one(render(chart, {"networkPolicy": {"prometheus": []}}), "NetworkPolicy")
    assert nobody["spec"]["ingress"] == [health]  # no peer declared: the metrics port is closed
    assert of_kind(render(chart, {"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


def test_allowed_router_images_reach_the_operator_and_bound_spec_images(chart):
    values = {"operator": {"allowedRouterImages": ["registry.example.com/rollout-router:*"]}}
    args = operator_args(operator_container(render(chart, values)))
    assert args.allowed_images == ["registry.example.com/rollout-router:*"]
    good = example_resource({"selector": {"matchLabels": {"app": "vllm"}},
                             "router": {"image": "registry.example.com/rollout-router:2.0"}})
    assert render_children(good, args.router_image, args.allowed_images)
    bad = example_resource({"selector": {"matchLabels": {"app": "vllm"}}, "router": {"image": "evil.example/x:1"}})
    with pytest.raises(InvalidSpec, match=r"^spec\.router\.image: evil\.example/x:1 is not an allowed"):
        render_children(bad, args.router_image, args.allowed_images)
    unset = example_resource()  # the chart's own image always runs
    assert render_children(unset, args.router_image, args.allowed_images)
    assert operator_args(operator_container(render(chart, {}))).allowed_images == []


def test_docs_install_manifest_needs_no_namespace_access():
    """kopf runs with scanning off: it neither lists namespaces nor watches CRDs, so neither is granted."""
    from tests.test_chart import install_manifest_grants
    grants = install_manifest_grants()
    assert ("", "namespaces") not in grants
    assert not any(resource == "customresourcedefinitions" for _, resource in grants)

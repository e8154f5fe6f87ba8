"""Helm's lifecycle of the chart, and least privilege as the API server itself enforces it."""
from __future__ import annotations

import json
import re

import pytest

from .cluster import eventually
from .conftest import ROOT
from .workloads import deploy_rollouts

pytestmark = [pytest.mark.realk8s, pytest.mark.timeout(600)]
OPERATOR = "app.kubernetes.io/component=operator"
OPERATOR_SA = "rollout-router-operator"  # release "rollout-router": the chart's "<fullname>-operator"
DEFAULT_RULES = {"selfsubjectaccessreviews", "selfsubjectrulesreviews", "selfsubjectreviews"}  # every user's


def documented_operator_rules() -> dict[str, set[str]]:
    """The table under "## Operator RBAC" in docs/operator.md, as resource -> verbs."""
    text = (ROOT / "docs/operator.md").read_text().split("## Operator RBAC", 1)[1].split("\n## ", 1)[0]
    rules: dict[str, set[str]] = {}
    for row in re.findall(r"^\| (.+?) \| .+ \|$", text, re.M)[1:]:  # skip the header
        resources, verbs = row.replace("`", "").rsplit(":", 1)
        for resource in resources.split(","):
            rules.setdefault(resource.strip(), set()).update(v.strip() for v in verbs.split(","))
    return rules


def can_i_list(cluster, user: str, namespace: str) -> dict[str, set[str]]:
    """``kubectl auth can-i --list --as USER``: resource (group dropped) -> verbs, rules of every user removed."""
    lines = cluster.kubectl("auth", "can-i", "--list", f"--as={user}", "-n", namespace).stdout.splitlines()[1:]
    rules: dict[str, set[str]] = {}
    for line in lines:
        match = re.match(r"^(\S+)\s+\[.*?\]\s+\[.*?\]\s+\[(.*)\]$", line)
        if not match:
            continue  # non-resource URLs
        name, _, sub = match.group(1).partition("/")
        resource = name.split(".")[0] + (f"/{sub}" if sub else "")
        if resource not in DEFAULT_RULES:
            rules.setdefault(resource, set()).update(match.group(2).split())
    return rules


def operator_flags(cluster, operator_release: str, namespace: str) -> list[str]:
    """kubectl flags that act with the running operator pod's own projected token, as the node agent mounted it."""
    operator = cluster.wait_ready_pods(operator_release, OPERATOR, 1)[0]
    token_volume = next(v["name"] for v in operator["spec"]["volumes"] if "projected" in v)
    token = cluster.agent_file(operator, token_volume, "token").read_text()
    return ["--kubeconfig=/dev/null", f"--server={cluster.plane.server}",
            f"--certificate-authority={cluster.plane.pki.ca_cert}", f"--token={token}", "-n", namespace]


def test_operator_service_account_holds_exactly_what_docs_operator_md_lists(cluster, operator_release, namespace):
    actual = can_i_list(cluster, f"system:serviceaccount:{operator_release}:{OPERATOR_SA}", namespace)
    assert actual == documented_operator_rules()


def test_router_service_account_may_only_read_pods_and_is_refused_anything_else(cluster, operator_release, namespace):
    router = deploy_rollouts(cluster, namespace)
    user = f"system:serviceaccount:{namespace}:rollouts-router"
    assert can_i_list(cluster, user, namespace) == {"pods": {"get", "list", "watch"}}
    # The router pod's own projected token, as the node agent mounted it: the API server names it and says no.
    token = cluster.agent_file(router, next(v["name"] for v in router["spec"]["volumes"] if "projected" in v), "token")
    as_router = ["--kubeconfig=/dev/null", f"--server={cluster.plane.server}",
                 f"--certificate-authority={cluster.plane.pki.ca_cert}", f"--token={token.read_text()}", "-n", namespace]
    assert cluster.kubectl("get", "pods", *as_router).returncode == 0
    refused = cluster.kubectl("get", "secrets", *as_router, check=False)
    assert refused.returncode != 0
    assert "Forbidden" in refused.stderr and f'"{user}" cannot list resource "secrets"' in refused.stderr
    refused = cluster.kubectl("delete", "pod", router["metadata"]["name"], *as_router, check=False)
    assert "Forbidden" in refused.stderr and "cannot delete resource" in refused.stderr


def test_operator_is_refused_outside_its_rules(cluster, operator_release, namespace):
    as_operator = operator_flags(cluster, operator_release, namespace)
    refused = cluster.kubectl("get", "secrets", *as_operator, check=False)
    assert "Forbidden" in refused.stderr and "cannot list resource \"secrets\"" in refused.stderr
    refused = cluster.kubectl("get", "deployments", *as_operator, check=False)  # it writes children, never reads them
    assert "Forbidden" in refused.stderr


def test_admission_policy_refuses_the_operators_writes_of_objects_it_does_not_manage(cluster, operator_release,
                                                                                      namespace):
    """RBAC lets the operator create ConfigMaps; the chart's ValidatingAdmissionPolicy allows only labelled ones."""
    as_operator = operator_flags(cluster, operator_release, namespace)
    refused = cluster.kubectl("create", "configmap", "unlabelled", *as_operator, check=False)
    assert refused.returncode != 0
    assert "ValidatingAdmissionPolicy 'rollout-router-operator-writes'" in refused.stderr
    assert "must label what it writes app.kubernetes.io/managed-by=rollout-router-operator" in refused.stderr
    refused = cluster.kubectl("delete", "configmap", "kube-root-ca.crt", *as_operator, check=False)  # not the operator's
    assert "may only change or delete objects it manages" in refused.stderr
    managed = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "managed", "labels": {"app.kubernetes.io/managed-by": "rollout-router-operator"}}}
    cluster.kubectl("create", "-f", "-", *as_operator, stdin=json.dumps(managed))
    cluster.kubectl("delete", "configmap", "managed", *as_operator)


def test_helm_upgrade_with_a_changed_value_rolls_the_operator(cluster, operator_release):
    before = cluster.wait_ready_pods(operator_release, OPERATOR, 1)[0]
    cluster.helm("upgrade", "rollout-router", str(ROOT / "charts/rollout-router"), "-n", operator_release,
                 "--reuse-values", "--set", "operator.statusInterval=3", "--wait", "--timeout", "180s")
    after = eventually(lambda: [p for p in cluster.ready_pods(operator_release, OPERATOR)
                                if p["metadata"]["uid"] != before["metadata"]["uid"]], 120, "a new operator pod")[0]
    assert "--status-interval=3" in after["spec"]["containers"][0]["command"]
    history = json.loads(cluster.helm("history", "rollout-router", "-n", operator_release, "-o", "json").stdout)
    assert history[-1]["status"] == "deployed" and history[-1]["description"] == "Upgrade complete"


def test_helm_uninstall_leaves_only_the_crd(cluster, operator_release):
    """A second, namespaced release (its own objects), installed and uninstalled.

    Namespaced (the chart's default): the documented rules in the watched namespace only, nothing
    cluster-wide but the admission policy and its binding.
    """
    cluster.kubectl("create", "namespace", "second-watched")
    cluster.helm("install", "second", str(ROOT / "charts/rollout-router"), "-n", "second-system", "--create-namespace",
                 "--set", "operator.watchNamespaces={second-watched}", "--wait", "--timeout", "180s")
    kinds = ("deployment,service,serviceaccount,configmap,networkpolicy,role,rolebinding,clusterrole,"
             "clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding")
    installed = cluster.get(kinds, "-A", "-l", "app.kubernetes.io/instance=second")["items"]
    assert {i["kind"] for i in installed} >= {"Deployment", "ServiceAccount", "NetworkPolicy", "Role", "RoleBinding",
                                              "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert not {"ClusterRole", "ClusterRoleBinding"} & {i["kind"] for i in installed}
    assert {i["metadata"]["namespace"] for i in installed if i["kind"] in ("Role", "RoleBinding")} == {"second-watched"}
    user = "system:serviceaccount:second-system:second-rollout-router-operator"
    assert can_i_list(cluster, user, "second-watched") == documented_operator_rules()
    assert can_i_list(cluster, user, "default") == {}
    cluster.helm("uninstall", "second", "-n", "second-system", "--wait")
    eventually(lambda: not cluster.get(kinds + ",pod", "-A", "-l", "app.kubernetes.io/instance=second")["items"],
               120, "nothing of the release is left")
    assert cluster.get("crd", "rolloutrouters.rolloutrouter.dev")["metadata"]["name"]

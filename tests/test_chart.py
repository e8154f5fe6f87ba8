"""The Helm chart, checked with real tools: the Helm SDK (lint, render, values schema),
kubernetes-validate --strict for every built-in kind, jsonschema for custom resources."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from rollout_router_operator.render import child_refs, router_labels
from rollout_router_operator.render import render as render_children
from rollout_router_operator.spec import DEFAULT_IMAGE
from tests.k8s.resources import resource_of

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "rollout-router"
CRD_FILE = "rolloutrouter.dev_rolloutrouters.yaml"
OPERATOR_IMAGE = "ghcr.io/rolloutrouter/rollout-router-operator:0.1.0"  # the Dockerfile's `operator` target
DASHBOARD = CHART / "dashboards" / "rollout-router.json"
KUBE_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
VALUES_FILES = {path.name.removesuffix("-values.yaml"): path for path in sorted((CHART / "ci").glob("*-values.yaml"))}
SCENARIOS = ["defaults", *VALUES_FILES]
RELEASE, NAMESPACE = "rr", "infra"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate", "*"}


def scenario_values(scenario: str) -> dict:
    return {} if scenario == "defaults" else yaml.safe_load(VALUES_FILES[scenario].read_text())


@pytest.fixture(scope="module")
def chart():
    loaded = helm_python.Chart.load(str(CHART))
    yield loaded
    loaded.close()


def render(chart, values: dict) -> list[dict]:
    """Every object the chart renders, NOTES.txt aside."""
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [doc for path, text in sorted(rendered.items()) if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


def notes(chart, values: dict) -> str:
    return chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)["rollout-router/templates/NOTES.txt"]


def of_kind(manifests: list[dict], kind: str) -> list[dict]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[dict], kind: str) -> dict:
    found = of_kind(manifests, kind)
    assert len(found) == 1, f"expected one {kind}, got {[m['metadata']['name'] for m in found]}"
    return found[0]


def crd() -> dict:
    return yaml.safe_load((CHART / "crds" / CRD_FILE).read_text())


def crd_schema() -> dict:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def openapi_to_jsonschema(node):
    """The structural-schema dialect -> JSON Schema: `nullable` and int-or-string become type lists."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("exclusiveMinimum") is True:  # OpenAPI v3.0 boolean form
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("nullable") and "type" in out:
        out["type"] = [*(out["type"] if isinstance(out["type"], list) else [out["type"]]), "null"]
    return out


def validate_rolloutrouter(resource: dict) -> None:
    schema = openapi_to_jsonschema(crd_schema())
    schema["properties"]["spec"]["additionalProperties"] = False  # unknown fields are pruned by the API: flag them here
    jsonschema.validate(resource, schema)


# The fields of monitoring.coreos.com/v1 ServiceMonitor this chart and the operator use, typed as the Prometheus
# Operator's CRD types them; unknown fields are rejected, as `kubernetes-validate --strict` does.
_LABEL_NAME = {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": _LABEL_NAME}, "separator": {"type": "string"},
    "targetLabel": {"type": "string"}, "regex": {"type": "string"}, "modulus": {"type": "integer", "minimum": 0},
    "replacement": {"type": "string"},
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap", "LabelMap",
                        "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase", "uppercase", "Uppercase",
                        "keepequal", "KeepEqual", "dropequal", "DropEqual"]}}}
_STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}
_AUTHORIZATION = {"type": "object", "additionalProperties": False, "properties": {  # SafeAuthorization
    "type": {"type": "string"}, "credentials": {"type": "object", "additionalProperties": False, "required": ["key"],
                                                "properties": {"name": {"type": "string"}, "key": {"type": "string"},
                                                               "optional": {"type": "boolean"}}}}}
SERVICEMONITOR_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "additionalProperties": False, "required": ["name", "namespace"], "properties": {
            "name": {"type": "string", "maxLength": 253}, "namespace": {"type": "string", "maxLength": 63},
            "labels": _STRMAP, "annotations": _STRMAP, "ownerReferences": {"type": "array", "items": {"type": "object"}}}},
        "spec": {"type": "object", "additionalProperties": False, "required": ["endpoints", "selector"], "properties": {
            "jobLabel": {"type": "string"},
            "selector": {"type": "object", "additionalProperties": False, "properties": {"matchLabels": _STRMAP,
                         "matchExpressions": {"type": "array", "items": {"type": "object"}}}},
            "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
            "endpoints": {"type": "array", "minItems": 1, "items": {"type": "object", "additionalProperties": False, "properties": {
                "port": {"type": "string"}, "path": {"type": "string"}, "scheme": {"enum": ["http", "https"]},
                "interval": _DURATION, "scrapeTimeout": _DURATION,
                "relabelings": {"type": "array", "items": _RELABEL}, "metricRelabelings": {"type": "array", "items": _RELABEL},
                "authorization": _AUTHORIZATION}}},
        }},
    },
}


def validate_manifest(manifest: dict, kube_version: str) -> None:
    """Built-in kinds with kubernetes-validate --strict; the two custom kinds with jsonschema."""
    if manifest["apiVersion"] == "rolloutrouter.dev/v1alpha1":
        validate_rolloutrouter(manifest)
    elif manifest["apiVersion"].startswith("monitoring.coreos.com/"):
        jsonschema.validate(manifest, SERVICEMONITOR_SCHEMA)
    else:
        kubernetes_validate.validate(manifest, kube_version, strict=True)


# --- the chart's identity ------------------------------------------------------------------------

def test_chart_version_and_app_version_follow_the_project():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (meta["version"], str(meta["appVersion"])) == (project, project)


def test_chart_crd_is_the_top_level_crd_byte_for_byte():
    top, ours = ROOT / "crds" / CRD_FILE, CHART / "crds" / CRD_FILE
    assert not ours.is_symlink(), "a symlink does not survive `helm package`; copy the file"
    assert ours.read_bytes() == top.read_bytes(), f"the chart's CRD is stale: cp {top.relative_to(ROOT)} {ours.relative_to(ROOT)}"


def test_chart_ships_exactly_the_crd(chart):
    assert [c["name"] for c in chart.crds] == [f"crds/{CRD_FILE}"]
    assert yaml.safe_load(chart.crds[0]["data"]) == crd()


def test_chart_operator_and_crd_name_the_same_router_image():
    """The chart's router image is the operator's built-in default, and the CRD leaves spec.router.image unset
    (a schema default would be stored by the API server and --router-image would never apply)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert f"{values['routerImage']['repository']}:{meta['appVersion']}" == DEFAULT_IMAGE
    assert values["image"]["repository"] != values["routerImage"]["repository"]  # the operator has its own image
    spec = crd_schema()["properties"]["spec"]["properties"]
    assert "default" not in spec["router"]["properties"]["image"]
    assert "image" not in spec["router"]["default"]


# --- helm lint and the values schema ---------------------------------------------------------------

@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_is_clean(scenario):
    report = helm_python.lint(str(CHART), scenario_values(scenario), strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 is info ("icon is recommended")
    assert report["total_charts_linted"] == 1
    assert (problems, report["errors"]) == ([], [])


def test_helm_lint_catches_a_broken_template(tmp_path):
    broken = tmp_path / "rollout-router"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "service.yaml").write_text("apiVersion: v1\nkind: Service\n{{ .Values.nope.missing }}\n")
    report = helm_python.lint(str(broken), strict=True)
    assert report["errors"] or [m for m in report["messages"] if m["severity"] >= 3]


@pytest.mark.parametrize(("values", "key"), [
    ({"operator": {"statusInterval": "ten"}}, "/operator/statusInterval"),
    ({"operator": {"watchNamespaces": "team-a"}}, "/operator/watchNamespaces"),
    ({"operator": {"watchNamespaces": ["Team_A"]}}, "/operator/watchNamespaces/0"),
    ({"operator": {"healthPort": 70000}}, "/operator/healthPort"),
    ({"operator": {"metricsPort": "8080"}}, "/operator/metricsPort"),
    ({"service": {"metricsPort": 0}}, "/service/metricsPort"),
    ({"operator": {"verbose": "yes"}}, "/operator/verbose"),
    ({"operator": {"bindAddress": "[::]"}}, "/operator/bindAddress"),
    ({"operator": {"nodeSelector": {"disk": 1}}}, "/operator/nodeSelector/disk"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"image": {"tag": 1.0}}, "/image/tag"),
    ({"routerImage": {"repository": ""}}, "/routerImage/repository"),
    ({"routerImage": {"tag": 1.0}}, "/routerImage/tag"),
    ({"routerImage": {"pullPolicy": "Always"}}, "/routerImage"),  # router pods: spec.router.imagePullPolicy
    ({"serviceMonitor": {"enabled": "true"}}, "/serviceMonitor/enabled"),
    ({"serviceMonitor": {"interval": "30 seconds"}}, "/serviceMonitor/interval"),
    ({"dashboard": {"labels": {"grafana_dashboard": 1}}}, "/dashboard/labels/grafana_dashboard"),
    ({"example": {"name": "Not_A_Name"}}, "/example/name"),
    ({"example": {"name": "1rollouts"}}, "/example/name"),  # the operator's InvalidSpec: a Service needs a letter first
    ({"service": {"type": "Ingress"}}, "/service/type"),
    ({"replicaCount": 2}, "replicaCount"),
])
def test_values_schema_rejects_wrong_values_naming_the_key(chart, values, key):
    with pytest.raises(helm_python.HelmValuesError) as error:
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    assert key in str(error.value)


def test_every_values_key_is_documented_in_values_yaml():
    """Each key of values.yaml's first two levels has a comment line right above it
    (deeper levels are Kubernetes data: resources, security contexts, the example's spec)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = [line for index, line in enumerate(lines)
                    if line.strip() and not line.lstrip().startswith(("#", "-")) and ":" in line
                    and len(line) - len(line.lstrip()) <= 2 and not lines[index - 1].lstrip().startswith("#")]
    assert undocumented == []
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])
    for key, value in values.items():
        if isinstance(value, dict) and schema["properties"][key].get("properties"):
            assert set(value) == set(schema["properties"][key]["properties"]), key


# --- rendering: every manifest valid, and what each scenario must produce ----------------------------

@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rendered_manifest_validates(chart, scenario, kube_version):
    manifests = render(chart, scenario_values(scenario))
    assert manifests
    for manifest in manifests:
        validate_manifest(manifest, kube_version)
    kubernetes_validate.validate(crd(), kube_version, strict=True)


def test_kubernetes_validate_cli_strict_on_the_rendered_chart(chart, tmp_path):
    """The command line itself, over files, as a user would run it."""
    files = []
    for index, manifest in enumerate(render(chart, scenario_values("cluster-wide"))):
        path = tmp_path / f"{index:02d}-{manifest['kind']}.yaml"
        path.write_text(yaml.safe_dump(manifest))
        files.append(str(path))
    files.append(str(CHART / "crds" / CRD_FILE))
    cli = [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", "1.30.0", "--quiet"]
    done = subprocess.run([*cli, *files], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = copy.deepcopy(yaml.safe_load(Path(files[0]).read_text()))
    bad["spec_typo"] = True
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    done = subprocess.run([*cli, str(tmp_path / "bad.yaml")], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, "strict validation must reject unknown fields"


def test_validation_is_not_vacuous():
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
                                      "spec": {"ports": [{"port": "eighty"}]}}, "1.30.0", strict=True)
    with pytest.raises(jsonschema.ValidationError):
        validate_rolloutrouter({"apiVersion": "rolloutrouter.dev/v1alpha1", "kind": "RolloutRouter", "metadata": {"name": "x"},
                                "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "affinityBreakMargin": "four"}})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                             "metadata": {"name": "x", "namespace": "y"},
                             "spec": {"selector": {}, "endpoints": [{"port": "http", "intervall": "5s"}]}}, SERVICEMONITOR_SCHEMA)


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def test_defaults_render_the_operator_namespaced_locked_down(chart):
    """Least privilege by default: the release namespace only, its writes in a Role there, nothing
    cluster-wide but the admission policy that narrows those writes further."""
    manifests = render(chart, {})
    assert sorted(m["kind"] for m in manifests) == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "ConfigMap", "NetworkPolicy", "Secret",
         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"])  # the Secret: the admin token key
    for manifest in manifests:
        assert manifest["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        if manifest["kind"] not in CLUSTER_SCOPED:
            assert manifest["metadata"]["namespace"] == NAMESPACE
    deployment = one(manifests, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert container["image"] == OPERATOR_IMAGE and container["imagePullPolicy"] == "IfNotPresent"
    assert container["command"] == ["rollout-router", "operator", f"--namespace={NAMESPACE}", "--status-interval=10",
                                    "--liveness=http://0.0.0.0:8081/healthz", "--metrics-host=0.0.0.0",
                                    "--metrics-port=8080",
                                    f"--router-image={DEFAULT_IMAGE}",
                                    "--admin-token-key-file=/var/run/secrets/rollout-router-operator/key"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    assert {"name": "metrics", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert pod["serviceAccountName"] == one(manifests, "ServiceAccount")["metadata"]["name"]
    service = one(manifests, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"} in service["spec"]["ports"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    # The operator's pods are never taken for router pods (whose selector has component=router).
    assert not router_labels(RELEASE).items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    binding = one(manifests, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": one(manifests, "Role")["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}]
    assert one(manifests, "Role")["metadata"]["namespace"] == NAMESPACE


def rules_grant(rules: list[dict], group: str, resource: str, verbs: set[str]) -> bool:
    return verbs <= {verb for rule in rules if group in rule["apiGroups"] and resource in rule["resources"]
                     for verb in rule["verbs"]}


def grants(rules: list[dict]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def install_manifest_grants() -> dict[tuple[str, str], set[str]]:
    """The operator's least-privilege RBAC as its owners document it (docs/examples/operator.yaml)."""
    docs = yaml.safe_load_all((ROOT / "docs" / "examples" / "operator.yaml").read_text())
    (role,) = [d for d in docs if d and d["kind"] == "ClusterRole"]
    return grants(role["rules"])


@pytest.mark.parametrize("scenario", ["defaults", "namespaced", "cluster-wide"])
def test_operator_rbac_is_the_documented_least_privilege_set(chart, scenario):
    """The chart grants exactly what docs/examples/operator.yaml grants: cluster-wide in a ClusterRole,
    else in a Role per watched namespace and nothing cluster-wide."""
    manifests = render(chart, scenario_values(scenario))
    if scenario == "cluster-wide":
        roles = of_kind(manifests, "ClusterRole")
        assert len(roles) == 1 and grants(roles[0]["rules"]) == install_manifest_grants()
    else:
        assert of_kind(manifests, "ClusterRole") == [] and of_kind(manifests, "ClusterRoleBinding") == []
        roles = of_kind(manifests, "Role")
        for role in roles:
            assert grants(role["rules"]) == install_manifest_grants(), role["metadata"]["namespace"]
    for role in roles:
        rules = role["rules"]
        for api_version, kind, _ in child_refs("x"):  # server-side apply and cleanup of every child kind
            plural = resource_of(api_version, kind).plural
            group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
            assert rules_grant(rules, group, plural, {"create", "patch", "delete"}), plural
        # A Role can only grant what its creator holds: the router's Role must be within the operator's.
        router_role = next(c for c in render_children(example_resource()) if c["kind"] == "Role")
        for rule in router_role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    assert rules_grant(rules, group, resource, set(rule["verbs"]))
        assert not any("*" in rule["verbs"] or "*" in rule["resources"] for rule in rules)


def test_namespaced_scope_writes_only_in_the_listed_namespaces(chart):
    manifests = render(chart, scenario_values("namespaced"))
    roles, bindings = of_kind(manifests, "Role"), of_kind(manifests, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["subjects"][0]["namespace"] == NAMESPACE  # the operator's ServiceAccount lives in the release namespace
    for cluster_role in of_kind(manifests, "ClusterRole"):
        verbs = {verb for rule in cluster_role["rules"] for verb in rule["verbs"]}
        assert not verbs & WRITE_VERBS, f"{cluster_role['metadata']['name']} writes cluster-wide: {verbs}"
    command = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--namespace=team-a" in command and "--namespace=team-b" in command and "--all-namespaces" not in command
    assert "team-a, team-b" in notes(chart, scenario_values("namespaced"))


def test_cluster_wide_values_reach_the_pod(chart):
    values = scenario_values("cluster-wide")
    manifests = render(chart, values)
    pod = one(manifests, "Deployment")["spec"]["template"]
    spec, (container,) = pod["spec"], pod["spec"]["containers"]
    operator = values["operator"]
    assert spec["nodeSelector"] == operator["nodeSelector"]
    assert spec["tolerations"] == operator["tolerations"]
    assert spec["affinity"] == operator["affinity"]
    assert spec["priorityClassName"] == operator["priorityClassName"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert container["image"] == "registry.example.com/mirror/rollout-router-operator:0.1.0"
    assert "--router-image=registry.example.com/mirror/rollout-router:0.1.0" in container["command"]
    assert container["imagePullPolicy"] == "Always"
    assert {"name": "TZ", "value": "UTC"} in container["env"]
    assert "--verbose" in container["command"] and "--status-interval=5" in container["command"]
    assert pod["metadata"]["labels"]["team"] == "ml-infra"
    assert pod["metadata"]["annotations"] == {"example.com/owner": "ml-infra"}
    for manifest in manifests:
        assert manifest["metadata"]["labels"]["cost-center"] == "ml", manifest["kind"]
        assert manifest["metadata"]["annotations"]["example.com/contact"] == "ml-infra@example.com", manifest["kind"]
    account = one(manifests, "ServiceAccount")
    assert account["metadata"]["annotations"]["iam.example.com/role"] == "rollout-router"


def example_resource(spec: dict | None = None, name: str = "rollouts", namespace: str = "team-a") -> dict:
    return {"apiVersion": "rolloutrouter.dev/v1alpha1", "kind": "RolloutRouter",
            "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": 1},
            "spec": spec or {"selector": {"matchLabels": {"app": "vllm"}}}}


def test_dashboard_configmap_is_labelled_for_the_sidecar_and_can_be_turned_off(chart):
    configmap = one(render(chart, {}), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["rollout-router.json"]) == json.loads(DASHBOARD.read_text())
    custom = one(render(chart, scenario_values("example")), "ConfigMap")
    assert custom["metadata"]["namespace"] == "monitoring"
    assert custom["metadata"]["labels"]["team"] == "ml" and custom["metadata"]["annotations"] == {"grafana_folder": "vLLM"}
    relabelled = one(render(chart, {"dashboard": {"labels": {"grafana_dashboard": "rollout"}}}), "ConfigMap")
    assert relabelled["metadata"]["labels"]["grafana_dashboard"] == "rollout"
    assert of_kind(render(chart, scenario_values("no-dashboard")), "ConfigMap") == []


def test_example_rolloutrouter_is_valid_for_the_crd_and_the_operator(chart):
    manifests = render(chart, scenario_values("example"))
    example = one(manifests, "RolloutRouter")
    assert (example["metadata"]["name"], example["metadata"]["namespace"]) == ("rollouts", "team-a")
    validate_rolloutrouter(example)
    children = render_children({**example, "metadata": {**example["metadata"], "uid": "uid-1"}})
    assert {c["kind"] for c in children} >= {"Deployment", "Service", "PodDisruptionBudget"}
    assert of_kind(render(chart, {}), "RolloutRouter") == []
    assert "kubectl -n team-a get rr rollouts" in notes(chart, scenario_values("example"))


def test_notes_send_the_scraper_to_the_routers_admin_port(chart):
    """The routers' /metrics is on the admin listener (the Service's port "admin"); "http" answers 404 there."""
    from rollout_router_operator.render import ROUTER_ADMIN_PORT
    text = " ".join(notes(chart, {}).split())
    assert f'/metrics on its admin port (port "admin", {ROUTER_ADMIN_PORT},' in text
    assert '/metrics on port "http"' not in text


def test_notes_tell_the_user_what_to_apply_next(chart):
    text = notes(chart, {})
    assert "kind: RolloutRouter" in text and "kubectl apply" in text and "kubectl -n infra rollout status" in text
    docs = text.split("cat <<YAML | kubectl apply -n <your-namespace> -f -\n", 1)[1].split("  YAML", 1)[0]
    validate_rolloutrouter(yaml.safe_load("\n".join(line.removeprefix("  ") for line in docs.splitlines())))


# --- the operator's own children, validated the same way -------------------------------------------

EXAMPLES = sorted(p for p in (ROOT / "docs" / "examples").glob("*.yaml")
                  if any(d and d.get("kind") == "RolloutRouter" for d in yaml.safe_load_all(p.read_text())))


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_operator_children_validate_strictly(example, kube_version):
    (resource,) = [d for d in yaml.safe_load_all(example.read_text()) if d and d["kind"] == "RolloutRouter"]
    validate_rolloutrouter(resource)
    resource["metadata"] = {**resource["metadata"], "namespace": "team-a", "uid": "3f1c2d8e-0000-4000-8000-000000000001"}
    children = render_children(resource)
    assert children
    for child in children:
        kubernetes_validate.validate(child, kube_version, strict=True)


def test_packaged_chart_carries_the_crd_dashboard_and_schema(tmp_path):
    """`helm package` output (what users install from a repository) still has everything."""
    archive = Path(helm_python.package(str(CHART), destination=str(tmp_path)))
    assert archive.name == "rollout-router-0.1.0.tgz"
    packaged = helm_python.Chart.load_archive(archive.read_bytes())
    try:
        assert [c["name"] for c in packaged.crds] == [f"crds/{CRD_FILE}"]
        assert yaml.safe_load(packaged.crds[0]["data"]) == crd()
        manifests = render(packaged, {})
        configmap = one(manifests, "ConfigMap")
        assert json.loads(configmap["data"]["rollout-router.json"]) == json.loads(DASHBOARD.read_text())
        with pytest.raises(helm_python.HelmValuesError):
            packaged.render({"operator": {"statusInterval": "ten"}}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    finally:
        packaged.close()


def test_an_ipv6_cluster_sets_the_operators_bind_address(chart):
    command = one(render(chart, {"operator": {"bindAddress": "::"}}), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["command"]
    assert "--liveness=http://[::]:8081/healthz" in command and "--metrics-host=::" in command

"""render(): every child, for many specs, from a dict and nothing else."""
from __future__ import annotations

import copy
import itertools

import pytest
import yaml

from rollout_router.settings import parse_settings
from rollout_router_operator.render import InvalidSpec, child_refs, render, router_labels
from rollout_router_operator.spec import DEFAULT_IMAGE


def resource(spec: dict | None = None, name: str = "rr1") -> dict:
    return {"apiVersion": "rolloutrouter.dev/v1alpha1", "kind": "RolloutRouter",
            "metadata": {"name": name, "namespace": "team", "uid": "uid-1", "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}}, **(spec or {})}}


def by_kind(manifests: list[dict]) -> dict[str, dict]:
    """The last child of each kind (the traffic Service, after an exposed router's admin Service)."""
    return {m["kind"]: m for m in manifests}


FULL = {
    "backendPort": "http", "grpcPort": 50051, "policy": "affinity", "affinityBreakMargin": 2, "fullDeterminism": True,
    "session": {"headers": ["X-A"], "bodyFields": ["sid"], "maxSessions": 10, "idleTimeoutSeconds": None},
    "router": {"replicas": 3, "image": "example.com/rr:dev", "imagePullPolicy": "Always",
               "resources": {"requests": {"cpu": 1}, "limits": {"memory": "2Gi"}},
               "service": {"type": "LoadBalancer", "port": 80}, "nodeSelector": {"pool": "cpu"},
               "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
               "env": [{"name": "X", "value": "1"}, {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
               "podAnnotations": {"a": "b"}},
    "metrics": {"keptPrefillSampleRate": 0.5, "maxBackendLabels": 8},
}


def test_defaults_give_every_child_owned_and_labelled():
    children = render(resource())
    assert [c["kind"] for c in children] == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service"]
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "team"
        assert meta["ownerReferences"] == [{"apiVersion": "rolloutrouter.dev/v1alpha1", "kind": "RolloutRouter",
                                            "name": "rr1", "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
        assert meta["labels"]["app.kubernetes.io/instance"] == "rr1"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "rollout-router-operator"
    assert {(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in children} <= set(child_refs("rr1"))


def test_router_rbac_is_read_only_pods_in_its_namespace():
    kinds = by_kind(render(resource()))
    assert kinds["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = kinds["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rr1-router"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rr1-router", "namespace": "team"}]
    assert kinds["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == "rr1-router"


def test_router_pods_are_locked_down_and_probed():
    pod = by_kind(render(resource()))["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["command"][:12] == ["rollout-router", "serve", "--config", "/etc/rollout-router/config.yaml",
                                         "--host", "::", "--port", "8080", "--admin-host", "::",
                                         "--admin-port", "8081"]  # then the fleet flags (tests/test_render_fleet.py)
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8080, "admin": 8081}
    service = by_kind(render(resource()))["Service"]["spec"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["ports"]] == [
        ("http", 8080, "http"), ("admin", 8081, "admin")]  # the ServiceMonitor scrapes "admin"
    assert container["image"] == DEFAULT_IMAGE
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/etc/rollout-router", "/tmp"}
    assert not any("subPath" in m for m in container["volumeMounts"])  # subPath mounts never update


def image_of(manifests: list[dict]) -> str:
    return by_kind(manifests)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]


def test_the_operators_router_image_runs_routers_whose_spec_names_none():
    """The default image is an input (the operator's --router-image), and the spec's own image wins over it."""
    assert image_of(render(resource())) == DEFAULT_IMAGE
    assert image_of(render(resource(), default_image="mirror.example.com/rr:1")) == "mirror.example.com/rr:1"
    named = resource({"router": {"image": "example.com/rr:dev"}})
    assert image_of(render(named, default_image="mirror.example.com/rr:1")) == "example.com/rr:dev"
    assert image_of(render(resource({"router": {"image": None}}), default_image="m/rr:2")) == "m/rr:2"


def test_configmap_is_what_the_router_reads():
    config = by_kind(render(resource(FULL)))["ConfigMap"]["data"]["config.yaml"]
    settings = parse_settings(yaml.safe_load(config))
    assert settings.affinity_break_margin == 2 and settings.full_determinism is True
    assert settings.session.headers == ["X-A"] and settings.session.idle_timeout_seconds is None
    assert settings.discovery.namespace == "team"
    assert settings.discovery.selector.match_labels == {"app": "vllm"}
    assert settings.discovery.port == "http" and settings.discovery.grpc_port == 50051
    assert settings.metrics.kept_prefill_sample_rate == 0.5 and settings.metrics.max_backend_labels == 8


def test_every_optional_field_lands():
    kinds = by_kind(render(resource(FULL)))
    deployment = kinds["Deployment"]["spec"]
    pod = deployment["template"]["spec"]
    container = pod["containers"][0]
    assert deployment["replicas"] == 3
    assert container["image"] == "example.com/rr:dev" and container["imagePullPolicy"] == "Always"
    assert container["resources"] == {"requests": {"cpu": 1}, "limits": {"memory": "2Gi"}}
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["tolerations"] == [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]
    env = {e["name"]: e for e in container["env"]}
    assert env["X"] == {"name": "X", "value": "1"}
    assert env["Y"]["valueFrom"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert deployment["template"]["metadata"]["annotations"] == {"a": "b"}
    assert kinds["Service"]["spec"]["type"] == "LoadBalancer"
    assert kinds["Service"]["spec"]["ports"][0]["port"] == 80
    assert kinds["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("exposed", ["NodePort", "LoadBalancer"])
def test_an_exposed_router_exposes_its_traffic_ports_and_keeps_the_admin_port_in_the_cluster(exposed):
    spec = {"grpcPort": 50051, "router": {"service": {"type": exposed}}, "serviceMonitor": {"enabled": True}}
    services = {m["metadata"]["name"]: m for m in render(resource(spec)) if m["kind"] == "Service"}
    assert list(services) == ["rr1-router-admin", "rr1-router"]  # applied in order: the admin port never lacks one
    traffic, admin = services["rr1-router"], services["rr1-router-admin"]
    assert traffic["spec"]["type"] == exposed and [p["name"] for p in traffic["spec"]["ports"]] == ["http", "grpc"]
    assert admin["spec"] == {"type": "ClusterIP", "selector": router_labels("rr1"),
                             "ports": [{"name": "admin", "port": 8081, "targetPort": "admin", "protocol": "TCP"}]}
    assert admin["metadata"]["labels"] == traffic["metadata"]["labels"]  # what the ServiceMonitors select
    assert ("v1", "Service", "rr1-router-admin") in child_refs("rr1")  # deleted again when the Service is ClusterIP
    with pytest.raises(InvalidSpec, match=r"metadata\.name: at most 50 characters with spec\.router\.service\.type "
                                          f"{exposed} \\(its admin port's Service is '{'x' * 51}-router-admin'\\)"):
        render(resource(spec, name="x" * 51))
    assert render(resource(spec, name="x" * 50)) and render(resource(name="x" * 56))  # ClusterIP: 56 as before
    assert all(len(ref[2]) <= 63 for ref in child_refs("x" * 56) if ref[1] == "Service")
    inside = [m for m in render(resource({"grpcPort": 50051})) if m["kind"] == "Service"]
    assert [p["name"] for s in inside for p in s["spec"]["ports"]] == ["http", "admin", "grpc"]  # one Service


def test_service_keeps_each_client_on_one_router_pod_without_session_ownership():
    """Without ownership pins are per router pod, so a client's turns must keep meeting the same router;
    with it (the default) any pod reaches the owner, and ClientIP affinity would only skew the pods' load."""
    alone = resource({"router": {"replicas": 3, "sessionOwnership": False}})
    assert by_kind(render(alone))["Service"]["spec"]["sessionAffinity"] == "ClientIP"
    assert "sessionAffinity" not in by_kind(render(resource({"router": {"replicas": 3}})))["Service"]["spec"]


@pytest.mark.parametrize("grpc_port", [None, 50051, "grpc"])
def test_router_serves_grpc_exactly_when_the_replicas_do(grpc_port):
    kinds = by_kind(render(resource({"grpcPort": grpc_port} if grpc_port is not None else {})))
    container = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    service_ports = {p["name"]: p for p in kinds["Service"]["spec"]["ports"]}
    container_ports = {p["name"] for p in container["ports"]}
    if grpc_port is None:
        assert "--grpc-port" not in container["command"] and "grpc" not in service_ports.keys() | container_ports
    else:
        flag = container["command"].index("--grpc-port")
        listen = int(container["command"][flag + 1])
        assert {"http", "grpc"} <= container_ports and service_ports["grpc"]["targetPort"] == "grpc"
        assert next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc") == listen
        settings = yaml.safe_load(kinds["ConfigMap"]["data"]["config.yaml"])
        assert settings["discovery"]["grpcPort"] == grpc_port  # where the replicas' gRPC is found


def test_a_grpc_only_fleet_is_discovered_by_its_grpc_port_alone():
    kinds = by_kind(render(resource({"backendPort": None, "grpcPort": "grpc"})))
    settings = yaml.safe_load(kinds["ConfigMap"]["data"]["config.yaml"])
    assert settings["discovery"]["port"] is None and settings["discovery"]["grpcPort"] == "grpc"
    assert "--grpc-port" in kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["command"]


@pytest.mark.parametrize("replicas, has_pdb", [(0, False), (1, False), (2, True), (5, True)])
def test_pdb_only_above_one_replica(replicas, has_pdb):
    assert ("PodDisruptionBudget" in by_kind(render(resource({"router": {"replicas": replicas}})))) is has_pdb


POLICY_CHANGES = [{"affinityBreakMargin": 0}, {"affinityBreakMargin": 9}, {"fullDeterminism": True},
                  {"session": {"headers": ["X-B"]}}, {"session": {"maxSessions": 5}}, {"policy": "least_loaded"},
                  {"selector": {"matchLabels": {"app": "other"}}}, {"backendPort": 9000},
                  {"metrics": {"keptPrefillSampleRate": 1}}]
ROLLING_CHANGES = [{"router": {"image": "x/y:2"}}, {"router": {"resources": {"requests": {"cpu": "2"}}}},
                   {"router": {"env": [{"name": "A", "value": "b"}]}}, {"router": {"nodeSelector": {"a": "b"}}},
                   {"router": {"sessionOwnership": False}}, {"router": {"imagePullSecrets": [{"name": "regcred"}]}}]


@pytest.mark.parametrize("change", POLICY_CHANGES)
def test_policy_and_discovery_changes_reach_routers_without_a_restart(change):
    before, after = by_kind(render(resource())), by_kind(render(resource(change)))
    assert before["Deployment"] == after["Deployment"]
    assert before["ConfigMap"] != after["ConfigMap"]


@pytest.mark.parametrize("change", ROLLING_CHANGES)
def test_runtime_changes_roll_the_deployment(change):
    before, after = by_kind(render(resource())), by_kind(render(resource(change)))
    assert before["Deployment"]["spec"]["template"] != after["Deployment"]["spec"]["template"]


@pytest.mark.parametrize("spec, field", [
    ({"selector": {"matchLabels": {"app.kubernetes.io/name": "rollout-router"}}}, "spec.selector"),
    ({"selector": {"matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "Exists"}]}}, "spec.selector"),
    ({"selector": {}}, "spec.selector"),
    ({"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}, "spec.selector"),
    # label keys and values the API server would refuse in the pod list (discovery and status failing for good)
    ({"selector": {"matchLabels": {"app": "vllm server"}}}, "spec.selector.matchLabels"),
    ({"selector": {"matchLabels": {"app": "vllm,gpu"}}}, "spec.selector.matchLabels"),
    ({"selector": {"matchLabels": {"a b": "vllm"}}}, "spec.selector.matchLabels"),
    ({"selector": {"matchExpressions": [{"key": "a/b/c", "operator": "Exists"}]}},
     "spec.selector.matchExpressions[0].key"),
    ({"selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["vllm", "no way"]}]}},
     "spec.selector.matchExpressions[0].values[1]"),
    # duplicate keys of a list the API server's apply refuses with a 500 (retried for good, no condition)
    ({"router": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}}, "spec.router.env[1].name"),
    ({"router": {"service": {"port": 8081}}}, "spec.router.service.port"),
    ({"router": {"imagePullSecrets": [{"name": "a"}, {"name": "a"}]}}, "spec.router.imagePullSecrets[1].name"),
    ({"router": {"imagePullSecrets": [{"name": "Reg_Cred"}]}}, "spec.router.imagePullSecrets[0].name"),
    ({"grpcPort": 9000, "router": {"service": {"port": 50051}}}, "spec.router.service.port"),
    ({"grpcPort": 8000}, "spec.grpcPort"),
    ({"backendPort": None}, "spec.backendPort"),
    ({"affinityBreakMargin": -1}, "spec.affinityBreakMargin"),
    ({"policy": "random"}, "spec.policy"),
    ({"router": {"replicas": "two"}}, "spec.router.replicas"),
    ({"router": {"env": [{"name": "POD_NAMESPACE", "value": "x"}]}}, "spec.router.env[0].name"),
    ({"router": {"tolerations": [{"operator": "Equal", "value": "v"}]}}, "spec.router.tolerations"),
    ({"router": {"service": {"type": "ExternalName"}}}, "spec.router.service.type"),
    ({"unknownField": 1}, "spec.unknownField"),
    ({"metrics": {"keptPrefillSampleRate": 2}}, "spec.metrics.keptPrefillSampleRate"),
])
def test_invalid_specs_name_their_field(spec, field):
    with pytest.raises(InvalidSpec) as error:
        render(resource(spec))
    assert field in str(error.value)


def test_long_names_are_refused():
    with pytest.raises(InvalidSpec, match="metadata.name"):
        render(resource(name="r" * 57))


@pytest.mark.parametrize("name", ["a.b", "1abc", "rollouts.team-a"])
def test_names_a_service_cannot_have_are_refused_before_any_child(name):
    """The API takes a RolloutRouter named like a DNS subdomain; its Service, named after it, must be an RFC 1035
    label: refused then, it came after the Deployment, whose pods ran without their Service."""
    with pytest.raises(InvalidSpec, match=r"metadata.name: .* must be lower-case letters, digits and '-'"):
        render(resource(name=name))


@pytest.mark.parametrize("margin, determinism, replicas", list(itertools.product([None, 0, 3], [False, True], [1, 2])))
def test_render_is_pure(margin, determinism, replicas):
    body = resource({"affinityBreakMargin": margin, "fullDeterminism": determinism, "router": {"replicas": replicas}})
    frozen = copy.deepcopy(body)
    assert render(body) == render(body)
    assert render(body, default_image="m/rr:1") == render(body, default_image="m/rr:1")
    assert render(body, token_key=b"k" * 32) == render(body, token_key=b"k" * 32)  # the token is derived, not drawn
    assert body == frozen


def test_cost_affinity_without_a_margin_is_an_invalid_spec():
    with pytest.raises(InvalidSpec, match="affinityBreakMargin: policy cost_affinity needs a number"):
        render(resource({"policy": "cost_affinity"}))
    assert render(resource({"policy": "cost_affinity", "affinityBreakMargin": 2}))


def test_the_rl_settings_reach_the_routers_config():
    spec = {"selector": {"matchLabels": {"app": "vllm"}}, "rl": {"maxQueuedRequests": 8, "onWeightUpdate": "clear"}}
    settings = parse_settings(yaml.safe_load(by_kind(render(resource(spec)))["ConfigMap"]["data"]["config.yaml"]))
    assert (settings.rl.max_queued_requests, settings.rl.on_weight_update) == (8, "clear")
    assert settings.rl.max_pause_seconds == 300.0


def test_the_group_key_settings_reach_the_routers_config():
    spec = resource({"group": {"headers": ["X-Prompt-ID"], "bodyFields": ["request_group_id"], "maxGroups": 64}})
    settings = parse_settings(yaml.safe_load(by_kind(render(spec))["ConfigMap"]["data"]["config.yaml"]))
    assert settings.group.headers == ["X-Prompt-ID"] and settings.group.body_fields == ["request_group_id"]
    assert settings.live_config().max_groups == 64
    assert parse_settings(yaml.safe_load(by_kind(render(resource()))["ConfigMap"]["data"]["config.yaml"])).group.headers \
        == ["X-Group-ID"]


def test_an_exposed_service_may_use_the_admin_port_number_for_traffic():
    """NodePort and LoadBalancer Services carry no admin port (it has a ClusterIP Service of its own)."""
    services = [m for m in render(resource({"router": {"service": {"type": "NodePort", "port": 8081}}}))
                if m["kind"] == "Service"]
    assert [p["port"] for s in services for p in s["spec"]["ports"]] == [8081, 8081]


def test_router_pods_pull_with_the_specs_secrets():
    """A private registry: the router pods name the pull Secrets (the chart's imagePullSecrets are the operator's)."""
    spec = {"router": {"image": "registry.example.com/rr:1", "imagePullSecrets": [{"name": "regcred"}]}}
    pod = by_kind(render(resource(spec)))["Deployment"]["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert "imagePullSecrets" not in by_kind(render(resource()))["Deployment"]["spec"]["template"]["spec"]

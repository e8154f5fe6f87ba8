"""render() for many router pods (spec.router.sessionOwnership) and the routers' admin token Secret."""
from __future__ import annotations

import base64
import re

import kubernetes_validate
import pytest

from rollout_router.app import STOP_GRACE_SECONDS
from rollout_router.fleet.node import advertised
from rollout_router_operator.render import InvalidSpec, admin_token, pod_labels, render, router_labels
from tests.k8s.emulator import selector_matches
from tests.test_chart import KUBE_VERSIONS, validate_rolloutrouter

KEY = b"operator-key-for-tests-0123456789"


def resource(spec: dict | None = None, name: str = "rr1", uid: str = "3f1c2d8e-0000-4000-8000-000000000001") -> dict:
    return {"apiVersion": "rolloutrouter.dev/v1alpha1", "kind": "RolloutRouter",
            "metadata": {"name": name, "namespace": "team", "uid": uid},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}}, **(spec or {})}}


def by_kind(manifests: list[dict]) -> dict[str, dict]:
    return {m["kind"]: m for m in manifests}


def container_of(manifests: list[dict]) -> dict:
    (container,) = by_kind(manifests)["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def test_session_ownership_is_on_by_default_and_names_the_router_pods_as_peers(monkeypatch):
    manifests = render(resource({"router": {"replicas": 3}}))
    container = container_of(manifests)
    command, env = container["command"], {e["name"]: e for e in container["env"]}
    selector = flag(command, "--peer-selector")
    template_labels = by_kind(manifests)["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert selector_matches(selector, template_labels)  # every router pod of this resource is a member
    assert not selector_matches(selector, {"app": "vllm"})  # never a replica
    assert not selector_matches(selector, pod_labels("other"))  # nor another resource's routers
    assert flag(command, "--peer-namespace") == "$(POD_NAMESPACE)"
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    admin_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "admin")
    assert "--advertise" not in command and flag(command, "--admin-port") == str(admin_port)
    listener = flag(command, "--admin-host") or "", admin_port
    for pod_ip, member in (("10.1.2.3", "http://10.1.2.3:8081"), ("fd00::7", "http://[fd00::7]:8081")):
        monkeypatch.setenv("POD_IP", pod_ip)
        assert advertised(*listener) == member  # how the pod names itself to its peers, IPv4 or IPv6
    # The kubelet expands $(VAR) only for variables the container defines; any other stays literal.
    assert set(re.findall(r"\$\((\w+)\)", " ".join(command))) <= set(env)


@pytest.mark.parametrize("router", [{"replicas": 3}, {"replicas": 1, "sessionOwnership": False}])
def test_a_stopped_router_pod_drains_within_its_grace_period(router):
    """Every router pod drains on SIGTERM (alone or in a fleet): it accepts a few seconds more while the Service's
    endpoints catch up, within a drain the pod's grace period covers."""
    manifests = render(resource({"router": router}))
    pod = by_kind(manifests)["Deployment"]["spec"]["template"]["spec"]
    command = container_of(manifests)["command"]
    drain = float(flag(command, "--drain-timeout") or "nan")
    accepting = float(flag(command, "--drain-accept-seconds") or "nan")
    assert 0 < accepting < drain
    # the drain, then closing the listeners (gRPC's grace), then a margin for the interpreter to exit
    assert 0 < drain and drain + STOP_GRACE_SECONDS + 5 <= pod["terminationGracePeriodSeconds"]


def test_without_session_ownership_each_pod_decides_alone_as_before():
    container = container_of(render(resource({"router": {"replicas": 3, "sessionOwnership": False}})))
    assert not {"--peer-selector", "--peer-namespace", "--advertise", "--peer"} & set(container["command"])
    assert "POD_IP" not in {e["name"] for e in container["env"]}


def test_session_owner_entry_adds_the_ownership_flag_and_nothing_else():
    rendezvous = render(resource({"router": {"replicas": 3}}))
    entry = render(resource({"router": {"replicas": 3, "sessionOwner": "Entry"}}))
    assert "--ownership" not in container_of(rendezvous)["command"]  # the default: as before
    command = container_of(entry)["command"]
    assert flag(command, "--ownership") == "entry" and flag(command, "--peer-selector")
    assert command[:command.index("--ownership")] == container_of(rendezvous)["command"]
    assert by_kind(entry)["Service"] == by_kind(rendezvous)["Service"]  # no ClientIP affinity either way
    assert by_kind(entry)["ConfigMap"] == by_kind(rendezvous)["ConfigMap"]


@pytest.mark.parametrize("value", ["entry", "Hash", None, True])
def test_session_owner_is_rendezvous_or_entry(value):
    body = resource({"router": {"sessionOwner": value}})
    with pytest.raises(Exception, match="sessionOwner"):
        validate_rolloutrouter(body)
    with pytest.raises(InvalidSpec, match=r"spec\.router\.sessionOwner"):
        render(body)


def test_session_owner_entry_needs_session_ownership():
    with pytest.raises(InvalidSpec, match=r"spec\.router\.sessionOwner: sessionOwner Entry needs sessionOwnership true"):
        render(resource({"router": {"sessionOwnership": False, "sessionOwner": "Entry"}}))


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_session_ownership_is_a_strict_boolean(value):
    body = resource({"router": {"sessionOwnership": value}})
    with pytest.raises(Exception, match="sessionOwnership"):
        validate_rolloutrouter(body)  # the CRD schema
    with pytest.raises(InvalidSpec, match=r"spec\.router\.sessionOwnership"):
        render(body)  # and the operator


def test_pod_ip_is_set_by_the_operator():
    with pytest.raises(InvalidSpec, match=r"spec\.router\.env\[0\]\.name: POD_IP is set by the operator"):
        render(resource({"router": {"env": [{"name": "POD_IP", "value": "1.2.3.4"}]}}))


def test_the_routers_role_is_what_peer_discovery_needs_and_no_more():
    """Peers are found by the same pod watch as the replicas: pods in the router's namespace, read only."""
    for owned in (True, False):
        role = by_kind(render(resource({"router": {"sessionOwnership": owned}})))["Role"]
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
        assert "namespace" in role["metadata"] and role["kind"] == "Role"  # namespaced, never a ClusterRole


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("grpc", [False, True])
def test_network_policy_admits_router_pods_to_each_others_traffic_and_admin_ports(kube_version, grpc):
    """Peers forward requests to the owner's traffic ports and poll /fleet/v1/* on its admin port."""
    spec = {"networkPolicy": {"enabled": True}, **({"grpcPort": 9000} if grpc else {})}
    body = resource(spec)
    validate_rolloutrouter(body)
    policy = by_kind(render(body))["NetworkPolicy"]
    kubernetes_validate.validate(policy, kube_version, strict=True)
    traffic = [{"protocol": "TCP", "port": 8080}, *([{"protocol": "TCP", "port": 50051}] if grpc else [])]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": router_labels("rr1")}}],
                                          "ports": [*traffic, {"protocol": "TCP", "port": 8081}]}]
    alone = by_kind(render(resource({**spec, "router": {"sessionOwnership": False}})))["NetworkPolicy"]
    assert alone["spec"]["ingress"] == []  # as before: enabled with no peers, nothing reaches the routers


def test_the_admin_token_secret_is_mounted_and_required_on_the_admin_routes():
    manifests = render(resource(), token_key=KEY)
    kinds = [m["kind"] for m in manifests]
    assert kinds.index("Secret") < kinds.index("Deployment")  # the pod cannot start without its token file
    secret = by_kind(manifests)["Secret"]
    assert secret["metadata"]["name"] == "rr1-router-admin-token" and secret["type"] == "Opaque"
    assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rollout-router-operator"
    assert set(secret["data"]) == {"token"}
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert token == admin_token(KEY, resource()) and len(token) == 64
    container = container_of(manifests)
    pod = by_kind(manifests)["Deployment"]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v.get("secret"))
    assert volume["secret"] == {"secretName": "rr1-router-admin-token"}
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert mount["readOnly"] is True and "subPath" not in mount  # a directory mount: a changed token reaches the pod
    assert flag(container["command"], "--admin-token-file") == f"{mount['mountPath']}/token"
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(secret, version, strict=True)


def test_each_resource_has_its_own_token_and_the_key_never_leaves_the_operator():
    tokens = {admin_token(KEY, resource(name=name, uid=uid)) for name in ("a", "b") for uid in ("u1", "u2")}
    assert len(tokens) == 4  # per name, and new when a resource is deleted and created again (new uid)
    assert admin_token(b"another-operator-key-0123456789", resource()) != admin_token(KEY, resource())
    rendered = repr(render(resource(), token_key=KEY))
    assert KEY.decode() not in rendered and base64.b64encode(KEY).decode() not in rendered


@pytest.mark.parametrize("body, key", [(resource({"router": {"adminToken": False}}), KEY), (resource(), None)])
def test_no_token_without_a_key_or_with_admin_token_off(body, key):
    manifests = render(body, token_key=key)
    assert "Secret" not in by_kind(manifests)
    container = container_of(manifests)
    assert "--admin-token-file" not in container["command"]
    assert not any(v.get("secret") for v in by_kind(manifests)["Deployment"]["spec"]["template"]["spec"]["volumes"])

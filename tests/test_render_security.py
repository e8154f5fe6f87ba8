"""What a RolloutRouter may not do and what shields its routers: the image allowlist, spec.networkPolicy,
and a resource whose status is null reaching the handlers."""
from __future__ import annotations

import re

import kopf
import kubernetes_validate
import pytest

from rollout_router_operator import handlers
from rollout_router_operator.render import InvalidSpec, render, router_labels
from tests.test_chart import KUBE_VERSIONS, validate_rolloutrouter

CLIENTS = [{"podSelector": {"matchLabels": {"app": "rollout-worker"}}},
           {"namespaceSelector": {"matchLabels": {"team": "rl"}}, "podSelector": {"matchLabels": {"role": "trainer"}}},
           {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}}]
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
OPERATOR = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rollout-router-system"}}}


def resource(spec: dict | None = None) -> dict:
    return {"apiVersion": "rolloutrouter.dev/v1alpha1", "kind": "RolloutRouter",
            "metadata": {"name": "rr1", "namespace": "ns", "uid": "3f1c2d8e-0000-4000-8000-000000000001"},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}}, **(spec or {})}}


def policy_of(manifests: list[dict]) -> dict | None:
    return next((m for m in manifests if m["kind"] == "NetworkPolicy"), None)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_network_policy_admits_the_clients_to_traffic_and_prometheus_to_the_admin_port(kube_version):
    body = resource({"grpcPort": 9000, "networkPolicy": {"enabled": True, "clients": CLIENTS, "prometheus": PROMETHEUS,
                                                         "admin": [OPERATOR]}})
    validate_rolloutrouter(body)
    policy = policy_of(render(body))
    kubernetes_validate.validate(policy, kube_version, strict=True)
    assert policy["metadata"]["name"] == "rr1-router"
    assert policy["spec"]["podSelector"] == {"matchLabels": router_labels("rr1")}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    traffic, metrics, peers = policy["spec"]["ingress"]
    assert traffic["from"] == CLIENTS
    assert traffic["ports"] == [{"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 50051}]
    assert metrics == {"from": [PROMETHEUS, OPERATOR], "ports": [{"protocol": "TCP", "port": 8081}]}
    assert peers["from"] == [{"podSelector": {"matchLabels": router_labels("rr1")}}]  # session ownership's peers
    assert peers["ports"] == [*traffic["ports"], *metrics["ports"]]
    deployment = next(m for m in render(body) if m["kind"] == "Deployment")
    ports = {p["containerPort"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports == {8080, 8081, 50051}  # the policy names every port the router listens on


def test_network_policy_without_clients_lets_only_prometheus_in_and_is_off_by_default():
    alone = {"sessionOwnership": False}  # with it, the router pods also reach each other (tests/test_render_fleet.py)
    only_prometheus = policy_of(render(resource({"networkPolicy": {"enabled": True, "prometheus": PROMETHEUS},
                                                 "router": alone})))
    assert only_prometheus["spec"]["ingress"] == [{"from": [PROMETHEUS], "ports": [{"protocol": "TCP", "port": 8081}]}]
    closed = policy_of(render(resource({"networkPolicy": {"enabled": True}, "router": alone})))
    assert closed["spec"]["ingress"] == []  # enabled with no peers: nothing reaches the routers
    assert policy_of(render(resource())) is None
    assert policy_of(render(resource({"networkPolicy": {"enabled": False, "clients": CLIENTS}}))) is None


def test_the_network_policy_is_applied_before_the_router_pods_can_start():
    kinds = [m["kind"] for m in render(resource({"networkPolicy": {"enabled": True, "clients": CLIENTS}}))]
    assert kinds.index("NetworkPolicy") < kinds.index("Deployment")  # children are applied in order


@pytest.mark.parametrize("peer", [{}, {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}, {"podName": "x"}])
def test_a_peer_must_be_selectors_or_an_ip_block(peer):
    with pytest.raises(InvalidSpec, match=r"spec\.networkPolicy\.clients\[0\]"):
        render(resource({"networkPolicy": {"enabled": True, "clients": [peer]}}))


@pytest.mark.parametrize(("peer", "problem"), [
    ({"ipBlock": {"cidr": "10.0.0.0/33"}}, r"ipBlock\.cidr: .*'10\.0\.0\.0/33' is not a CIDR"),
    ({"ipBlock": {"cidr": "10.0.0.1"}}, r"ipBlock\.cidr: .*'10\.0\.0\.1' is not a CIDR"),
    ({"ipBlock": {"cidr": "10.0.0.0/255.0.0.0"}}, r"'10\.0\.0\.0/255\.0\.0\.0' is not a CIDR"),  # Python reads netmasks
    ({"ipBlock": {"cidr": "fe80::%eth0/64"}}, r"'fe80::%eth0/64' is not a CIDR"),  # ... and zones; Go does not
    ({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}, r"except\[0\] '10\.0\.0\.0/8' must be a strict"),
    ({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16", "192.168.0.0/16"]}}, r"except\[1\]"),
    ({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::/64"]}}, r"except\[0\] 'fd00::/64' must be a strict"),
    ({"podSelector": {"matchExpressions": [{"key": "role", "operator": "In"}]}},
     r"podSelector\.matchExpressions\[0\]: In and NotIn need values"),
    ({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists", "values": ["rl"]}]}},
     r"namespaceSelector\.matchExpressions\[0\]: .*Exists and DoesNotExist take none"),
])
def test_a_peer_the_api_server_would_refuse_is_an_invalid_spec_before_any_child(peer, problem):
    """Refused by the operator, not by the API server when the NetworkPolicy is applied: a bad peer names its
    field in the resource's condition and no child is applied (not the ConfigMap before a refused policy)."""
    with pytest.raises(InvalidSpec, match=r"spec\.networkPolicy\.clients\[0\]") as refused:
        render(resource({"networkPolicy": {"enabled": True, "clients": [peer]}}))
    assert re.search(problem, str(refused.value)), refused.value
    good = {"ipBlock": {"cidr": "10.0.0.1/8", "except": ["10.0.5.0/24", "10.1.0.0/16"]}}  # host bits may be set
    assert policy_of(render(resource({"networkPolicy": {"enabled": True, "clients": [good]}}))) is not None


def test_an_image_off_the_allowlist_is_an_invalid_spec_and_renders_nothing():
    allowed = ["registry.example.com/rollout-router:*", "ghcr.io/rolloutrouter/rollout-router@sha256:*"]
    assert render(resource({"router": {"image": "registry.example.com/rollout-router:1.2"}}), allowed_images=allowed)
    assert render(resource({"router": {"image": "ghcr.io/rolloutrouter/rollout-router@sha256:ab"}}), allowed_images=allowed)
    for image in ("registry.example.com/other:1", "evil.example/rollout-router:1",
                  "registry.example.com/rollout-router"):  # no tag: not "...:*"
        with pytest.raises(InvalidSpec, match=r"^spec\.router\.image: .* is not an allowed router image"):
            render(resource({"router": {"image": image}}), allowed_images=allowed)
    assert render(resource({"router": {"image": "anything.example/x:1"}}))  # no allowlist: any image


def _handler(registry: kopf.OperatorRegistry, name: str):
    """One registered handler's function (kopf keeps them in per-kind registries)."""
    found = [h.fn for reg in (registry._changing, registry._spawning) for h in reg.get_all_handlers()
             if h.fn.__name__ == name]
    return found[0]


async def test_a_null_status_reaches_reconcile_and_the_timer_without_error(monkeypatch):
    """Seen: ``dict(body.status)`` failed with 'NoneType' object is not iterable on ``status: null``."""
    written: list[dict] = []

    async def patch_status(namespace, name, status):
        written.append(status)

    async def apply(manifest):
        pass

    async def list_nothing(namespace, selector):
        return []
    monkeypatch.setattr(handlers.kube, "patch_status", patch_status)
    monkeypatch.setattr(handlers.kube, "apply", apply)
    monkeypatch.setattr(handlers.kube, "delete", lambda *args: apply(None))
    monkeypatch.setattr("rollout_router_operator.status.kube.list_pods", list_nothing)
    monkeypatch.setattr("rollout_router_operator.status.kube.list_replicasets", list_nothing)
    registry = kopf.OperatorRegistry()
    handlers.register(registry, 1.0, "example.com/rr:1", ["example.com/*"])
    body = resource({"router": {"image": "elsewhere.example/rr:1"}})  # off the allowlist: the invalid branch
    body["metadata"]["generation"] = 1
    memo = kopf.Memo()
    logger = kopf.LocalObjectLogger(body=kopf.Body(body), settings=kopf.OperatorSettings())
    await _handler(registry, "reconcile")(body=kopf.Body({**body, "status": None}), retry=0, reason="create",
                                          memo=memo, logger=logger)
    assert written[-1]["conditions"][2]["reason"] == "InvalidSpec"
    body["spec"]["router"] = {}
    await _handler(registry, "reconcile")(body=kopf.Body({**body, "status": None}), retry=0, reason="update",
                                          memo=memo, logger=logger)
    await _handler(registry, "refresh")(body=kopf.Body({**body, "status": None}), memo=kopf.Memo())
    assert written[-1]["observedGeneration"] is None and written[-1]["routers"]["summary"] == "0/1"

"""Pure rendering: one RolloutRouter resource -> the Kubernetes objects it owns.

No API calls and no clock here, so every child can be tested from a dict. The
router's settings go into a ConfigMap that the router re-reads on change, so
policy knobs (margin, determinism, session) reach running routers without a
restart, and so do selector and port changes (the router restarts its pod
watch); the pod template changes only with image, resources, scheduling, env,
annotations, session ownership (and its sessionOwner) and the admin token's presence, and only then
does the Deployment roll.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

import yaml
from pydantic import ValidationError

from rollout_router.kube.selectors import labels_query, matches
from rollout_router.settings import DiscoverySettings, PolicySettings, RouterSettings, label_key, label_value

from .spec import DEFAULT_IMAGE, GROUP, KIND, MAX_WORKERS, VERSION, RolloutRouterSpec

CONFIG_DIR, CONFIG_FILE = "/etc/rollout-router", "config.yaml"
ROUTER_PORT = 8080
ROUTER_ADMIN_PORT = 8081  # the router's admin listener: /metrics, /status, sessions, probes
ROUTER_GRPC_PORT = 50051  # the router's gRPC listener, opened when the replicas serve gRPC (spec.grpcPort)
# A router pod that is stopped drains for at most ROUTER_DRAIN_SECONDS: /readyz fails at once, new connections are
# still accepted for ROUTER_ACCEPT_SECONDS (while the Service's endpoints catch up: kube-proxy and the Gateways
# follow them within a few seconds), then refused; what it accepted finishes (with session ownership, its pins go
# to the other pods), then it closes its listeners (gRPC's grace: 2 s): all well within the pod's grace period.
ROUTER_DRAIN_SECONDS = 20
ROUTER_ACCEPT_SECONDS = 5
ROUTER_TERMINATION_GRACE_SECONDS = 30
TOKEN_DIR, TOKEN_FILE = "/var/run/secrets/rollout-router", "token"  # the admin token Secret, mounted
RUN_AS = 65532  # the "nonroot" user of distroless images
MAX_NAME = 56  # children are "<name>-router", and a Service name is at most 63 characters
MAX_EXPOSED_NAME = 50  # ... and an exposed router's admin Service is "<name>-router-admin"
RESERVED_ENV = {"POD_NAME", "POD_NAMESPACE", "POD_IP", "PYTHONDONTWRITEBYTECODE"}
# On the router Service of a resource with its own ServiceMonitor; the chart's ServiceMonitor skips such Services.
OWN_MONITOR_LABEL = {"rolloutrouter.dev/service-monitor": "own"}
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # RFC 1035: what a Service's name must be


class InvalidSpec(ValueError):
    """A spec the operator cannot turn into working routers; the message names the field."""


def router_labels(name: str) -> dict[str, str]:
    """The labels that select one resource's router pods (Deployment, Service, status polling)."""
    return {"app.kubernetes.io/name": "rollout-router", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "router"}


def pod_labels(name: str) -> dict[str, str]:
    """Every child's labels: the selecting ones plus who manages them."""
    return {**router_labels(name), "app.kubernetes.io/managed-by": "rollout-router-operator"}


def child_name(name: str) -> str:
    return f"{name}-router"


def admin_service_name(name: str) -> str:
    """The admin port's own Service when the traffic Service is exposed (NodePort, LoadBalancer): named like
    the other children, so it never takes the name of a Service of the user's."""
    return f"{child_name(name)}-admin"


def token_secret_name(name: str) -> str:
    return f"{child_name(name)}-admin-token"


def admin_token(token_key: bytes, resource: dict) -> str:
    """The admin token of one resource's routers: an HMAC of its identity under the operator's key.

    Derived, not drawn at random, so ``render`` stays pure and the status poller knows every token
    without reading a Secret (the operator has no read access to Secrets). The uid makes a resource
    deleted and created again under the same name get a new token."""
    meta = resource["metadata"]
    identity = f"{meta['namespace']}/{meta['name']}/{meta['uid']}".encode()
    return hmac.new(token_key, identity, hashlib.sha256).hexdigest()


def token_for(resource: dict, spec: RolloutRouterSpec, token_key: bytes | None) -> str | None:
    """The token the resource's routers require, or None: no key, or ``spec.router.adminToken: false``."""
    return admin_token(token_key, resource) if token_key is not None and spec.router.admin_token else None


def child_refs(name: str) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every child a resource may have, rendered now or not."""
    full = child_name(name)
    return [("v1", "ServiceAccount", full), ("rbac.authorization.k8s.io/v1", "Role", full),
            ("rbac.authorization.k8s.io/v1", "RoleBinding", full), ("v1", "Secret", token_secret_name(name)),
            ("v1", "ConfigMap", f"{full}-config"),
            ("apps/v1", "Deployment", full), ("v1", "Service", full),
            *([("v1", "Service", admin_service_name(name))] if len(name) <= MAX_EXPOSED_NAME else []),
            ("policy/v1", "PodDisruptionBudget", full),
            ("networking.k8s.io/v1", "NetworkPolicy", full), ("monitoring.coreos.com/v1", "ServiceMonitor", full)]


def describe_spec_error(error: ValidationError) -> str:
    """One clause per problem, each starting with the field's path, e.g. ``spec.router.env[0].name``."""
    clauses = []
    for item in error.errors():
        path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        clauses.append(f"spec{path}: {message}" if path else f"spec.{message}")  # model rules name their field
    return "; ".join(clauses)


def parse_spec(resource: dict) -> RolloutRouterSpec:
    """The spec as the operator will use it, or InvalidSpec naming what is wrong."""
    name = resource["metadata"]["name"]
    try:
        spec = RolloutRouterSpec.model_validate(resource.get("spec") or {})
    except ValidationError as error:
        raise InvalidSpec(describe_spec_error(error)) from None
    if len(name) > MAX_NAME:
        raise InvalidSpec(f"metadata.name: at most {MAX_NAME} characters (children are named {child_name(name)!r})")
    if spec.router.service.type != "ClusterIP" and len(name) > MAX_EXPOSED_NAME:
        raise InvalidSpec(f"metadata.name: at most {MAX_EXPOSED_NAME} characters with spec.router.service.type "
                          f"{spec.router.service.type} (its admin port's Service is {admin_service_name(name)!r})")
    if not DNS_LABEL.fullmatch(name):  # kopf takes any DNS subdomain; the Service would be refused after the pods ran
        raise InvalidSpec(f"metadata.name: {name!r} must be lower-case letters, digits and '-', starting with a "
                          f"letter (the Service {child_name(name)!r} is named after it)")
    if matches(spec.selector, pod_labels(name)):
        raise InvalidSpec("spec.selector: matches the router's own pods; select the vLLM pods only")
    if spec.grpc_port is not None and str(spec.grpc_port) == str(spec.backend_port):
        raise InvalidSpec("spec.grpcPort: must differ from spec.backendPort")
    if spec.backend_port is None and spec.grpc_port is None:
        raise InvalidSpec("spec.backendPort: null (gRPC-only replicas) needs spec.grpcPort")
    _check_router(spec)
    for label, value in spec.service_monitor.labels.items():
        if label in pod_labels(name):
            raise InvalidSpec(f"spec.serviceMonitor.labels: {label} is set by the operator")
        if not label_key(label) or not label_value(value):
            raise InvalidSpec(f"spec.serviceMonitor.labels: {label}={value} is not a Kubernetes label")
    return spec


def _check_router(spec: RolloutRouterSpec) -> None:
    """What the API server would refuse at apply as a duplicate key of a list (an env name, a Service port):
    it answers 500, which kopf retries for good without a condition naming the field."""
    seen: set[str] = set()
    for index, env in enumerate(spec.router.env):
        if env.name in RESERVED_ENV:
            raise InvalidSpec(f"spec.router.env[{index}].name: {env.name} is set by the operator")
        if env.name in seen:
            raise InvalidSpec(f"spec.router.env[{index}].name: {env.name} is set twice")
        seen.add(env.name)
    names = [secret.name for secret in spec.router.image_pull_secrets]
    for index, secret in enumerate(names):
        if secret in names[:index]:
            raise InvalidSpec(f"spec.router.imagePullSecrets[{index}].name: {secret} is named twice")
    service = spec.router.service
    taken = {**({ROUTER_ADMIN_PORT: "admin"} if service.type == "ClusterIP" else {}),
             **({ROUTER_GRPC_PORT: "grpc"} if spec.grpc_port is not None else {})}
    if service.port in taken:
        raise InvalidSpec(f"spec.router.service.port: {service.port} is the router Service's "
                          f"{taken[service.port]} port; choose another")


def check_image(spec: RolloutRouterSpec, allowed_images: Sequence[str]) -> None:
    """InvalidSpec when ``spec.router.image`` matches none of the operator's ``--allowed-image`` patterns.

    The operator's own ``--router-image`` (used when the spec names none) is always allowed."""
    image = spec.router.image
    if image is not None and allowed_images and not any(fnmatchcase(image, pattern) for pattern in allowed_images):
        raise InvalidSpec(f"spec.router.image: {image} is not an allowed router image "
                          f"(the operator allows {', '.join(allowed_images)})")


def router_settings(namespace: str, spec: RolloutRouterSpec) -> RouterSettings:
    """What the router reads from --config: the policy knobs (every field of ``PolicySettings``, so a new one is
    never dropped on the way), the RL settings, plus pod discovery."""
    policy = {field: getattr(spec, field) for field in (*PolicySettings.model_fields, "rl")}
    discovery = DiscoverySettings(namespace=namespace, selector=spec.selector, port=spec.backend_port,
                                  grpc_port=spec.grpc_port)
    return RouterSettings(**policy, discovery=discovery, metrics=spec.metrics)


def render(resource: dict, default_image: str = DEFAULT_IMAGE, allowed_images: Sequence[str] = (),
           token_key: bytes | None = None) -> list[dict]:
    """Every child of ``resource``, in apply order (RBAC, token and config before the Deployment).

    ``default_image`` runs the routers when ``spec.router.image`` is unset: the operator's
    ``--router-image``, so a chart's image override reaches router pods without touching render's purity.
    ``allowed_images`` (the operator's ``--allowed-image`` patterns; empty: any) bounds ``spec.router.image``.
    ``token_key`` is the operator's key for admin tokens (``admin_token``); without one no token is
    rendered, whatever ``spec.router.adminToken`` says (the operator always has one).
    """
    meta = resource["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    spec = parse_spec(resource)
    check_image(spec, allowed_images)
    labels = pod_labels(name)
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": name, "uid": meta["uid"],
             "controller": True, "blockOwnerDeletion": True}

    def child(api_version: str, kind: str, object_name: str, extra_labels: dict[str, str] | None = None,
              **body: Any) -> dict:
        return {"apiVersion": api_version, "kind": kind,
                "metadata": {"name": object_name, "namespace": namespace, "labels": {**(extra_labels or {}), **labels},
                             "ownerReferences": [owner]},
                **body}

    full = child_name(name)
    settings = router_settings(namespace, spec)
    token = token_for(resource, spec, token_key)
    secret = [child("v1", "Secret", token_secret_name(name), type="Opaque",
                    data={TOKEN_FILE: base64.b64encode(token.encode()).decode()})] if token else []
    children = [
        child("v1", "ServiceAccount", full),
        child("rbac.authorization.k8s.io/v1", "Role", full, rules=[
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]),
        child("rbac.authorization.k8s.io/v1", "RoleBinding", full,
              roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": full},
              subjects=[{"kind": "ServiceAccount", "name": full, "namespace": namespace}]),
        *secret,
        child("v1", "ConfigMap", f"{full}-config", data={CONFIG_FILE: yaml.safe_dump(settings.dump(), sort_keys=False)}),
        # Before the Deployment (children are applied in order): no router pod runs before its ingress is narrowed.
        *([child("networking.k8s.io/v1", "NetworkPolicy", full, spec=_network_policy_spec(name, spec))]
          if spec.network_policy.enabled else []),
        child("apps/v1", "Deployment", full, spec=_deployment_spec(name, spec, labels, default_image, bool(secret))),
        *(child("v1", "Service", service, OWN_MONITOR_LABEL if spec.service_monitor.enabled else None, spec=body)
          for service, body in _services(name, spec)),
    ]
    if spec.router.replicas > 1:
        children.append(child("policy/v1", "PodDisruptionBudget", full, spec={
            "maxUnavailable": 1, "selector": {"matchLabels": router_labels(name)}}))
    if spec.service_monitor.enabled:
        children.append(child("monitoring.coreos.com/v1", "ServiceMonitor", full, spec.service_monitor.labels,
                              spec=_service_monitor_spec(name, spec, token_secret_name(name) if secret else None)))
    return children


def _service_monitor_spec(name: str, spec: RolloutRouterSpec, token_secret: str | None) -> dict:
    """The chart's router ServiceMonitor narrowed to this resource's Service, plus its admin token: the
    Prometheus Operator reads the Secret (in this namespace) and sends ``Authorization: Bearer``."""
    monitor = spec.service_monitor
    endpoint: dict[str, Any] = {
        "port": "admin", "path": "/metrics", "scheme": "http",
        "interval": monitor.interval, "scrapeTimeout": monitor.scrape_timeout,
        # the dashboard's $rolloutrouter variable, as the chart's ServiceMonitor sets it
        "relabelings": [{"sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_instance"],
                         "targetLabel": "rolloutrouter", "action": "replace"}]}
    if token_secret is not None:
        endpoint["authorization"] = {"type": "Bearer", "credentials": {"name": token_secret, "key": TOKEN_FILE}}
    return {"jobLabel": "app.kubernetes.io/name", "selector": {"matchLabels": router_labels(name)},
            "endpoints": [endpoint]}


def _services(name: str, spec: RolloutRouterSpec) -> list[tuple[str, dict]]:
    """(name, spec) of the router's Services. A ClusterIP Service carries the traffic ports and the admin port;
    a NodePort or LoadBalancer one only the traffic ports, and the admin port (``/status``, ``/metrics``, the
    fleet's routes: what Prometheus scrapes) gets a ClusterIP Service of its own, ``<name>-router-admin``, so
    exposing the traffic never exposes the admin listener and its connection limit beyond the cluster. That one
    comes first: applied in order, the admin port has a Service all along when the type changes."""
    admin = {"name": "admin", "port": ROUTER_ADMIN_PORT, "targetPort": "admin", "protocol": "TCP"}
    exposed = spec.router.service.type != "ClusterIP"
    traffic = {"type": spec.router.service.type, "selector": router_labels(name), **_affinity(spec), "ports": [
        {"name": "http", "port": spec.router.service.port, "targetPort": "http", "protocol": "TCP"},
        *([] if exposed else [admin]),
        *([{"name": "grpc", "port": ROUTER_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP",
            "appProtocol": "grpc"}] if spec.grpc_port is not None else [])]}
    admin_service = {"type": "ClusterIP", "selector": router_labels(name), "ports": [admin]}
    return [*([(admin_service_name(name), admin_service)] if exposed else []), (child_name(name), traffic)]


def _affinity(spec: RolloutRouterSpec) -> dict:
    """The Service's client affinity. Without session ownership pins live in each router pod, and ClientIP
    affinity keeps a rollout worker's turns on one router; with it any pod reaches the session's owner, and
    ClientIP affinity would only pile a job with few client pods onto few routers."""
    return {} if spec.router.session_ownership else {"sessionAffinity": "ClientIP"}


def _network_policy_spec(name: str, spec: RolloutRouterSpec) -> dict:
    """Ingress to the router pods from the declared clients (traffic ports), Prometheus and admin peers (admin port),
    and with session ownership from the resource's other router pods (traffic ports: forwarded requests; admin
    port: /fleet/v1 loads and pin handoffs; with several workers a pod, every port: each worker's private traffic
    ports, where forwarded requests come, are free ports chosen as it starts).

    Egress is left open: the routers reach the vLLM pods, named by a selector that may change, and the API server.
    """
    policy = spec.network_policy

    def peers(items: list) -> list[dict]:
        return [_without_nulls(peer.dump()) for peer in items]
    traffic = [{"protocol": "TCP", "port": ROUTER_PORT},
               *([{"protocol": "TCP", "port": ROUTER_GRPC_PORT}] if spec.grpc_port is not None else [])]
    admin = [*([policy.prometheus] if policy.prometheus is not None else []), *policy.admin]
    rules = []
    if policy.clients:
        rules.append({"from": peers(policy.clients), "ports": traffic})
    if admin:
        rules.append({"from": peers(admin), "ports": [{"protocol": "TCP", "port": ROUTER_ADMIN_PORT}]})
    if fleet_ports(spec):  # workers (with session ownership): their private traffic ports are any free one
        rules.append({"from": [{"podSelector": {"matchLabels": router_labels(name)}}]})
    elif spec.router.session_ownership:
        rules.append({"from": [{"podSelector": {"matchLabels": router_labels(name)}}],
                      "ports": [*traffic, {"protocol": "TCP", "port": ROUTER_ADMIN_PORT}]})
    return {"podSelector": {"matchLabels": router_labels(name)}, "policyTypes": ["Ingress"], "ingress": rules}


def _without_nulls(value: Any) -> Any:
    """A dumped model without its unset (null) fields and empty lists, as a manifest writes it."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None and v != []}
    return value


def _fleet_args(name: str, spec: RolloutRouterSpec) -> list[str]:
    """Session ownership: the members are the Ready pods with this resource's router labels, each
    addressed by its pod IP and admin port (a pod names itself so from ``$POD_IP``, in brackets when it is
    IPv6: no ``--advertise``, which could not bracket it); a pod stopped leaves the
    fleet as it drains (docs/fleet.md, "Leaving the fleet"). ``sessionOwner: Entry``: the
    pod a turn enters by owns its session (docs/fleet.md, "Entry ownership"); a flag, so changing it rolls
    the pods rather than switching a running fleet's routers one by one as the kubelet updates each config."""
    if not spec.router.session_ownership:
        return []
    entry = ["--ownership", "entry"] if spec.router.session_owner == "Entry" else []
    return ["--peer-selector", labels_query(router_labels(name)), "--peer-namespace", "$(POD_NAMESPACE)", *entry]


def workers(spec: RolloutRouterSpec) -> int:
    """Router processes per pod: ``spec.router.workers``, else the CPU limit rounded down (at least 1, at most
    ``MAX_WORKERS``, the spec field's bound; no limit,
    or ``sessionOwner: Entry``, under which a session's pin would follow its connections between the workers: 1)."""
    router = spec.router
    if router.workers is not None:
        return router.workers
    limit = router.resources.limits.get("cpu")
    entry = router.session_ownership and router.session_owner == "Entry"
    return 1 if entry or limit is None else min(MAX_WORKERS, max(1, int(cores(limit))))


def fleet_ports(spec: RolloutRouterSpec) -> list[dict]:
    """With session ownership and several workers, each worker's admin port, where the other pods reach it as a
    member of their fleet (``rollout_router.fleet.peerpods``: named ``fleet-<i>``; ``serve`` binds worker i's at
    the admin port + 1 + i)."""
    count = workers(spec)
    if not spec.router.session_ownership or count == 1:
        return []
    return [{"name": f"fleet-{i}", "containerPort": ROUTER_ADMIN_PORT + 1 + i, "protocol": "TCP"}
            for i in range(count)]


def cores(quantity: int | str) -> float:
    """A CPU quantity in cores: 2, "2", "1.5", "2500m" (the API server has checked its syntax)."""
    text = str(quantity)
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)(m?)", text)
    if match is None:
        raise InvalidSpec(f"spec.router.resources.limits.cpu: {text!r} is not a CPU quantity (2, 1.5, 2500m)")
    return float(match[1]) / (1000 if match[2] else 1)


def _workers_args(spec: RolloutRouterSpec) -> list[str]:
    count = workers(spec)
    return ["--workers", str(count)] if count > 1 else []


def _deployment_spec(name: str, spec: RolloutRouterSpec, labels: dict, default_image: str, token: bool) -> dict:
    """The router Deployment; ``token``: mount the admin token Secret and require it on the admin routes."""
    router = spec.router
    env = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        *([{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
          if router.session_ownership else []),
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},  # the root filesystem is read-only
        *({k: v for k, v in e.dump().items() if v is not None} for e in router.env),
    ]
    # Liveness on the admin port: a flood of clients at the traffic port's connection limit never gets the pod
    # killed. Readiness on the traffic port: the Service sends traffic only where that port answers.
    probe = {"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 10, "timeoutSeconds": 3,
             "failureThreshold": 3}
    grpc = spec.grpc_port is not None  # replicas serve gRPC: so does the router, beside HTTP
    grpc_args = ["--grpc-port", str(ROUTER_GRPC_PORT)] if grpc else []
    grpc_ports = [{"name": "grpc", "containerPort": ROUTER_GRPC_PORT, "protocol": "TCP"}] if grpc else []
    token_args = ["--admin-token-file", f"{TOKEN_DIR}/{TOKEN_FILE}"] if token else []
    token_mounts = [{"name": "admin-token", "mountPath": TOKEN_DIR, "readOnly": True}] if token else []
    token_volumes = [{"name": "admin-token", "secret": {"secretName": token_secret_name(name)}}] if token else []
    container = {
        "name": "router",
        "image": router.image or default_image,
        "imagePullPolicy": router.image_pull_policy,
        "command": ["rollout-router", "serve", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}",
                    "--host", "::", "--port", str(ROUTER_PORT),  # every address: IPv4, IPv6 and dual-stack pods
                    "--admin-host", "::", "--admin-port", str(ROUTER_ADMIN_PORT), *grpc_args, *token_args,
                    "--drain-timeout", str(ROUTER_DRAIN_SECONDS), "--drain-accept-seconds", str(ROUTER_ACCEPT_SECONDS),
                    *_fleet_args(name, spec), *_workers_args(spec)],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
                  {"name": "admin", "containerPort": ROUTER_ADMIN_PORT, "protocol": "TCP"}, *grpc_ports,
                  *fleet_ports(spec)],
        "env": env,
        "resources": router.resources.dump(),
        "livenessProbe": probe,
        "readinessProbe": {**probe, "httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}, *token_mounts],
    }
    pod_spec = {
        "serviceAccountName": child_name(name),
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "terminationGracePeriodSeconds": ROUTER_TERMINATION_GRACE_SECONDS,
        # A directory mount (not subPath), so the kubelet's updates reach the running router.
        "volumes": [{"name": "config", "configMap": {"name": f"{child_name(name)}-config"}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}, *token_volumes],
        "nodeSelector": router.node_selector,
        "tolerations": [{k: v for k, v in t.dump().items() if v is not None} for t in router.tolerations],
        **({"imagePullSecrets": [secret.dump() for secret in router.image_pull_secrets]}
           if router.image_pull_secrets else {}),
    }
    return {
        "replicas": router.replicas,
        "selector": {"matchLabels": router_labels(name)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {
            "metadata": {"labels": labels, "annotations": router.pod_annotations},
            "spec": pod_spec,
        },
    }

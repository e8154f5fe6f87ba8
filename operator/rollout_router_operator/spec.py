"""The RolloutRouter resource's spec and status, as pydantic models.

The spec reuses the router's own models (``PolicySettings``, ``LabelSelector``)
so the CRD schema, the operator's validation and the router's config file
cannot drift apart. A rule that spans fields is written once, as CEL in the
schema: the API server refuses a resource that breaks it, and the operator
evaluates the same rule (``celrules.py``) for API servers that run no CEL.
"""
from __future__ import annotations

import ipaddress
import re
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt, field_validator, model_validator

from rollout_router.crossfield import COST_AFFINITY_HAS_A_MARGIN, REQUIREMENT_VALUES, SELECTOR_SELECTS
from rollout_router.portrule import PORT
from rollout_router.settings import (
    MAX_WORKERS,
    LabelSelector,
    MetricsSettings,
    Model,
    PolicySettings,
    Port,
    RlSettings,
)

from .celrules import violations
from .schema import model_schema, with_item_rule

GROUP, VERSION, KIND, PLURAL = "rolloutrouter.dev", "v1alpha1", "RolloutRouter", "rolloutrouters"


def _package_version() -> str:
    try:
        return version("rollout-router")
    except PackageNotFoundError:  # running from a source tree without an install
        return "0.1.0"


DEFAULT_IMAGE = f"ghcr.io/rolloutrouter/rollout-router:{_package_version()}"
Quantity = StrictInt | str


def cel(rule: str, message: str, field_path: str | None = None) -> dict:
    """One ``x-kubernetes-validations`` entry."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


class ServiceSpec(Model):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Service type.")
    port: StrictInt = Field(8080, ge=1, le=65535, description="Service port for traffic (the Service's admin port, "
                            "8081, serves /metrics and /status).")


class ResourceRequirements(Model):
    requests: dict[str, Quantity] = Field(default_factory=lambda: dict[str, Quantity](cpu="500m", memory="256Mi"))
    limits: dict[str, Quantity] = Field(default_factory=lambda: dict[str, Quantity](memory="1Gi"))


class Toleration(Model):
    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        cel("has(self.key) || self.operator == 'Exists'", "a toleration without a key must use operator Exists"),
        cel("self.operator != 'Exists' || !has(self.value)", "operator Exists takes no value"),
    ]}}

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: StrictInt | None = None


class EnvVar(Model):
    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        cel("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both"),
    ]}}

    name: str = Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    value_from: dict[str, Any] | None = Field(None, description="As in a container's env[].valueFrom.")


class SecretReference(Model):
    """A Secret in the resource's namespace, by name (an entry of a pod's imagePullSecrets)."""

    name: str = Field(min_length=1, max_length=253,
                      pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class RouterDeploymentSpec(Model):
    """How the router runs; changing these rolls the Deployment (replicas only scales it)."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        cel("self.sessionOwner == 'Rendezvous' || self.sessionOwnership",
            "sessionOwner Entry needs sessionOwnership true", ".sessionOwner"),
    ]}}

    replicas: StrictInt = Field(1, ge=0, le=100, description="Router pods; a PodDisruptionBudget is added above 1.")
    image: str | None = Field(None, min_length=1, description=(
        "Router image. Unset: the operator's --router-image (the Helm chart passes its routerImage), "
        f"by default {DEFAULT_IMAGE.rsplit(':', 1)[0]}:<operator version>."))
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[SecretReference] = Field(default_factory=list, description=(
        "Secrets for pulling the router image from a private registry, e.g. [{name: regcred}] (the Helm chart's "
        "imagePullSecrets are the operator pod's only)."))
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables for the router.")
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    session_ownership: StrictBool = Field(True, description=(
        "Many router pods, one policy: each session has one owner among the Ready router pods (rendezvous "
        "hashing of the session key), a pod forwards a keyed request it does not own to the owner once, the "
        "pods exchange their in-flight counts, and pins are handed over when ownership moves "
        "(docs/operator.md, 'Many router pods'). The routers watch their own pods (--peer-selector) and the "
        "Service has no ClientIP affinity. false: every pod decides alone and the Service pins clients by IP."))
    session_owner: Literal["Rendezvous", "Entry"] = Field("Rendezvous", description=(
        "With sessionOwnership, which router pod owns a session. Rendezvous: the winner of the rendezvous hash "
        "of the session key; a pod forwards the turns it does not own there (for a plain Service). Entry: the "
        "pod a turn enters by; it never forwards, and pulls the session's pin from the other pods when it has "
        "none (one lookup per new session, and per session whose entry pod changed): for a Gateway, Envoy, "
        "HAProxy or nginx in front that hashes X-Session-ID, so that every turn of a session enters by the same "
        "pod (docs/operator.md, 'A Gateway or Envoy in front'). Rendered as the router's --ownership flag."))
    admin_token: StrictBool = Field(True, description=(
        "Require a bearer token on the routers' admin routes (/status, /metrics, session deletion, the "
        "worker API, /fleet/v1/*). The operator renders it into the Secret <name>-router-admin-token, "
        "shared by the resource's router pods (peers call each other with it) and used by its status poller; "
        "a Prometheus scraping /metrics needs it too (docs/security.md). false: no token; only "
        "spec.networkPolicy guards the admin port."))

    workers: StrictInt | None = Field(None, ge=1, le=MAX_WORKERS, description=(
        "Router processes per pod (the router's --workers): they share the pod's ports, so a pod uses that many "
        "cores; with sessionOwnership each worker is a member of the pods' fleet, at the pod's container port "
        "fleet-<i> (docs/fleet.md, 'Several cores'). Unset: the router container's CPU limit rounded down (at "
        "least 1; no CPU limit: 1), except with sessionOwner Entry: 1 (the pin would move between a pod's "
        "workers with the connections)."))


class IPBlock(Model):
    """An IP range, as in a NetworkPolicy's ipBlock."""

    # Checked here as the API server checks a NetworkPolicy's (the CRD cannot: CEL's isCIDR needs Kubernetes
    # 1.31), so a bad one is the resource's InvalidSpec before any child is applied, not a refused child.
    cidr: str = Field(description="A CIDR, e.g. 10.0.0.0/16.")
    # `except` is a Python keyword: the field is named for its alias.
    except_: list[str] = Field(default_factory=list, alias="except", description="CIDRs inside cidr to leave out.")

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        _network(value)
        return value

    @model_validator(mode="after")
    def _inside(self) -> IPBlock:
        outer = _network(self.cidr)
        for index, value in enumerate(self.except_):
            inner = _network(value)
            inside = inner.version == outer.version and inner.subnet_of(outer)  # type: ignore[arg-type]  # same family
            if not inside or inner.prefixlen <= outer.prefixlen:
                raise ValueError(f"except[{index}] {value!r} must be a strict subset of cidr {self.cidr!r}")
        return self


CIDR = re.compile(r"[0-9A-Fa-f:.]+/[0-9]{1,3}")  # what Go's ParseCIDR reads: no netmask, no zone (%eth0)


def _network(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A CIDR as Kubernetes reads it (an address and a prefix length; host bits may be set), or the error."""
    try:
        if CIDR.fullmatch(value):
            return ipaddress.ip_network(value, strict=False)
    except ValueError:
        pass
    raise ValueError(f"{value!r} is not a CIDR (e.g. 10.0.0.0/16 or fd00::/8)")


PEER_RULE = cel("has(self.ipBlock) ? !has(self.podSelector) && !has(self.namespaceSelector) : "
                "has(self.podSelector) || has(self.namespaceSelector)",
                "a peer sets podSelector and/or namespaceSelector, or ipBlock alone")


class NetworkPolicyPeer(Model):
    """As in a NetworkPolicy's ingress[].from[]: pods (in this namespace, or in the namespaces
    namespaceSelector picks), or an IP range."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [PEER_RULE]}}

    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = Field(None, description="{} selects every namespace.")
    ip_block: IPBlock | None = None


class NetworkPolicySpec(Model):
    """A NetworkPolicy for the router pods: clients reach the traffic ports, Prometheus the admin port."""

    enabled: bool = Field(False, description="Render a NetworkPolicy <name>-router admitting only clients to the "
                          "traffic ports and prometheus (and admin) to the admin port; everything else is refused.")
    clients: list[NetworkPolicyPeer] = Field(default_factory=list, description=(
        "Who may send inference traffic (the router's http and grpc ports). Empty: no one."))
    prometheus: NetworkPolicyPeer | None = Field(None, description=(
        "Who scrapes the routers' /metrics (the admin port, 8081), e.g. "
        "{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}."))
    admin: list[NetworkPolicyPeer] = Field(default_factory=list, description=(
        "Who else may reach the admin port (/status, DELETE /v1/sessions/KEY): the operator's namespace, so "
        "that its status poller reads /status, and whoever releases sessions."))


# A duration both the Prometheus Operator's pattern and CEL's duration() read, e.g. 30s, 1m30s (no d, w, y).
DURATION = r"^([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$"
TIMEOUT_RULE = cel("duration(self.scrapeTimeout) <= duration(self.interval)", "scrapeTimeout must be at most the "
                   "interval (the Prometheus Operator refuses such a ServiceMonitor)", ".scrapeTimeout")


class ServiceMonitorSpec(Model):
    """A Prometheus Operator ServiceMonitor for this resource's routers, which sends their admin token."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [TIMEOUT_RULE]}}

    enabled: bool = Field(False, description=(
        "Render a ServiceMonitor <name>-router (monitoring.coreos.com/v1; the Prometheus Operator's CRDs must be "
        "installed) that scrapes the routers' /metrics on the admin port with this resource's admin token "
        "(the Secret <name>-router-admin-token), which the Helm chart's one ServiceMonitor for all routers cannot "
        "send. The router Service is labelled rolloutrouter.dev/service-monitor=own, so the chart's ServiceMonitor "
        "leaves it out."))
    labels: dict[str, str] = Field(default_factory=dict, description=(
        "Extra labels on the ServiceMonitor, e.g. {release: kube-prometheus-stack} to match your Prometheus' "
        "serviceMonitorSelector."))
    interval: str = Field("30s", pattern=DURATION, min_length=2, max_length=32, description="Scrape interval.")
    scrape_timeout: str = Field("10s", pattern=DURATION, min_length=2, max_length=32,
                                description="Scrape timeout (at most the interval).")


SELECTOR_RULE = SELECTOR_SELECTS.cel()  # the router's settings check the same two (``crossfield``)
REQUIREMENT_RULE = REQUIREMENT_VALUES.cel()


# the router settings' own rule rendered (a null field is absent to CEL; policy and fullDeterminism always have
# their defaults)
COST_AFFINITY_RULE = COST_AFFINITY_HAS_A_MARGIN.cel()


class RolloutRouterSpec(PolicySettings):
    """What a user writes under spec: the policy knobs, where the vLLM pods are, how the router runs."""

    model_config = PolicySettings.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        COST_AFFINITY_RULE, PORT.cel("backendPort"), PORT.cel("grpcPort")]}}

    selector: LabelSelector = Field(
        description="The vLLM pods, in the resource's namespace.",
        json_schema_extra={"x-kubernetes-validations": [SELECTOR_RULE]})
    backend_port: Port | None = Field(8000, description="vLLM HTTP port: a number or a container port name; null "
                                      "for replicas that serve gRPC only (vLLM's gRPC frontend), with grpcPort.")
    grpc_port: Port | None = Field(None, description="vLLM gRPC port, if the replicas serve gRPC.")
    router: RouterDeploymentSpec = Field(default_factory=RouterDeploymentSpec)
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    service_monitor: ServiceMonitorSpec = Field(default_factory=ServiceMonitorSpec)
    rl: RlSettings = Field(default_factory=RlSettings, description="The RL step's pause queue and weight "
                           "updates (POST /v1/rl/* on the routers' admin port, docs/rl.md).")
    metrics: MetricsSettings = Field(default_factory=MetricsSettings, description=(
        "What the routers measure beyond their counters (docs/observability.md, \"Is the margin paying?\")."))

    @model_validator(mode="after")
    def _crd_rules(self) -> RolloutRouterSpec:
        """The CRD's CEL rules on this spec, the one copy of each: the operator refuses what an API server that
        runs no CEL let through. (describe_spec_error names the spec: the first path's "spec." is dropped.)"""
        broken = violations(spec_schema(), self.model_dump(by_alias=True, mode="json"))
        if broken:
            raise ValueError("; ".join(broken).removeprefix("spec."))
        return self


@cache
def spec_schema() -> dict:
    """The CRD's schema of spec, its CEL rules included (a selector's requirements too: their model belongs to the
    router's settings, which carry no CEL). Evaluated by the operator: do not change the returned dict."""
    return with_item_rule(model_schema(RolloutRouterSpec), "matchExpressions", REQUIREMENT_RULE)


class Condition(Model):
    type: Literal["Ready", "Progressing", "Degraded"]
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class Counts(Model):
    ready: int = 0
    total: int = 0
    summary: str = Field("0/0", description="ready/total, for kubectl get.")


class Affinity(Model):
    kept: int = 0
    broken: int = 0
    new_sessions: int = 0
    group_colocated: int = Field(0, description="New sessions with a group key placed on their group's replica.")
    group_spilled: int = Field(0, description="New sessions with a group key placed elsewhere (the group's "
                               "replica beyond the margin or gone).")
    read_at: str | None = Field(None, description="When the routers' /status was read (RFC 3339).")
    routers_read: int = Field(0, description="Router pods whose /status answered.")
    unreachable: list[str] = Field(default_factory=list, description="Router pods whose /status did not answer.")
    repin_prefill_tokens: int = Field(0, description="Prompt tokens the new replicas reported prefilling for "
                                      "moved turns (broken or re-pinned), summed over the router pods.")
    repin_prefill_turns: int = Field(0, description="Moved turns whose answer reported that prefill.")
    ttfb_moved_vs_kept: str | None = Field(None, description="Mean time to first byte of moved turns / of kept "
                                           "turns over the pods' lifetime, e.g. 0.412s/0.108s; null before both "
                                           "were seen.")


class Fleet(Model):
    """What the router pods did as one fleet (spec.router.sessionOwnership), summed over the pods."""

    forwarded: int = Field(0, description="Requests a pod forwarded to the session's owner.")
    handoffs: int = Field(0, description="Pins a new owner received from the previous one when ownership moved.")
    owner_unreachable: int = Field(0, description="Requests whose owner could not be reached before the first "
                                   "byte, decided by the pod that received them.")
    replaced: int = Field(0, description="Sessions placed anew because their previous owner is gone for good.")
    lookups: int = Field(0, description="sessionOwner Entry: keys without a pin on the pod they entered by, "
                         "for which every peer pod was asked.")


class Rl(Model):
    """The RL step as the router pods report it (/status "rl"): the pod with the newest state speaks for all."""

    weight_version: str | None = Field(None, description="The version the last successful weight update set.")
    paused: bool = Field(False, description="Whether dispatch is paused (POST /v1/rl/pause).")
    last_pause: str | None = Field(None, description="The last pause's outcome (ok, partial, timeout).")
    last_update: str | None = Field(None, description="The last weight update's outcome (ok, failed).")
    last_update_at: str | None = Field(None, description="When the last weight update ended (RFC 3339).")
    pins_cleared: int = Field(0, description="Pins cleared at weight updates (rl.onWeightUpdate: clear), summed.")


class PodCounts(Model):
    pod: str
    started: float | None = Field(None, description="When its router started counting (its /status started_at).")
    counts: dict[str, float] = Field(default_factory=dict, description="Its last /status counters, by dotted path.")


class Ledger(Model):
    """What keeps the summed counters from going backwards when router pods go or restart (``ledger.py``)."""

    retired: dict[str, float] = Field(default_factory=dict, description="Counted by router pods gone or restarted "
                                      "since, by dotted path (affinity_kept, fleet.forwarded, ...).")
    pods: list[PodCounts] = Field(default_factory=list, description="Each router pod's last counters: a pod that "
                                  "misses a poll still counts with them.")


class RolloutRouterStatus(Model):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    backends: Counts = Field(default_factory=Counts, description="vLLM pods matching the selector: ready/total.")
    routers: Counts = Field(default_factory=Counts, description="Router pods: ready/desired (total is desired).")
    affinity: Affinity = Field(default_factory=Affinity, description="Counters summed over all router pods, those "
                               "gone included (status.ledger).")
    fleet: Fleet = Field(default_factory=Fleet, description="Session-ownership counters summed over all router pods "
                         "(0 without spec.router.sessionOwnership).")
    rl: Rl = Field(default_factory=Rl, description="The RL step: weight version, pause, last update and outcomes.")
    ledger: Ledger = Field(default_factory=Ledger, description="Each router pod's last counters and what pods "
                           "gone or restarted counted: the sums above include both, so they never go backwards.")

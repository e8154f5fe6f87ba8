"""Pydantic models for the router's settings, shared with the operator.

The operator renders ``RouterSettings`` into the router's ConfigMap and builds
the CRD schema from the same models, so there is one source of truth. Field
names are snake_case in Python and camelCase on the wire (YAML, JSON, CRD).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, TypeVar, overload

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from . import addresses
from .crossfield import COST_AFFINITY_HAS_A_MARGIN, REQUIREMENT_VALUES, SELECTOR_SELECTS
from .policy import LiveConfig, PolicyOptions, registry
from .policy.cost_affinity import CostAffinityOptions
from .portrule import PORT

__all__ = [
    "Backend", "DiscoverySettings", "FleetSettings", "HealthSettings", "LabelSelector", "LabelSelectorRequirement",
    "MetricsSettings", "PolicySettings", "RlSettings", "RouterSettings", "SessionSettings", "SettingsError",
    "WorkerApiSettings", "describe", "load_settings", "parse_settings",
]


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def dump(self) -> dict:
        """The camelCase form written to files and the CRD."""
        return self.model_dump(by_alias=True, mode="json")


MAX_WORKERS = 64  # router processes per pod or per serve --workers (the operator's spec.router.workers too)
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110's token


class SessionSettings(Model):
    """Where the session key comes from, and how many pins are kept how long."""

    headers: list[str] = Field(default_factory=lambda: ["X-Session-ID"],
                               description="Request headers holding the session key, first match wins.")
    body_fields: list[str] = Field(default_factory=list,
                                   description="JSON body fields tried after the headers, e.g. session_id, user; "
                                               "a dot steps into an object (session_params.id).")
    max_sessions: StrictInt = Field(100_000, ge=1, description="Pins kept; the least recently used is evicted beyond this.")
    idle_timeout_seconds: float | None = Field(3600.0, gt=0, strict=True, allow_inf_nan=False,
                                               description="A pin idle this long is dropped; null keeps pins until evicted.")
    max_key_bytes: StrictInt = Field(256, ge=1, le=65536,
                                     description="Longest session key in UTF-8 bytes (header or body field); "
                                                 "a longer one gets 400.")

    @field_validator("headers", "body_fields")
    @classmethod
    def _non_empty_names(cls, names: list[str]) -> list[str]:
        if any(not name.strip() for name in names):
            raise ValueError("names must be non-empty")
        return names

    @field_validator("headers")
    @classmethod
    def _header_names(cls, names: list[str]) -> list[str]:
        """Names a request can carry: another (``X Session``) would be taken and never match a header."""
        for name in names:
            if not HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)")
        return names


class GroupSettings(Model):
    """Where a request's group key comes from: the GRPO siblings (the n samples of one prompt) that a new session
    is placed beside (docs/configuration.md, "Group key")."""

    headers: list[str] = Field(default_factory=lambda: ["X-Group-ID"],
                               description="Request headers (gRPC: metadata) holding the group key, first match wins; "
                                           "[] with no bodyFields turns group placement off.")
    body_fields: list[str] = Field(default_factory=list,
                                   description="JSON body fields tried after the headers, e.g. request_group_id.")
    max_groups: StrictInt = Field(10_000, ge=1, description="Groups remembered; the least recently used is "
                                  "forgotten beyond this (a group lives for one RL step).")

    @field_validator("headers", "body_fields")
    @classmethod
    def _non_empty_names(cls, names: list[str]) -> list[str]:
        return SessionSettings._non_empty_names(names)

    @field_validator("headers")
    @classmethod
    def _header_names(cls, names: list[str]) -> list[str]:
        return SessionSettings._header_names(names)


# A name from the policy registry that a router may run; the CRD's enum is the same list.
PolicyName = Annotated[str, BeforeValidator(registry.selectable),
                       WithJsonSchema({"type": "string", "enum": list(registry.SELECTABLE)})]


def _whole(value: float) -> float:
    """A margin written as a whole number stays one (2, not 2.0, in /status and rendered configs)."""
    return int(value) if value.is_integer() else value


Margin = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False), AfterValidator(_whole)]


class PolicySettings(Model):
    """The knobs that can change while the router runs, without losing pins.

    A policy with options of its own (``Policy.Options``) has them in a field named after it.
    """

    policy: PolicyName = Field("affinity", description=f"Routing policy: {registry.summary()}.")
    affinity_break_margin: Margin | None = Field(
        None, description="Skew tolerated before a pin moves (any number >= 0, as verl takes it: 2.5 keeps a pin at "
                          "skew 2 and moves it at 3); null keeps every pin, 0 moves unless least-loaded.")
    full_determinism: StrictBool = Field(False, description="Place sessions by key hash only; the margin is ignored.")
    cost_affinity: CostAffinityOptions = Field(default_factory=CostAffinityOptions,
                                               description="Read only by policy cost_affinity.")
    session: SessionSettings = Field(default_factory=SessionSettings)
    group: GroupSettings = Field(default_factory=GroupSettings, description="GRPO siblings placed together (read "
                                 "by the affinity policies); its keys are bounded by session.maxKeyBytes.")

    @model_validator(mode="after")
    def _cost_affinity_has_a_margin(self) -> PolicySettings:
        """``crossfield.COST_AFFINITY_HAS_A_MARGIN``, which the CRD carries as CEL."""
        COST_AFFINITY_HAS_A_MARGIN.check(self)
        return self

    def live_config(self) -> LiveConfig:
        """What the running policy takes from these settings: the router's knobs and its own options, if any."""
        return LiveConfig(self.affinity_break_margin, self.full_determinism,
                          self.session.max_sessions, self.session.idle_timeout_seconds,
                          self.own_options(), self.group.max_groups)

    def own_options(self) -> PolicyOptions | None:
        """The running policy's own options: the field named after it, if it has one (``Policy.Options``)."""
        options = getattr(self, self.policy, None)
        return options if isinstance(options, PolicyOptions) else None


LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")  # a label's name, or a non-empty value
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def label_key(key: str) -> bool:
    """A label key as the API takes it: an optional DNS-subdomain prefix and '/', then a name."""
    prefix, _, label = key.rpartition("/")
    return bool(LABEL_NAME.fullmatch(label)) and (
        not prefix or (len(prefix) <= 253 and bool(DNS_SUBDOMAIN.fullmatch(prefix))))


def label_value(value: str) -> bool:
    """A label value as the API takes it: empty, or a name."""
    return value == "" or bool(LABEL_NAME.fullmatch(value))


def _selector_key(key: str) -> str:
    if not label_key(key):
        raise ValueError(f"{key!r} is not a Kubernetes label key (an optional DNS prefix and '/', then 1-63 of "
                         "letters, digits, '-', '_' and '.', a letter or digit at each end)")
    return key


def _selector_value(value: str) -> str:
    if not label_value(value):  # the API would refuse the pod list: discovery and status would fail for good
        raise ValueError(f"{value!r} is not a Kubernetes label value (empty, or 1-63 of letters, digits, '-', '_' "
                         "and '.', a letter or digit at each end)")
    return value


class LabelSelectorRequirement(Model):
    key: Annotated[str, AfterValidator(_selector_key)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[Annotated[str, AfterValidator(_selector_value)]] = Field(default_factory=list)


class LabelSelector(Model):
    """A standard Kubernetes LabelSelector."""

    # Keys and values are checked as the API server checks them: one it would refuse is an error here, naming
    # the field, instead of a pod list refused at every discovery and status poll.

    match_labels: dict[Annotated[str, AfterValidator(_selector_key)],
                       Annotated[str, AfterValidator(_selector_value)]] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)


# A port by number, or by the name of a container port (resolved on each pod): ``portrule.PORT``, which the CRD
# carries as CEL.
Port = Annotated[int | str, BeforeValidator(PORT.check),
               WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}]})]


class DiscoverySettings(Model):
    """Kubernetes pod discovery: which pods are replicas and on which port."""

    namespace: str | None = Field(None, description="Defaults to POD_NAMESPACE, then the service account's namespace.")
    selector: LabelSelector
    port: Port | None = Field(8000, description="vLLM HTTP port: a number or a container port name; null for "
                                                "pods that serve gRPC only (vLLM's gRPC frontend), with grpcPort.")
    grpc_port: Port | None = Field(None, description="vLLM gRPC port, if the replicas serve gRPC.")

    @field_validator("selector")
    @classmethod
    def _selects(cls, selector: LabelSelector) -> LabelSelector:
        """``crossfield``'s selector rules, which the CRD carries as CEL: an empty selector takes every pod of the
        namespace for a replica, and a requirement the API server refuses would fail every pod list."""
        SELECTOR_SELECTS.check(selector)
        for index, requirement in enumerate(selector.match_expressions):
            try:
                REQUIREMENT_VALUES.check(requirement)
            except ValueError as error:
                raise ValueError(f"matchExpressions[{index}]: {error}") from None
        return selector

    @model_validator(mode="after")
    def _some_port(self) -> DiscoverySettings:
        if self.port is None and self.grpc_port is None:
            raise ValueError("discovery needs port (HTTP) or grpcPort (gRPC only), or both")
        return self


Seconds = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]  # a number: not true, "5" or .inf


class Backend(Model):
    """A static replica: its HTTP base URL (its identity) and, if it serves gRPC, where; or, for vLLM's gRPC
    frontend (which serves no HTTP), its gRPC address alone: ``grpc://HOST:PORT`` or ``{grpc: HOST:PORT}``."""

    url: str = Field(description="HTTP base URL, e.g. http://vllm-0:8000; or grpc://HOST:PORT for a replica that "
                                 "serves gRPC only (it then takes gRPC calls only).")
    grpc: str | None = Field(None, description="host:port of the replica's vLLM gRPC server, if any.")

    @model_validator(mode="before")
    @classmethod
    def _grpc_alone(cls, data: object) -> object:
        """``{grpc: HOST:PORT}`` without a url is the gRPC-only replica ``grpc://HOST:PORT``."""
        if isinstance(data, dict) and data.get("url") is None and isinstance(data.get("grpc"), str):
            return {**data, "url": f"grpc://{data['grpc']}", "grpc": None}
        return data

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        if url.startswith("grpc://"):
            return "grpc://" + addresses.host_port(url[len("grpc://"):].rstrip("/"))
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"backend {url!r} must be an http://, https:// or grpc:// URL")
        return addresses.http_url(url)

    @field_validator("grpc")
    @classmethod
    def _grpc_target(cls, target: str | None) -> str | None:
        return None if target is None else addresses.host_port(target)

    @model_validator(mode="after")
    def _one_grpc_address(self) -> Backend:
        if self.url.startswith("grpc://") and self.grpc is not None:
            raise ValueError(f"backend {self.url} is gRPC only: give its address once (url or grpc), not both")
        return self


class WorkerApiSettings(Model):
    """Who may be registered through the worker API (``POST /workers``, ``/add_worker``): docs/security.md."""

    allowed_networks: list[str] = Field(
        default_factory=list, description="CIDRs a worker's address must be in (IP literals only, then); empty: any "
                                          "address but link-local, unspecified, multicast and cloud metadata ones.")

    @field_validator("allowed_networks")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        return [str(network) for network in addresses.networks(values)]


# A path and query of RFC 3986's characters: a space or a line break would be written into the probe's request line
# (a header injected into every probe, or every probe a 400 and every replica out of rotation).
PROBE_PATH = re.compile(r"/[-A-Za-z0-9._~!$&'()*+,;=:@%/]*(\?[-A-Za-z0-9._~!$&'()*+,;=:@%/?]*)?")


class HealthSettings(Model):
    """Passive health (outlier ejection, as Envoy's) and the active probes of each replica: its HTTP health path,
    and its gRPC health call when it has a gRPC address."""

    consecutive_failures: StrictInt = Field(
        3, ge=1, description="Failures in a row (no answer within firstByteTimeoutSeconds, unparseable HTTP, "
                             "a connection closed before the answer) that eject a replica.")
    consecutive_5xx: StrictInt = Field(
        5, ge=0, alias="consecutive5xx",
        description="5xx answers in a row that eject a replica (Envoy's consecutive_5xx, default 5); 0 turns it off. "
                    "A replica that answers 500 to everything is as broken as one that refuses connections.")
    base_ejection_seconds: Seconds = Field(
        30.0, description="First ejection's length; each further ejection adds as much, up to maxEjectionSeconds.")
    max_ejection_seconds: Seconds = Field(300.0, description="Longest ejection.")
    max_ejection_percent: StrictInt = Field(
        50, ge=0, le=100, description="At most this share of the replicas is ejected at once (rounded down), "
                                      "so a fleet-wide slowdown never ejects the whole fleet.")
    probe_path: str = Field("/health", description="Path probed on each replica's HTTP URL (and a query, if any): "
                            "URL characters only, percent-encoded where need be.")
    grpc_probe: Literal["vllm", "grpc_health"] = Field(
        "vllm", description="How a replica with a gRPC address is probed over gRPC: vllm (VllmEngine/HealthCheck) or "
                            "grpc_health (grpc.health.v1.Health/Check, where the server offers it).")
    probe_interval_seconds: Seconds | None = Field(
        5.0, description="Time between probe rounds; null turns active probing off.")
    probe_timeout_seconds: Seconds = Field(
        5.0, description="A probe that takes longer fails; the replica is out of rotation until one passes.")

    @field_validator("probe_path")
    @classmethod
    def _probe_path(cls, path: str) -> str:
        if not PROBE_PATH.fullmatch(path):
            raise ValueError("must be a path starting with / of URL characters (percent-encode spaces and the like)")
        return path


LoadView = Literal["peers", "vllm", "local"]
Ownership = Literal["rendezvous", "entry"]


class FleetSettings(Model):
    """Many routers, one policy: who the other routers are and how replica loads are shared (docs/fleet.md).

    The section's presence turns session ownership on (as do ``--peer`` and ``--peer-selector``); without
    it a router decides everything itself, as a lone router does.
    """

    peers: list[str] = Field(default_factory=list, description="Admin URLs (http://host:adminport) of the other "
                             "routers; this router is always a member too. Reloaded live.")
    ownership: Ownership = Field("rendezvous", description="Which router owns a session: rendezvous (the "
                                 "member that wins the rendezvous hash of the key; the others forward its turns "
                                 "there: for a plain Service) or entry (the router the turn enters by; it pulls "
                                 "the pin from its peers when it has none: for a front end that hashes the session "
                                 "key). The --ownership flag overrides it.")
    lookup_timeout_seconds: float = Field(0.5, gt=0, le=5, strict=True, description="With ownership entry: how long a router "
                                          "waits for its peers' answers when it asks them for a pin it lacks.")
    load_view: LoadView = Field("peers", description="What the margin compares: peers (own exact in-flight counts "
                                "plus the other routers', streamed), vllm (each replica's vllm:num_requests_running "
                                "+ vllm:num_requests_waiting, scraped), or local (own counts only).")
    poll_interval_seconds: float = Field(0.1, ge=0.01, le=0.25, strict=True, description="How often each peer looks at its "
                                         "loads and sends them when they changed (a heartbeat every third of "
                                         "peerTimeoutSeconds), and with loadView vllm, each replica's /metrics "
                                         "is scraped.")
    peer_timeout_seconds: float = Field(1.0, gt=0, le=30, strict=True, description="A peer that has sent nothing (no change, no "
                                        "heartbeat) for this long leaves the membership until it answers again.")

    @field_validator("peers")
    @classmethod
    def _admin_urls(cls, peers: list[str]) -> list[str]:
        return [addresses.http_url(url, "peer") for url in peers]

    @model_validator(mode="after")
    def _timeout_spans_heartbeats(self) -> FleetSettings:
        """A peer's heartbeat comes every third of the timeout, never more often than it looks for a change:
        a timeout below three intervals would take every idle peer for a silent one."""
        if self.peer_timeout_seconds < 3 * self.poll_interval_seconds - 1e-9:
            raise ValueError(f"peerTimeoutSeconds ({self.peer_timeout_seconds:g}) must be at least 3 x "
                             f"pollIntervalSeconds ({self.poll_interval_seconds:g})")
        return self


class RlSettings(Model):
    """The RL step's fleet operations (docs/rl.md): the pause queue and what a weight update does to pins."""

    max_queued_requests: StrictInt = Field(
        1024, ge=0, description="Requests held while dispatch is paused (POST /v1/rl/pause); one more gets 503 "
                                "with Retry-After. 0: every request arriving while paused gets 503.")
    max_pause_seconds: Seconds = Field(
        300.0, description="Longest a request waits in the pause queue; then it gets 503 with Retry-After.")
    on_weight_update: Literal["keep", "clear"] = Field(
        "keep", description="What a successful POST /v1/rl/update_weights does to the session pins: keep them "
                            "(a session's next turn re-prefills where its earlier turns ran) or clear them (its "
                            "next turn is placed anew on the least-loaded replica).")
    engine_timeout_seconds: Seconds = Field(
        600.0, description="Longest wait for one replica's answer to an engine call of the fan-out (pause, "
                           "abort, weight reload, cache reset, resume).")


class MetricsSettings(Model):
    """What the router measures beyond its counters (docs/observability.md, "Is the margin paying?")."""

    kept_prefill_sample_rate: float = Field(
        0.1, ge=0, le=1, strict=True, allow_inf_nan=False,
        description="Share of kept turns whose answer's usage is read for rolloutrouter_kept_prefill_tokens_total "
                    "(every moved turn is read); 0 reads none.")
    max_backend_labels: StrictInt = Field(
        64, ge=1, description="Distinct replicas given their own backend label on the metrics; the rest are "
                              "counted under backend=\"other\".")


class RouterSettings(PolicySettings):
    """Everything ``rollout-router serve`` reads from ``--config``."""

    backends: list[Backend] = Field(default_factory=list,
                                    description="Static replicas (a URL, or {url, grpc}; grpc://HOST:PORT or {grpc} for one that serves gRPC only), used when discovery is unset.")
    discovery: DiscoverySettings | None = None
    max_body_bytes: StrictInt = Field(32 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    connect_retries: StrictInt = Field(2, ge=0, description="Other replicas tried when one refuses the connection.")
    down_seconds: Seconds = Field(5.0, description="How long a replica that refused a connection is skipped.")
    upstream_timeout_seconds: Seconds | None = Field(
        600.0, description="Longest silence from a replica once its response has begun (mid-stream; gRPC: after "
                           "its first message, once the whole request was sent); then the response ends with an error (gRPC: "
                           "DEADLINE_EXCEEDED). A client slow to read does not count as silence.")
    first_byte_timeout_seconds: Seconds | None = Field(
        600.0, description="Longest wait for a replica's response head after the request was sent (504, and a "
                           "failure towards ejection); a non-streaming answer's head comes only when generation ends.")
    max_connections: StrictInt = Field(10_000, ge=1, description="Client connections open at once on the traffic "
                                       "port; beyond it a new connection gets 503 and is closed.")
    max_grpc_streams: StrictInt = Field(10_000, ge=1, description="gRPC calls in progress at once over all "
                                        "connections of the gRPC listener; beyond it a call gets RESOURCE_EXHAUSTED.")
    max_grpc_streams_per_connection: StrictInt = Field(
        100, ge=1, description="gRPC calls in progress at once on one connection (announced as "
                               "SETTINGS_MAX_CONCURRENT_STREAMS, at most maxGrpcStreams; h2o's and nghttpx's 100); "
                               "beyond it a stream is refused (REFUSED_STREAM).")
    grpc_idle_timeout_seconds: Seconds | None = Field(
        180.0, description="A gRPC connection with no call in progress for this long is told GOAWAY and closed "
                           "(nginx's http2_idle_timeout until 1.19.7, 3 min); null keeps it open.")
    max_buffered_bytes: StrictInt = Field(256 * 1024 * 1024, ge=1024, description="Request bytes (heads and bodies) "
                                          "held at once over all clients, and gRPC answers waiting for their client "
                                          "(each call's replica window is this over maxGrpcStreams, at most 64 KiB); "
                                          "a request that would exceed it gets 503.")
    header_timeout_seconds: Seconds | None = Field(30.0, description="A request head must arrive within this "
                                                   "long of its first byte, else 408.")
    body_timeout_seconds: Seconds | None = Field(300.0, description="A request body must arrive within this "
                                                 "long of its head, else 408.")
    min_body_bytes_per_second: StrictInt = Field(1024, ge=0, description="Slowest request body accepted, averaged "
                                                 "after its first 10 s (0: any rate), else 408.")
    health: HealthSettings = Field(default_factory=HealthSettings)
    worker_api: WorkerApiSettings = Field(default_factory=WorkerApiSettings)
    fleet: FleetSettings | None = Field(None, description="Other routers sharing the sessions (docs/fleet.md); "
                                        "null: this router decides alone.")
    rl: RlSettings = Field(default_factory=RlSettings, description="The RL step's pause queue and weight updates "
                           "(POST /v1/rl/*, docs/rl.md).")
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)

    @field_validator("backends", mode="before")
    @classmethod
    def _plain_urls(cls, backends: list) -> list:
        """A bare URL string is a backend without gRPC."""
        return [{"url": b} if isinstance(b, str) else b for b in backends] if isinstance(backends, list) else backends


class SettingsError(ValueError):
    """Settings that cannot be used; the message names the offending fields."""


def describe(error: ValidationError) -> str:
    """One line per problem, each naming its key as the file or resource spells it (camelCase, dotted) and the
    value given, whether the data came in camelCase (a file) or snake_case (flags applied over a file)."""
    lines = []
    for item in error.errors():
        where = ".".join(to_camel(part) if isinstance(part, str) and "_" in part else str(part)
                         for part in item["loc"]) or "(root)"
        given = item.get("input")
        got = f" (got {given!r})" if item["type"] != "missing" and not isinstance(given, (dict, list)) else ""
        lines.append(f"{where}: {item['msg'].removeprefix('Value error, ')}{got}")
    return "; ".join(lines)


M = TypeVar("M", bound=Model)


@overload
def parse_settings(data: dict) -> RouterSettings: ...
@overload
def parse_settings(data: dict, model: type[M]) -> M: ...
def parse_settings(data: dict, model: type[Model] = RouterSettings) -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise SettingsError(describe(error)) from None


def load_settings(path: str | Path) -> RouterSettings:
    """Read a YAML or JSON settings file (JSON is YAML) into ``RouterSettings``."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SettingsError(f"{path}: not UTF-8 text (byte {error.start} is {raw[error.start]:#04x})") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:  # one line: PyYAML's message spans several, with the place marked
        raise SettingsError(f"{path}: not valid YAML/JSON: {' '.join(str(error).split())}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping at the top level")
    return parse_settings(data)

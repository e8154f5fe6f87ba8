"""The resource's status: router /status counters summed (never backwards: ``ledger``), pods counted, conditions set.

``summarize`` and ``conditions`` are pure; ``collect`` does the I/O (pod and
ReplicaSet listings, and one GET per router pod, concurrently). A router pod that
does not answer, or answers too much or not the counters, is listed in
``affinity.unreachable`` and marks the resource Degraded; it never fails the poll.
With the resource's admin token (``render.admin_token``) the poller sends it as a
bearer token: derived from the operator's key, so no Secret is read.
Only pods of our own Deployment count: a pod that merely carries the router's
labels (anyone who may create pods can set them) is ignored and logged.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import logging
from dataclasses import dataclass, field

import aiohttp

from rollout_router.kube.pods import is_ready
from rollout_router.kube.selectors import labels_query, to_query
from rollout_router.listening import address
from rollout_router.settings import LabelSelector

from . import kube, ledger, rlstatus
from .render import ROUTER_ADMIN_PORT, InvalidSpec, child_name, parse_spec, router_labels, token_for
from .spec import Affinity, Condition, Counts, Fleet, RolloutRouterStatus

log = logging.getLogger(__name__)
POLL_TIMEOUT = 3.0
MAX_STATUS_BYTES = 1 << 20  # a router's /status is a few KiB; more is not a router
_reported: set[str] = set()  # uids of stranger pods already logged, so each is logged once
COUNTERS = {"kept": "affinity_kept", "broken": "affinity_broken", "new_sessions": "new_sessions",
            "group_colocated": "group_colocated", "group_spilled": "group_spilled"}
# status.fleet field -> key of the router's /status "fleet" object (null or absent without session ownership)
FLEET_COUNTERS = {"forwarded": "forwarded", "handoffs": "handoffs", "owner_unreachable": "ownerUnreachable",
                  "replaced": "replaced", "lookups": "lookups"}
# The router's /status "margin" (lifetime sums, so several pods add up): prefill of moved turns, and the
# time to first byte of moved and kept turns as {turns, seconds}.
MARGIN_COUNTS = ("repin_prefill_tokens", "repin_prefill_turns")
MARGIN_TTFB = ("moved", "kept")
# Every counter the status sums, by its dotted path in a parsed report: kept in the ledger (``ledger.py``).
PATHS = (*COUNTERS.values(), *(f"fleet.{key}" for key in FLEET_COUNTERS.values()),
         *(f"margin.{key}" for key in MARGIN_COUNTS),
         *(f"margin.ttfb.{which}.{part}" for which in MARGIN_TTFB for part in ("turns", "seconds")), "rl.pins_cleared")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Observation:
    """What one poll saw."""

    routers_ready: int = 0
    routers_desired: int = 0
    backends_ready: int = 0
    backends_total: int = 0
    reports: dict[str, dict] = field(default_factory=dict)  # router pod -> its /status
    listed: list[str] = field(default_factory=list)  # router pods of ours that exist, Ready or not
    unreachable: list[str] = field(default_factory=list)
    read_at: str = ""


def _counts(ready: int, total: int) -> Counts:
    return Counts(ready=ready, total=total, summary=f"{ready}/{total}")


def conditions(previous: list[dict], wanted: list[tuple[str, str, str, str]], generation: int | None,
               at: str) -> list[dict]:
    """Kubernetes-style conditions; lastTransitionTime moves only when the status flips."""
    before = {c.get("type"): c for c in previous or []}
    result = []
    for kind, status, reason, message in wanted:
        old = before.get(kind, {})
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        result.append(Condition(type=kind, status=status, reason=reason, message=message,
                                last_transition_time=since or at, observed_generation=generation).dump())
    return result


def summarize(obs: Observation, previous: dict, generation: int | None) -> dict:
    """The status document for a valid spec."""
    routers, backends = _counts(obs.routers_ready, obs.routers_desired), _counts(obs.backends_ready, obs.backends_total)
    if obs.routers_desired == 0:
        ready = ("False", "ScaledToZero", "spec.router.replicas is 0")
    elif obs.routers_ready < obs.routers_desired:
        ready = ("False", "RoutersNotReady", f"{routers.summary} router pods ready")
    elif obs.backends_ready == 0:
        ready = ("False", "NoReadyBackends", f"no Ready pod matches spec.selector ({backends.summary})")
    else:
        ready = ("True", "RoutersReady", f"{routers.summary} routers, {backends.summary} backends ready")
    progressing = (("True", "RollingOut", f"{routers.summary} router pods ready")
                   if obs.routers_ready < obs.routers_desired else ("False", "Stable", "all router pods ready"))
    degraded = (("True", "RoutersUnreachable", "no /status from " + ", ".join(obs.unreachable))
                if obs.unreachable else ("False", "AsExpected", ""))
    carried, sums = _carried(obs, previous)
    count = {path: int(value) for path, value in sums.items()}
    affinity = Affinity(**{name: count[key] for name, key in COUNTERS.items()},
                        read_at=obs.read_at, routers_read=len(obs.reports), unreachable=obs.unreachable,
                        repin_prefill_tokens=count["margin.repin_prefill_tokens"],
                        repin_prefill_turns=count["margin.repin_prefill_turns"], ttfb_moved_vs_kept=ttfb_moved_vs_kept(sums))
    fleet = Fleet(**{name: count[f"fleet.{key}"] for name, key in FLEET_COUNTERS.items()})
    rl = rlstatus.summarize([r.get("rl") or {} for r in obs.reports.values()], count["rl.pins_cleared"])
    status = RolloutRouterStatus(observed_generation=generation, backends=backends, routers=routers, affinity=affinity,
                                 fleet=fleet, rl=rl)
    document = status.dump()
    document["ledger"] = carried  # as carried: counts stay integers (the model's schema says number)
    document["conditions"] = conditions(previous.get("conditions", []), [
        ("Ready", *ready), ("Progressing", *progressing), ("Degraded", *degraded)], generation, obs.read_at)
    return document


def _carried(obs: Observation, previous: dict) -> tuple[dict, dict[str, float]]:
    """The ledger carried over from ``previous`` with this poll's reports, and every counter's sum from it."""
    carried = ledger.carry(previous.get("ledger") or {}, sorted({*obs.listed, *obs.reports, *obs.unreachable}),
                           {pod: ledger.entry(report.get("started_at"), ledger.flat(report, PATHS))
                            for pod, report in obs.reports.items()})
    return carried, ledger.totals(carried, PATHS)


def ttfb_moved_vs_kept(sums: dict[str, float]) -> str | None:
    """Mean TTFB of moved turns / of kept turns over every pod, e.g. ``0.412s/0.108s``; None before both."""
    means = []
    for which in MARGIN_TTFB:
        turns, seconds = sums[f"margin.ttfb.{which}.turns"], sums[f"margin.ttfb.{which}.seconds"]
        if not turns:
            return None
        means.append(f"{seconds / turns:.3f}s")
    return "/".join(means)


def invalid(previous: dict, generation: int | None, message: str) -> dict:
    """The status for a spec that cannot work: Degraded/InvalidSpec, counters kept as they were."""
    return {"observedGeneration": generation, "conditions": conditions(previous.get("conditions", []), [
        ("Ready", "False", "InvalidSpec", message), ("Progressing", "False", "InvalidSpec", message),
        ("Degraded", "True", "InvalidSpec", message)], generation, now())}


def rejected(status: dict, generation: int | None) -> bool:
    """Whether ``status`` reports this generation's spec invalid (Degraded, reason InvalidSpec): the
    status poller then leaves it alone, as there are no routers to read and the message must stay."""
    degraded: dict = next((c for c in status.get("conditions") or [] if c.get("type") == "Degraded"), {})
    return (degraded.get("reason") == "InvalidSpec" and degraded.get("status") == "True"
            and status.get("observedGeneration") == generation)


class BadStatus(ValueError):
    """A /status answer that is not a router's: too large, not JSON, or counters that are not counts."""


def _count(source: dict, key: str, where: str) -> int:
    value = source.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadStatus(f"/status {where}{key} is not a count: {str(value)[:40]!r}")
    return value


def parse_report(raw: bytes) -> dict:
    """The counters of one router's /status body, checked (``summarize`` sums them): the affinity
    counters, and under ``fleet`` the session-ownership ones (all 0 when ``fleet`` is null or absent)."""
    if len(raw) > MAX_STATUS_BYTES:
        raise BadStatus(f"/status is larger than {MAX_STATUS_BYTES} bytes")
    try:
        report = json.loads(raw)
    except ValueError as error:
        raise BadStatus(f"/status is not JSON: {error}") from None
    if not isinstance(report, dict):
        raise BadStatus("/status is not a JSON object")
    fleet = report.get("fleet") or {}
    if not isinstance(fleet, dict):
        raise BadStatus("/status fleet is not a JSON object")
    started = report.get("started_at")
    if started is not None and (isinstance(started, bool) or not isinstance(started, int | float)
                                or not 0 <= started < float("inf")):
        raise BadStatus(f"/status started_at is not a time: {str(started)[:40]!r}")
    return {**{key: _count(report, key, "") for key in COUNTERS.values()}, "started_at": started,
            "fleet": {key: _count(fleet, key, "fleet.") for key in FLEET_COUNTERS.values()},
            "margin": _margin(report.get("margin") or {}),
            **({"rl": rlstatus.parse(report["rl"])} if report.get("rl") else {})}


def _margin(margin: object) -> dict:
    """The checked "margin" of a /status (all 0 when absent: a router from before it)."""
    if not isinstance(margin, dict):
        raise BadStatus("/status margin is not a JSON object")
    ttfb = margin.get("ttfb") or {}
    if not isinstance(ttfb, dict):
        raise BadStatus("/status margin.ttfb is not a JSON object")
    checked: dict = {key: _count(margin, key, "margin.") for key in MARGIN_COUNTS}
    checked["ttfb"] = {}
    for which in MARGIN_TTFB:
        part = ttfb.get(which) or {}
        seconds = part.get("seconds", 0.0) if isinstance(part, dict) else None
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds < float("inf"):
            raise BadStatus(f"/status margin.ttfb.{which} is not {{turns, seconds}}")
        checked["ttfb"][which] = {"turns": _count(part, "turns", f"margin.ttfb.{which}."), "seconds": seconds}
    return checked


def status_url(pod: dict) -> str:
    """The router pod's ``/status`` on its admin listener (an IPv6 pod IP in brackets)."""
    return f"http://{address(pod['status']['podIP'], ROUTER_ADMIN_PORT)}/status"


async def _poll(session: aiohttp.ClientSession, pod: dict, token: str | None = None) -> dict:
    url = status_url(pod)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=POLL_TIMEOUT)) as response:
        response.raise_for_status()
        if (response.content_length or 0) > MAX_STATUS_BYTES:
            raise BadStatus(f"/status is larger than {MAX_STATUS_BYTES} bytes")
        raw = b""  # read until one byte past the limit or the end, never more
        while len(raw) <= MAX_STATUS_BYTES and (chunk := await response.content.read(MAX_STATUS_BYTES + 1 - len(raw))):
            raw += chunk
        return parse_report(raw)


def _controller(obj: dict) -> dict:
    return next((ref for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("controller")), {})


def owned_pods(name: str, pods: list[dict], replicasets: list[dict]) -> tuple[list[dict], list[dict]]:
    """(ours, strangers): pods whose controller is a ReplicaSet that our Deployment controls, and the rest.

    A forged owner reference to a uid that does not exist is removed by the garbage collector
    (with the object), so a stranger cannot stay in the chain for long."""
    ours = {rs["metadata"]["uid"] for rs in replicasets
            if (_controller(rs).get("kind"), _controller(rs).get("name")) == ("Deployment", child_name(name))}
    owned = [pod for pod in pods if _controller(pod).get("kind") == "ReplicaSet" and _controller(pod).get("uid") in ours]
    return owned, [pod for pod in pods if pod not in owned]


async def observe(namespace: str, name: str, selector: LabelSelector, desired: int,
                  token: str | None = None) -> Observation:
    """List router and backend pods, and read every Ready router pod's /status (with ``token``, if any)."""
    query = labels_query(router_labels(name))
    labelled, replicasets, backends = await asyncio.gather(
        kube.list_pods(namespace, query), kube.list_replicasets(namespace, query),
        kube.list_pods(namespace, to_query(selector)))
    routers, strangers = owned_pods(name, labelled, replicasets)
    for pod in strangers:
        if pod["metadata"].get("uid") in _reported:
            continue
        _reported.add(pod["metadata"].get("uid"))
        log.warning("pod %s/%s carries the router labels of %s but is not owned by Deployment %s: ignored",
                    namespace, pod["metadata"]["name"], name, child_name(name))
    backends = [pod for pod in backends if not pod["metadata"].get("deletionTimestamp")]
    # Only Ready pods: one still starting (or shutting down) is not "unreachable", and would flap Degraded.
    live = [pod for pod in routers if is_ready(pod) and (pod.get("status") or {}).get("podIP")]
    obs = Observation(routers_ready=sum(map(is_ready, routers)), routers_desired=desired,
                      listed=[pod["metadata"]["name"] for pod in routers],
                      backends_ready=sum(map(is_ready, backends)), backends_total=len(backends), read_at=now())
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(*(_poll(session, pod, token) for pod in live), return_exceptions=True)
    for pod, result in zip(live, results):
        pod_name = pod["metadata"]["name"]
        if isinstance(result, BaseException):
            log.info("router pod %s: /status unreachable: %r", pod_name, result)
            obs.unreachable.append(pod_name)
        else:
            obs.reports[pod_name] = result
    return obs


async def collect(resource: dict, previous: dict, generation: int | None, token_key: bytes | None = None) -> dict:
    """The full status document for ``resource`` as it is now, over its ``previous`` status, reporting
    ``generation`` as observed; ``token_key`` is the operator's key for admin tokens, as given to ``render``."""
    meta = resource["metadata"]
    try:
        spec = parse_spec(resource)
    except InvalidSpec as error:
        return invalid(previous, meta.get("generation"), str(error))
    obs = await observe(meta["namespace"], meta["name"], spec.selector, spec.router.replicas,
                        token_for(resource, spec, token_key))
    return summarize(obs, previous, generation)

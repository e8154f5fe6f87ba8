"""The status document: counters summed, conditions per Kubernetes conventions."""
from __future__ import annotations

import json

import aiohttp
import kopf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kmock._internal import dicts

from rollout_router_operator import handlers
from rollout_router_operator import status as status_module
from rollout_router_operator.status import (
    MAX_STATUS_BYTES,
    BadStatus,
    Observation,
    conditions,
    invalid,
    parse_report,
    rejected,
    summarize,
)
from tests.test_render_security import _handler, resource


def obs(**changes) -> Observation:
    base = dict(routers_ready=2, routers_desired=2, backends_ready=3, backends_total=4, read_at="2026-01-01T00:00:10Z",
                reports={"r0": {"affinity_kept": 5, "affinity_broken": 1, "new_sessions": 2},
                         "r1": {"affinity_kept": 7, "affinity_broken": 0, "new_sessions": 3}})
    return Observation(**{**base, **changes})


def test_group_counters_are_summed_beside_kept_and_broken():
    reports = {"r0": {"affinity_kept": 1, "group_colocated": 15, "group_spilled": 1},
               "r1": {"affinity_kept": 2, "group_colocated": 30, "group_spilled": 2}}
    affinity = summarize(obs(reports=reports), {}, 1)["affinity"]
    assert (affinity["kept"], affinity["groupColocated"], affinity["groupSpilled"]) == (3, 45, 3)
    assert parse_report(b'{"group_colocated": 7, "group_spilled": 2}')["group_colocated"] == 7
    with pytest.raises(BadStatus, match="group_spilled"):
        parse_report(b'{"group_spilled": -1}')


def by_type(status: dict) -> dict:
    return {c["type"]: c for c in status["conditions"]}


def test_counters_are_summed_over_router_pods():
    status = summarize(obs(), {}, 3)
    assert status["affinity"] == {"kept": 12, "broken": 1, "newSessions": 5, "groupColocated": 0, "groupSpilled": 0,
                                  "readAt": "2026-01-01T00:00:10Z", "routersRead": 2, "unreachable": [],
                                  "repinPrefillTokens": 0, "repinPrefillTurns": 0, "ttfbMovedVsKept": None}
    assert status["backends"] == {"ready": 3, "total": 4, "summary": "3/4"}
    assert status["routers"]["summary"] == "2/2" and status["observedGeneration"] == 3
    conds = by_type(status)
    assert (conds["Ready"]["status"], conds["Progressing"]["status"], conds["Degraded"]["status"]) == ("True", "False", "False")
    assert all(c["observedGeneration"] == 3 for c in status["conditions"])


def test_unreachable_routers_degrade_but_the_others_still_count():
    status = summarize(obs(unreachable=["r2"]), {}, 1)
    assert by_type(status)["Degraded"]["reason"] == "RoutersUnreachable" and "r2" in by_type(status)["Degraded"]["message"]
    assert status["affinity"]["kept"] == 12


def test_not_ready_reasons():
    assert by_type(summarize(obs(routers_ready=1), {}, 1))["Ready"]["reason"] == "RoutersNotReady"
    assert by_type(summarize(obs(routers_ready=1), {}, 1))["Progressing"]["status"] == "True"
    assert by_type(summarize(obs(backends_ready=0), {}, 1))["Ready"]["reason"] == "NoReadyBackends"
    assert by_type(summarize(obs(routers_desired=0, routers_ready=0), {}, 1))["Ready"]["reason"] == "ScaledToZero"


def test_transition_time_moves_only_when_the_status_flips():
    first = summarize(obs(), {}, 1)
    later = summarize(obs(read_at="2026-01-01T00:05:00Z"), first, 1)
    assert by_type(later)["Ready"]["lastTransitionTime"] == "2026-01-01T00:00:10Z"
    flipped = summarize(obs(routers_ready=0, read_at="2026-01-01T00:06:00Z"), later, 1)
    assert by_type(flipped)["Ready"]["lastTransitionTime"] == "2026-01-01T00:06:00Z"


def test_invalid_spec_status_names_the_field():
    status = invalid({}, 4, "spec.selector: matches the router's own pods")
    conds = by_type(status)
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == "InvalidSpec"
    assert conds["Ready"]["status"] == "False" and "spec.selector" in conds["Degraded"]["message"]
    assert status["observedGeneration"] == 4


def test_the_poller_leaves_an_invalid_generation_alone():
    """The timer must not overwrite reconcile's InvalidSpec (an image off the allowlist, a 422) with counters."""
    status = invalid({}, 4, "spec.router.image: x is not an allowed router image")
    assert rejected(status, 4)
    assert not rejected(status, 5)  # the spec changed since: reconcile runs again, the poller may too
    assert not rejected(summarize(obs(), {}, 4), 4) and not rejected({}, None)


def test_conditions_keep_order_and_types():
    result = conditions([], [("Ready", "True", "R", "m")], 1, "t")
    assert result == [{"type": "Ready", "status": "True", "reason": "R", "message": "m",
                       "lastTransitionTime": "t", "observedGeneration": 1}]


def test_operator_rbac_covers_exactly_what_it_does():
    """docs/examples/operator.yaml grants create/patch/delete on every child kind, and what the routers get."""
    from pathlib import Path

    import yaml

    from rollout_router_operator.render import child_refs, render
    from tests.k8s.resources import resource_of

    docs = list(yaml.safe_load_all((Path(__file__).resolve().parents[1] / "docs/examples/operator.yaml").read_text()))
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    grants = {(group, resource): set(rule["verbs"]) for rule in role["rules"]
              for group in rule["apiGroups"] for resource in rule["resources"]}
    for api_version, kind, _ in child_refs("x"):
        plural = resource_of(api_version, kind).plural
        group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
        assert grants[(group, plural)] == {"create", "patch", "delete"}, plural
    body = {"metadata": {"name": "x", "namespace": "n", "uid": "u"}, "spec": {"selector": {"matchLabels": {"a": "b"}}}}
    (router_role,) = [m for m in render(body) if m["kind"] == "Role"]
    for rule in router_role["rules"]:  # RBAC forbids granting what the granter lacks
        assert set(rule["verbs"]) <= grants[("", "pods")]
    assert grants[("rolloutrouter.dev", "rolloutrouters/status")] == {"patch"}


def owned_pod(name: str, ready: bool = True, owner_uid: str = "rs-1") -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}",
                         "ownerReferences": [{"kind": "ReplicaSet", "name": "rr-router-abc", "uid": owner_uid,
                                              "controller": True}]},
            "status": {"phase": "Running", "podIP": "127.0.0.99",
                       "conditions": [{"type": "Ready", "status": str(ready)}]}}


OUR_REPLICASET = {"metadata": {"name": "rr-router-abc", "uid": "rs-1", "ownerReferences": [
    {"kind": "Deployment", "name": "rr-router", "uid": "d-1", "controller": True}]}}


@pytest.fixture
def cluster_of(monkeypatch):
    """Stand-in pod and ReplicaSet listings, and a /status poll that records whom it asked."""
    import rollout_router_operator.status as status_module
    polled: list[str] = []

    def install(pods: list[dict], replicasets: list[dict]) -> list[str]:
        async def list_pods(namespace, selector):
            return pods if "rollout-router" in selector else []

        async def list_replicasets(namespace, selector):
            return replicasets

        async def fake_poll(session, pod, token=None):
            polled.append(pod["metadata"]["name"])
            return {"affinity_kept": 1}
        monkeypatch.setattr(status_module.kube, "list_pods", list_pods)
        monkeypatch.setattr(status_module.kube, "list_replicasets", list_replicasets)
        monkeypatch.setattr(status_module, "_poll", fake_poll)
        return polled
    return install


async def observe_rr():
    from rollout_router.settings import LabelSelector
    from rollout_router_operator.status import observe
    return await observe("ns", "rr", LabelSelector(match_labels={"app": "vllm"}), desired=2)


async def test_only_ready_router_pods_are_polled(cluster_of):
    """A router pod still starting is not 'unreachable': polling it would flap Degraded on every rollout."""
    polled = cluster_of([owned_pod("ready"), owned_pod("starting", ready=False)], [OUR_REPLICASET])
    seen = await observe_rr()
    assert polled == ["ready"] and seen.unreachable == [] and seen.routers_ready == 1


async def test_pods_not_owned_by_our_deployment_are_ignored_and_logged(cluster_of, caplog):
    """A Ready pod with the router's labels counts only when its ReplicaSet belongs to our Deployment."""
    stranger = {**owned_pod("stranger"), "metadata": {"name": "stranger", "uid": "uid-s"}}  # labels, no owner
    forged = owned_pod("forged", owner_uid="rs-other")  # owned by a ReplicaSet of another Deployment
    other_rs = {"metadata": {"name": "x", "uid": "rs-other", "ownerReferences": [
        {"kind": "Deployment", "name": "someone-else", "uid": "d-2", "controller": True}]}}
    polled = cluster_of([owned_pod("ours"), stranger, forged], [OUR_REPLICASET, other_rs])
    seen = await observe_rr()
    assert polled == ["ours"] and seen.routers_ready == 1 and set(seen.reports) == {"ours"}
    assert "stranger" in caplog.text and "forged" in caplog.text and "not owned by Deployment rr-router" in caplog.text


@pytest.mark.parametrize(("body", "problem"), [
    (b"x" * (MAX_STATUS_BYTES + 1), "larger than"),
    (b"not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"affinity_kept": "12"}', "not a count"),
    (b'{"affinity_broken": -1}', "not a count"),
    (b'{"new_sessions": 1e309}', "not a count"),
    (b'{"started_at": "yesterday"}', "started_at is not a time"),
    (b'{"started_at": 1e309}', "started_at is not a time"),
])
def test_a_status_that_is_not_a_routers_is_refused(body, problem):
    with pytest.raises(BadStatus, match=problem):
        parse_report(body)


NO_FLEET = {"forwarded": 0, "handoffs": 0, "ownerUnreachable": 0, "replaced": 0, "lookups": 0}
NO_MARGIN = {"repin_prefill_tokens": 0, "repin_prefill_turns": 0,
             "ttfb": {"moved": {"turns": 0, "seconds": 0.0}, "kept": {"turns": 0, "seconds": 0.0}}}


def test_a_routers_status_gives_its_counters():
    assert parse_report(b'{"affinity_kept": 3, "affinity_broken": 1, "sessions": 9, "backends": []}') == \
        {"affinity_kept": 3, "affinity_broken": 1, "new_sessions": 0, "group_colocated": 0, "group_spilled": 0,
         "started_at": None, "fleet": NO_FLEET, "margin": NO_MARGIN}
    assert parse_report(b'{"started_at": 1767225600.125}')["started_at"] == 1767225600.125
    assert parse_report(b'{"affinity_kept": 3, "fleet": null}')["fleet"] == NO_FLEET  # a router without ownership
    owned = b'{"fleet": {"self": "http://10.0.0.1:8081", "members": ["a", "b"], "forwarded": 4, "handoffs": 2, ' \
            b'"ownerUnreachable": 1, "replaced": 3, "lookups": 6, "loadView": "exchange", "peerLoadAgeSeconds": {"b": 0.1}}}'
    assert parse_report(owned)["fleet"] == {"forwarded": 4, "handoffs": 2, "ownerUnreachable": 1, "replaced": 3,
                                            "lookups": 6}


@pytest.mark.parametrize(("body", "problem"), [
    (b'{"fleet": [1]}', "fleet is not a JSON object"),
    (b'{"fleet": {"forwarded": "4"}}', "fleet.forwarded is not a count"),
    (b'{"fleet": {"handoffs": -2}}', "fleet.handoffs is not a count"),
    (b'{"fleet": {"replaced": true}}', "fleet.replaced is not a count"),
])
def test_fleet_counters_that_are_not_counts_are_refused(body, problem):
    with pytest.raises(BadStatus, match=problem):
        parse_report(body)


def test_fleet_counters_are_summed_over_router_pods_missing_or_null_as_zero():
    reports = {"r0": parse_report(b'{"fleet": {"forwarded": 5, "handoffs": 1, "ownerUnreachable": 2, "replaced": 0, '
                                   b'"lookups": 3}}'),
               "r1": parse_report(b'{"fleet": {"forwarded": 7, "handoffs": 0, "ownerUnreachable": 0, "replaced": 4, '
                                   b'"lookups": 2}}'),
               "r2": parse_report(b'{"fleet": null}'), "r3": {"affinity_kept": 1}}  # an older router: no fleet at all
    status = summarize(obs(reports=reports), {}, 1)
    assert status["fleet"] == {"forwarded": 12, "handoffs": 1, "ownerUnreachable": 2, "replaced": 4, "lookups": 5}
    assert summarize(obs(), {}, 1)["fleet"] == NO_FLEET and status["affinity"]["routersRead"] == 4


async def test_an_oversized_status_is_read_no_further_than_the_limit(monkeypatch):
    """Over real HTTP: a pod that answers megabytes is read no further than the limit and reported."""
    import aiohttp
    from aiohttp import web

    from rollout_router.localfleet import free_port
    from rollout_router_operator import status as status_module

    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # chunked: no Content-Length to refuse it early
        await response.prepare(request)
        try:
            for _ in range(64):
                await response.write(b" " * 65536)
        except ConnectionError:  # the poller stopped reading at the limit and hung up
            pass
        return response
    app = web.Application()
    app.router.add_get("/status", huge)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port("127.0.0.1")
    await web.TCPSite(runner, "127.0.0.1", port).start()
    monkeypatch.setattr(status_module, "ROUTER_ADMIN_PORT", port)
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(BadStatus, match="larger than"):
                await status_module._poll(session, {"status": {"podIP": "127.0.0.1"}})
    finally:
        await runner.cleanup()


async def test_the_poller_sends_the_resources_admin_token():
    """Over real HTTP: a router that wants a token answers the poller that sends it, and no one else."""
    from aiohttp import ClientResponseError, web

    from rollout_router.localfleet import free_port
    from rollout_router_operator import status as status_module

    async def guarded(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer s3cret":
            return web.json_response({"error": "token"}, status=401)
        return web.json_response({"affinity_kept": 4, "fleet": {"forwarded": 2}})
    app = web.Application()
    app.router.add_get("/status", guarded)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port("127.0.0.1")
    await web.TCPSite(runner, "127.0.0.1", port).start()
    pod = {"status": {"podIP": "127.0.0.1"}}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(status_module, "ROUTER_ADMIN_PORT", port)
            async with aiohttp.ClientSession() as session:
                report = await status_module._poll(session, pod, "s3cret")
                assert report["affinity_kept"] == 4 and report["fleet"]["forwarded"] == 2
                with pytest.raises(ClientResponseError) as refused:
                    await status_module._poll(session, pod)
                assert refused.value.status == 401
    finally:
        await runner.cleanup()


def test_the_rl_state_is_the_newest_pods_and_pins_cleared_are_summed():
    older = b'{"rl": {"epoch": [3, "http://a"], "paused": true, "weightVersion": "v1", "pinsCleared": 2, ' \
            b'"last": {"pause": {"at": 0, "outcome": "ok"}}}}'
    newer = b'{"rl": {"epoch": [5, "http://b"], "paused": false, "weightVersion": "v2", "pinsCleared": 3, ' \
            b'"last": {"pause": {"at": 0, "outcome": "ok"}, "update": {"at": 1767225600, "outcome": "ok"}}}}'
    reports = {"r0": parse_report(older), "r1": parse_report(newer), "r2": parse_report(b'{"rl": null}')}
    assert summarize(obs(reports=reports), {}, 1)["rl"] == {
        "weightVersion": "v2", "paused": False, "lastPause": "ok", "lastUpdate": "ok",
        "lastUpdateAt": "2026-01-01T00:00:00Z", "pinsCleared": 5}
    assert summarize(obs(), {}, 1)["rl"] == {"weightVersion": None, "paused": False, "lastPause": None,
                                             "lastUpdate": None, "lastUpdateAt": None, "pinsCleared": 0}


def margin_of(tokens: int, turns: int, moved: tuple[int, float], kept: tuple[int, float]) -> bytes:
    """A router's /status "margin" as the router writes it (means included, which the operator ignores)."""
    ttfb = {name: {"turns": n, "seconds": s, "mean": s / n if n else None} for name, (n, s) in
            (("moved", moved), ("kept", kept), ("broken", moved), ("new", (0, 0.0)))}
    return json.dumps({"margin": {"repin_prefill_tokens": tokens, "repin_prefill_turns": turns,
                                  "kept_prefill_tokens": 7, "kept_prefill_turns": 1, "ttfb": ttfb, "breaks": turns,
                                  "break_gap_mean": 3.0}}).encode()


def test_the_margin_summary_is_summed_over_router_pods_with_ttfb_weighted_by_turns():
    reports = {"r0": parse_report(margin_of(300, 3, (3, 1.5), (10, 1.0))),
               "r1": parse_report(margin_of(100, 1, (1, 0.1), (30, 3.0))), "r2": {"affinity_kept": 1}}
    affinity = summarize(obs(reports=reports), {}, 1)["affinity"]
    assert affinity["repinPrefillTokens"] == 400 and affinity["repinPrefillTurns"] == 4
    assert affinity["ttfbMovedVsKept"] == "0.400s/0.100s"
    only_kept = {"r0": parse_report(margin_of(0, 0, (0, 0.0), (10, 1.0)))}
    assert summarize(obs(reports=only_kept), {}, 1)["affinity"]["ttfbMovedVsKept"] is None


@pytest.mark.parametrize(("body", "problem"), [
    (b'{"margin": [1]}', "margin is not a JSON object"),
    (b'{"margin": {"repin_prefill_tokens": -1}}', "margin.repin_prefill_tokens is not a count"),
    (b'{"margin": {"ttfb": {"moved": {"turns": 1, "seconds": "1"}}}}', "margin.ttfb.moved is not"),
    (b'{"margin": {"ttfb": {"kept": {"turns": 1.5, "seconds": 1}}}}', "margin.ttfb.kept.turns is not a count"),
])
def test_a_margin_summary_that_is_not_counts_is_refused(body, problem):
    with pytest.raises(BadStatus, match=problem):
        parse_report(body)


def polled(previous: dict, reports: dict[str, dict], listed: list[str], unreachable: list[str] = ()) -> dict:
    """One poll's status written over ``previous``, as the merge patch leaves it."""
    document = summarize(obs(reports=reports, listed=listed, unreachable=list(unreachable)), previous, 1)
    return dict(dicts.merge_patch_dict(previous, document))  # RFC 7386, as the emulated API server applies it


def test_counters_never_go_backwards_when_a_pod_is_replaced_restarts_or_misses_a_poll():
    status = polled({}, {"r0": {"affinity_kept": 5, "fleet": {"forwarded": 2}}, "r1": {"affinity_kept": 7}},
                    ["r0", "r1"])
    assert status["affinity"]["kept"] == 12 and status["fleet"]["forwarded"] == 2
    status = polled(status, {"r1": {"affinity_kept": 8}}, ["r0", "r1"], unreachable=["r0"])  # r0 slow this time
    assert status["affinity"]["kept"] == 13 and status["fleet"]["forwarded"] == 2
    assert status["affinity"]["unreachable"] == ["r0"] and by_type(status)["Degraded"]["status"] == "True"
    status = polled(status, {"r1": {"affinity_kept": 9}}, ["r0", "r1"])  # r0 not Ready (not polled), still listed
    assert status["affinity"]["kept"] == 14
    status = polled(status, {"r1": {"affinity_kept": 9}, "r2": {"affinity_kept": 1}}, ["r1", "r2"])  # r0 replaced
    assert status["affinity"]["kept"] == 15 and status["fleet"]["forwarded"] == 2
    assert [entry["pod"] for entry in status["ledger"]["pods"]] == ["r1", "r2"]  # the gone pod leaves the list
    status = polled(status, {"r1": {"affinity_kept": 2}, "r2": {"affinity_kept": 1}}, ["r1", "r2"])  # r1 restarted
    assert status["affinity"]["kept"] == 5 + 9 + 2 + 1
    assert status["ledger"]["retired"]["affinity_kept"] == 14 and status["ledger"]["retired"]["fleet.forwarded"] == 2
    again = polled(status, {"r1": {"affinity_kept": 2}, "r2": {"affinity_kept": 1}}, ["r1", "r2"])
    assert again["affinity"] == status["affinity"]  # a poll that sees nothing new changes nothing


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["count", "restart", "miss", "replace"]), st.integers(0, 2),
                          st.integers(0, 5)), max_size=30))
def test_the_summed_counters_are_what_every_pod_ever_counted_up_to_its_last_answer(events):
    """Pods count, restart (counting again before the next poll, or not), miss polls and are replaced in any
    order: the status's sum never drops, and is what every pod ever counted up to its last answer."""
    pods = {f"p{i}": [0.0, 0] for i in range(3)}  # each pod's router: [started_at, counted since]
    answered = {pod: 0 for pod in pods}  # what each pod had counted at its last answer, since its last start
    counted, next_pod, clock = 0, 3, 1.0  # what gone or restarted routers counted up to their last answer
    status = polled({}, {pod: {"started_at": 0.0, "affinity_kept": 0} for pod in pods}, list(pods))
    shown = 0
    for kind, index, amount in events:
        pod = sorted(pods)[index]
        silent: list[str] = []
        if kind == "count":
            pods[pod][1] += amount + 1
        elif kind == "restart":
            counted += answered[pod]
            pods[pod], answered[pod], clock = [clock, amount], 0, clock + 1
        elif kind == "miss":
            pods[pod][1] += amount
            silent = [pod]
        else:
            counted += answered.pop(pod)
            del pods[pod]
            pods[f"p{next_pod}"], answered[f"p{next_pod}"] = [clock, 0], 0
            next_pod, clock = next_pod + 1, clock + 1
        status = polled(status, {p: {"started_at": s, "affinity_kept": n} for p, (s, n) in pods.items()
                                 if p not in silent}, sorted(pods), silent)
        answered.update({p: n for p, (_, n) in pods.items() if p not in silent})
        assert status["affinity"]["kept"] >= shown
        shown = status["affinity"]["kept"]
        assert shown == counted + sum(answered.values())


async def test_a_reconcile_with_a_body_older_than_the_timers_last_write_loses_no_count(monkeypatch):
    """kopf hands a reconcile the body of its event, which can predate what the timer wrote while the reconcile
    waited for the status lock: computed from that body's status, a pod replaced meanwhile would take its counts
    with it. The status handlers build on what they last wrote."""
    written: list[dict] = []
    seen = [obs(reports={"old-pod": {"affinity_kept": 5}}, listed=["old-pod"])]

    async def patch_status(namespace, name, document):
        written.append(document)

    async def observe(*args, **kwargs):
        return seen[-1]

    async def apply(manifest):
        pass
    monkeypatch.setattr(handlers.kube, "patch_status", patch_status)
    monkeypatch.setattr(handlers.kube, "apply", apply)
    monkeypatch.setattr(handlers.kube, "delete", lambda *args: apply(None))
    monkeypatch.setattr(status_module, "observe", observe)
    registry = kopf.OperatorRegistry()
    handlers.register(registry, 1.0, "example.com/rr:1")
    body = {**resource(), "status": None}
    body["metadata"]["generation"] = 1
    memo = kopf.Memo()
    logger = kopf.LocalObjectLogger(body=kopf.Body(body), settings=kopf.OperatorSettings())
    await _handler(registry, "refresh")(body=kopf.Body(body), memo=memo)
    assert written[-1]["affinity"]["kept"] == 5
    seen.append(obs(reports={"new-pod": {"affinity_kept": 1}}, listed=["new-pod"]))  # the pod was replaced
    await _handler(registry, "reconcile")(body=kopf.Body(body), retry=0, reason="update", memo=memo, logger=logger)
    assert written[-1]["affinity"]["kept"] == 6 and written[-1]["ledger"]["retired"]["affinity_kept"] == 5

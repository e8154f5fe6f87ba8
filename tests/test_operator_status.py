"""The status document: counters summed, conditions per Kubernetes conventions."""
from __future__ import annotations

from rollout_router_operator.status import Observation, conditions, invalid, summarize


def obs(**changes) -> Observation:
    base = dict(routers_ready=2, routers_desired=2, backends_ready=3, backends_total=4, read_at="2026-01-01T00:00:10Z",
                reports={"r0": {"affinity_kept": 5, "affinity_broken": 1, "new_sessions": 2},
                         "r1": {"affinity_kept": 7, "affinity_broken": 0, "new_sessions": 3}})
    return Observation(**{**base, **changes})


def by_type(status: dict) -> dict:
    return {c["type"]: c for c in status["conditions"]}


def test_counters_are_summed_over_router_pods():
    status = summarize(obs(), {}, 3)
    assert status["affinity"] == {"kept": 12, "broken": 1, "newSessions": 5, "readAt": "2026-01-01T00:00:10Z",
                                  "routersRead": 2, "unreachable": []}
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


async def test_only_ready_router_pods_are_polled(monkeypatch):
    """A router pod still starting is not 'unreachable': polling it would flap Degraded on every rollout."""
    import rollout_router_operator.status as status_module
    from rollout_router.settings import LabelSelector

    def pod(name: str, ready: bool) -> dict:
        return {"metadata": {"name": name}, "status": {"phase": "Running", "podIP": "127.0.0.99",
                                                        "conditions": [{"type": "Ready", "status": str(ready)}]}}

    polled = []

    async def fake_poll(session, pod):
        polled.append(pod["metadata"]["name"])
        return {"affinity_kept": 1}

    async def list_pods(namespace, selector):
        return [pod("ready", True), pod("starting", False)]

    monkeypatch.setattr(status_module.kube, "list_pods", list_pods)
    monkeypatch.setattr(status_module, "_poll", fake_poll)
    seen = await status_module.observe("ns", "rr", LabelSelector(match_labels={"app": "vllm"}), desired=2)
    assert polled == ["ready"] and seen.unreachable == [] and seen.routers_ready == 1

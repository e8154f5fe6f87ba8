"""spec.serviceMonitor: a resource's own ServiceMonitor, which sends its routers' admin token, and the chart's
ServiceMonitor leaving that resource's Service to it."""
from __future__ import annotations

import base64
import re

import jsonschema
import pytest

from rollout_router.kube.selectors import matches
from rollout_router.settings import LabelSelector
from rollout_router_operator.render import InvalidSpec, render
from tests.test_chart import SERVICEMONITOR_SCHEMA, chart, scenario_values  # noqa: F401
from tests.test_chart import render as render_chart
from tests.test_chart_operator import monitor_named
from tests.test_render_security import resource

KEY = b"k" * 32
MONITOR = {"enabled": True, "labels": {"release": "kube-prometheus-stack"}, "interval": "15s", "scrapeTimeout": "5s"}


def of_kind(manifests: list[dict], kind: str) -> dict | None:
    return next((m for m in manifests if m["kind"] == kind), None)


def test_service_monitor_scrapes_the_admin_port_with_the_resources_own_token():
    children = render(resource({"serviceMonitor": MONITOR}), token_key=KEY)
    monitor, service, secret = (of_kind(children, kind) for kind in ("ServiceMonitor", "Service", "Secret"))
    jsonschema.validate(monitor, SERVICEMONITOR_SCHEMA)
    assert monitor["metadata"]["name"] == "rr1-router" and monitor["metadata"]["namespace"] == "ns"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rollout-router-operator"
    assert monitor["metadata"]["ownerReferences"][0]["name"] == "rr1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["port"] == "admin"
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == ("/metrics", "15s", "5s")
    credentials = endpoint["authorization"]["credentials"]
    assert endpoint["authorization"]["type"] == "Bearer"
    assert credentials["name"] == secret["metadata"]["name"] and credentials["key"] in secret["data"]
    assert base64.b64decode(secret["data"][credentials["key"]])  # the Secret the routers' --admin-token-file reads
    assert {"sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_instance"],
            "targetLabel": "rolloutrouter", "action": "replace"} in endpoint["relabelings"]
    assert children.index(monitor) > children.index(secret)  # applied after the Secret it names


@pytest.mark.parametrize("spec", [{"router": {"adminToken": False}}, {}])
def test_service_monitor_without_a_token_sends_none(spec):
    key = KEY if spec else None  # adminToken false, or an operator without a key: no Secret, no credentials
    children = render(resource({**spec, "serviceMonitor": {"enabled": True}}), token_key=key)
    assert of_kind(children, "Secret") is None
    (endpoint,) = of_kind(children, "ServiceMonitor")["spec"]["endpoints"]
    assert "authorization" not in endpoint and endpoint["interval"] == "30s"


def test_a_service_monitor_takes_kubernetes_labels_and_prometheus_durations():
    monitor = {"enabled": True, "labels": {"example.com/team": "rl", "release": "", "a_b.c": "X-1"},
               "interval": "1m30s", "scrapeTimeout": "1m30s"}
    (endpoint,) = of_kind(render(resource({"serviceMonitor": monitor}), token_key=KEY), "ServiceMonitor")["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("1m30s", "1m30s")


def test_no_service_monitor_unless_asked():
    children = render(resource(), token_key=KEY)
    assert of_kind(children, "ServiceMonitor") is None
    assert "rolloutrouter.dev/service-monitor" not in of_kind(children, "Service")["metadata"]["labels"]


def test_the_charts_router_monitor_leaves_a_service_with_its_own_monitor(chart):
    selector = monitor_named(render_chart(chart, scenario_values("servicemonitor")), "routers")["spec"]["selector"]
    jsonschema.validate({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                         "metadata": {"name": "x", "namespace": "ns"}, "spec": {"selector": selector, "endpoints": [{}]}},
                        SERVICEMONITOR_SCHEMA)
    chart_selector = LabelSelector.model_validate(selector)
    own = of_kind(render(resource({"serviceMonitor": MONITOR}), token_key=KEY), "Service")
    shared = of_kind(render(resource(), token_key=KEY), "Service")
    assert matches(chart_selector, shared["metadata"]["labels"])
    assert not matches(chart_selector, own["metadata"]["labels"])  # scraped once, by its own, with its token


@pytest.mark.parametrize(("monitor", "problem"), [
    ({"enabled": True, "labels": {"app.kubernetes.io/managed-by": "me"}},
     "spec.serviceMonitor.labels: app.kubernetes.io/managed-by is set by the operator"),
    ({"enabled": True, "labels": {"team/": "rl"}}, "spec.serviceMonitor.labels: team/=rl is not a Kubernetes label"),
    ({"enabled": True, "labels": {"Team.Example/x": "a"}}, "Team.Example/x=a is not a Kubernetes label"),
    ({"enabled": True, "labels": {"team": "-rl"}}, "team=-rl is not a Kubernetes label"),
    ({"enabled": True, "interval": "30 seconds"}, "spec.serviceMonitor.interval: String should match pattern"),
    ({"enabled": True, "interval": "1d"}, "spec.serviceMonitor.interval: String should match pattern"),
    ({"enabled": True, "interval": "5s"}, "spec.serviceMonitor.scrapeTimeout: scrapeTimeout must be at most the interval"),
    ({"enabled": True, "interval": "1m", "scrapeTimeout": "1m500ms"}, "scrapeTimeout must be at most the interval"),
    ({"enabled": True, "scrapeTimout": "5s"}, "spec.serviceMonitor.scrapeTimout: Extra inputs are not permitted"),
])
def test_a_bad_service_monitor_spec_is_refused_by_name(monitor, problem):
    with pytest.raises(InvalidSpec, match=problem):
        render(resource({"serviceMonitor": monitor}), token_key=KEY)


def test_the_admission_policy_admits_the_service_monitor_render_writes_and_only_its_fields(chart):
    """The chart's policy allowlists ServiceMonitor fields (evaluated by a real API server in
    tests/realk8s/test_service_monitor.py); what render writes must stay inside that list."""
    policy = next(m for m in render_chart(chart, {}) if m["kind"] == "ValidatingAdmissionPolicy")
    (rule,) = [v["expression"] for v in policy["spec"]["validations"] if "'servicemonitors'" in v["expression"]]
    spec_keys, endpoint_keys, authorization_keys, credential_keys = (
        set(re.findall(r"'([A-Za-z]+)'", listed)) for listed in re.findall(r"k in \[([^\]]*)\]", rule))
    monitor = of_kind(render(resource({"serviceMonitor": MONITOR}), token_key=KEY), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert set(monitor["spec"]) <= spec_keys and set(endpoint) <= endpoint_keys
    assert set(endpoint["authorization"]) <= authorization_keys
    assert set(endpoint["authorization"]["credentials"]) <= credential_keys
    name = monitor["metadata"]["name"]  # the policy's name rule: <name>-router names <name>-router-admin-token
    assert f"endsWith('{name.removeprefix('rr1')}')" in rule
    assert endpoint["authorization"]["credentials"]["name"] == name + "-admin-token" and "+ '-admin-token'" in rule

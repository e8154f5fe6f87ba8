"""The chart's operator wiring: its image reaching router pods (--router-image) and its metrics
(port, Service, ServiceMonitors), on the helpers and fixture of tests/test_chart.py."""
from __future__ import annotations

import argparse

import pytest

from rollout_router_operator import cli
from rollout_router_operator.render import ROUTER_ADMIN_PORT
from rollout_router_operator.render import render as render_children
from rollout_router_operator.spec import DEFAULT_IMAGE
from tests.test_chart import OPERATOR_IMAGE, RELEASE, chart, example_resource, of_kind, one, render, scenario_values  # noqa: F401


def operator_container(manifests: list[dict]) -> dict:
    (container,) = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def operator_args(container: dict) -> argparse.Namespace:
    """The chart's command line as the operator itself parses it (an unknown flag fails here)."""
    assert container["command"][:2] == ["rollout-router", "operator"]
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(container["command"][2:])


@pytest.mark.parametrize(("router_image", "expected"), [
    ({}, DEFAULT_IMAGE),
    ({"repository": "registry.example.com/mirror/rollout-router"}, "registry.example.com/mirror/rollout-router:0.1.0"),
    ({"repository": "registry.example.com/rr", "tag": "dev"}, "registry.example.com/rr:dev"),
])
def test_the_charts_router_image_reaches_router_pods_through_router_image(chart, router_image, expected):
    """Overriding routerImage.repository/tag changes, by --router-image, every router's image, not the operator's."""
    container = operator_container(render(chart, {"routerImage": router_image} if router_image else {}))
    assert container["image"] == OPERATOR_IMAGE
    assert f"--router-image={expected}" in container["command"]
    routers = render_children(example_resource(), default_image=operator_args(container).router_image)
    assert one(routers, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"] == expected


def test_the_operators_image_is_not_the_routers(chart):
    """Overriding image.repository/tag moves the operator only: router pods keep the router image."""
    container = operator_container(render(chart, {"image": {"repository": "registry.example.com/op", "tag": "dev"}}))
    assert container["image"] == "registry.example.com/op:dev"
    assert operator_args(container).router_image == DEFAULT_IMAGE


def monitor_named(manifests: list[dict], suffix: str) -> dict:
    (found,) = [m for m in of_kind(manifests, "ServiceMonitor") if m["metadata"]["name"] == f"{RELEASE}-rollout-router-{suffix}"]
    return found


def test_servicemonitor_selects_the_router_services_the_operator_creates(chart):
    manifests = render(chart, scenario_values("servicemonitor"))
    assert len(of_kind(manifests, "ServiceMonitor")) == 2  # the routers' and the operator's
    monitor = monitor_named(manifests, "routers")
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["infra"]}  # by default the release namespace only
    everywhere = render(chart, {**scenario_values("servicemonitor"), "operator": {"watchAllNamespaces": True}})
    assert monitor_named(everywhere, "routers")["spec"]["namespaceSelector"] == {"any": True}
    router_service = next(c for c in render_children(example_resource()) if c["kind"] == "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= router_service["metadata"]["labels"].items()
    operator_service = one(manifests, "Service")
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= operator_service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    (scraped,) = [p for p in router_service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert scraped["port"] == ROUTER_ADMIN_PORT  # /metrics is served by the admin listener, not the traffic port
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == ("/metrics", "15s", "5s")
    # The dashboard filters on namespace (set by the Prometheus Operator) and rolloutrouter (this relabeling).
    label = "app.kubernetes.io/instance"
    assert {"sourceLabels": ["__meta_kubernetes_service_label_" + label.replace(".", "_").replace("/", "_")],
            "targetLabel": "rolloutrouter", "action": "replace"} in endpoint["relabelings"]
    assert router_service["metadata"]["labels"][label] == "rollouts"
    namespaced = render(chart, {**scenario_values("namespaced"), "serviceMonitor": {"enabled": True}})
    assert monitor_named(namespaced, "routers")["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert of_kind(render(chart, {}), "ServiceMonitor") == []


@pytest.mark.parametrize("scenario", ["servicemonitor", "namespaced"])
def test_servicemonitor_scrapes_the_operators_metrics_port(chart, scenario):
    values = {**scenario_values(scenario), "serviceMonitor": {**scenario_values("servicemonitor")["serviceMonitor"]},
              "operator": {**scenario_values(scenario).get("operator", {}), "metricsPort": 9090},
              "service": {"metricsPort": 9091}}
    manifests = render(chart, values)
    monitor, service = monitor_named(manifests, "operator"), one(manifests, "Service")
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert (port["port"], port["targetPort"]) == (9091, "metrics")
    container = operator_container(manifests)
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    assert "--metrics-port=9090" in container["command"] and operator_args(container).metrics_port == 9090
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == ("/metrics", "15s", "5s")
    assert endpoint["metricRelabelings"] == values["serviceMonitor"]["metricRelabelings"]
    # the routers' ServiceMonitor never selects the operator's Service, nor the operator's the routers'
    router_service = next(c for c in render_children(example_resource()) if c["kind"] == "Service")
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= router_service["metadata"]["labels"].items()


def test_metrics_and_health_ports_must_differ(chart):
    with pytest.raises(Exception, match="metricsPort must differ"):
        render(chart, {"operator": {"metricsPort": 8081}})

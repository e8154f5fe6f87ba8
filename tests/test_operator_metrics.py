"""The operator's metrics module and its command-line flags (metrics port, default router image)."""
from __future__ import annotations

import argparse
import contextlib
import urllib.request
from pathlib import Path

import kopf
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from rollout_router.kube.client import ApiError
from rollout_router_operator import cli, kube, metrics
from rollout_router_operator.spec import DEFAULT_IMAGE

POLLED = {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Degraded", "status": "True"}],
          "affinity": {"routersRead": 2, "unreachable": ["r2"]}}
INVALID = {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Degraded", "status": "True"}]}


def sample(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.mark.parametrize(("error", "outcome"), [
    (None, metrics.SUCCESS), (kopf.TemporaryError("409"), metrics.API_ERROR), (kube.RetryableError("503"), metrics.API_ERROR),
    (ApiError(403, "Forbidden", ""), metrics.API_ERROR), (KeyError("bug"), metrics.ERROR)])
def test_a_handler_run_is_counted_by_outcome_and_exceptions_still_reach_kopf(error, outcome):
    before = sample("rolloutrouter_operator_reconciles_total", handler="create", outcome=outcome)
    timed = sample("rolloutrouter_operator_reconcile_duration_seconds_count", handler="create")
    with pytest.raises(type(error)) if error else contextlib.nullcontext():
        with metrics.reconcile("create"):
            if error:
                raise error
    assert sample("rolloutrouter_operator_reconciles_total", handler="create", outcome=outcome) == before + 1
    assert sample("rolloutrouter_operator_reconcile_duration_seconds_count", handler="create") == timed + 1


def test_a_handler_reports_its_own_outcome():
    before = sample("rolloutrouter_operator_reconciles_total", handler="update", outcome="invalid_spec")
    with metrics.reconcile("update") as run:
        run.outcome = metrics.INVALID_SPEC
    assert sample("rolloutrouter_operator_reconciles_total", handler="update", outcome="invalid_spec") == before + 1


def test_status_documents_count_router_reads_and_conditions():
    ok, unreachable = sample("rolloutrouter_operator_status_polls_total", result="ok"), \
        sample("rolloutrouter_operator_status_polls_total", result="unreachable")
    metrics.status_written("ns", "a", POLLED)
    metrics.status_written("ns", "b", INVALID)
    assert sample("rolloutrouter_operator_status_polls_total", result="ok") == ok + 2
    assert sample("rolloutrouter_operator_status_polls_total", result="unreachable") == unreachable + 1
    assert sample("rolloutrouter_operator_resources", condition="Degraded", status="True") >= 2
    ready = sample("rolloutrouter_operator_resources", condition="Ready", status="True")
    metrics.forget("ns", "a")
    metrics.forget("ns", "b")
    assert sample("rolloutrouter_operator_resources", condition="Ready", status="True") == ready - 1
    assert sample("rolloutrouter_operator_last_status_poll_timestamp_seconds") > 0


def test_metrics_are_served_over_http():
    port = metrics.serve("127.0.0.1", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as response:
        names = {family.name for family in text_string_to_metric_families(response.read().decode())}
    assert {"rolloutrouter_operator_reconciles", "rolloutrouter_operator_status_polls", "rolloutrouter_operator_resources",
            "rolloutrouter_operator_last_status_poll_timestamp_seconds", "process_cpu_seconds"} <= names


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_router_image_flag_then_env_then_built_in_default(monkeypatch):
    monkeypatch.delenv(cli.IMAGE_ENV, raising=False)
    assert parse([]).router_image == DEFAULT_IMAGE
    monkeypatch.setenv(cli.IMAGE_ENV, "mirror.example.com/rr:1")
    assert parse([]).router_image == "mirror.example.com/rr:1"
    assert parse(["--router-image", "other.example.com/rr:2"]).router_image == "other.example.com/rr:2"


def test_allowed_image_flags_replace_the_environments_list(monkeypatch):
    """An allow-list on the command line is the whole list: the environment's patterns do not widen it."""
    monkeypatch.setenv(cli.ALLOWED_IMAGES_ENV, "mirror.example.com/*, other.example.com/rr:*")
    assert parse([]).allowed_images == ["mirror.example.com/*", "other.example.com/rr:*"]
    assert parse(["--allowed-image", "registry.example.com/rr:*", "--allowed-image", "b/*"]).allowed_images == [
        "registry.example.com/rr:*", "b/*"]
    monkeypatch.delenv(cli.ALLOWED_IMAGES_ENV)
    assert parse([]).allowed_images == []
    assert parse(["--allowed-image", "x/*"]).allowed_images == ["x/*"]


def test_metrics_port_defaults_beside_the_liveness_port():
    args = parse([])
    assert (args.metrics_port, args.metrics_host) == (8080, "0.0.0.0")
    assert parse(["--metrics-port", "0"]).metrics_port == 0  # off


def test_the_install_manifest_runs_a_command_the_operator_accepts():
    """docs/examples/operator.yaml: every flag parses; the operator runs the operator image (the router image has
    no kopf: an operator started from it exits), routers the router image; metrics exposed."""
    root = Path(__file__).resolve().parents[1]
    docs = yaml.safe_load_all((root / "docs/examples/operator.yaml").read_text())
    (deployment,) = [d for d in docs if d and d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = parse(container["command"][2:])
    chart = yaml.safe_load((root / "charts/rollout-router/Chart.yaml").read_text())
    values = yaml.safe_load((root / "charts/rollout-router/values.yaml").read_text())
    assert container["image"] == f"{values['image']['repository']}:{chart['appVersion']}"  # the chart's operator
    assert args.router_image == DEFAULT_IMAGE == f"{values['routerImage']['repository']}:{chart['appVersion']}"
    assert {"name": "metrics", "containerPort": args.metrics_port} in container["ports"]

"""A real Prometheus scrapes a live router and its simulated vLLM replicas while multi-session
traffic flows; every PromQL expression of the dashboard must return data from it, so a wrong
metric name, label or variable fails here."""
from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from rollout_router.localfleet import local_fleet
from tests.tools import promfleet

ROOT = Path(__file__).resolve().parent.parent
ALL_TARGETS = promfleet.targets(promfleet.load_dashboard())
# One router process here, without peers: the panels reading promfleet.FLEET_METRICS (its fleet row, checked
# by tests/test_dashboard.py) need several routers that own sessions, which this run does not start.
TARGETS = [target for target in ALL_TARGETS if not promfleet.reads_fleet_metrics(target[2])]
IDS = [f"{title}/{ref}" for title, ref, _ in TARGETS]

if promfleet.prometheus_binary() is None:  # `make test` installs it (system-deps); in CI its absence is a failure
    if os.environ.get("CI") == "true":
        raise RuntimeError("prometheus is not installed: run `make system-deps`")
    pytest.skip("prometheus is not installed (make system-deps)", allow_module_level=True)


class Run:
    def __init__(self, router, replicas, prometheus, traffic, status):
        self.router, self.replicas, self.prometheus = router, replicas, prometheus
        self.traffic, self.status = traffic, status

    def range(self, expr: str, **variables: str) -> list[dict]:
        values = {**promfleet.variable_values(), **variables}
        return self.prometheus.query_range(promfleet.substitute(expr, values), self.traffic.started, self.traffic.ended + 2)


@pytest.fixture(scope="module")
def run():
    # Margin 1 over 3 replicas and 24 concurrent sessions: most sticky requests keep their pin, some break.
    with local_fleet(3, router_args=["--affinity-break-margin", "1"]) as (router, replicas):
        with promfleet.prometheus(str(router.admin_url), [r.url for r in replicas]) as prometheus:
            traffic = promfleet.drive_traffic(router.url, sessions=24, seconds=6.0)
            prometheus.wait_scraped_after(traffic.ended + 0.2)
            yield Run(router, replicas, prometheus, traffic, promfleet.router_status(str(router.admin_url)))


def finite(series: list[dict]) -> list[float]:
    return [float(v) for s in series for _, v in s["values"] if math.isfinite(float(v))]


def test_traffic_moved_kept_and_broken(run):
    assert run.traffic.ok > 200
    assert run.traffic.replicas_seen == {r.url for r in run.replicas}
    assert run.status["affinity_kept"] > 0 and run.status["affinity_broken"] > 0


@pytest.mark.parametrize(("title", "ref", "expr"), TARGETS, ids=IDS)
def test_every_dashboard_expression_returns_data(run, title, ref, expr):
    series = run.range(expr)
    assert series, f"{title} {ref}: no data for {promfleet.substitute(expr, promfleet.variable_values())}"
    assert finite(series), f"{title} {ref}: only NaN/Inf"


@pytest.mark.parametrize(("title", "ref", "expr"), TARGETS, ids=IDS)
def test_every_expression_returns_data_with_all_selected(run, title, ref, expr):
    """Grafana's "All" for the multi-value variables is the allValue ".*"."""
    assert run.range(expr, namespace=".*", rolloutrouter=".*"), f"{title} {ref}"


def test_variable_filters_select_and_exclude(run):
    """Another namespace or RolloutRouter selects nothing: the filters are real, not decoration."""
    for _, _, expr in TARGETS:
        assert run.range(expr, namespace="other-namespace") == []
        assert run.range(expr, rolloutrouter="other-router") == []


def test_template_variable_queries_find_the_scraped_labels(run):
    variables = {v["name"]: v for v in promfleet.load_dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    expected = {"namespace": promfleet.NAMESPACE, "rolloutrouter": promfleet.ROLLOUTROUTER}
    for name, value in expected.items():
        definition = variables[name]["query"]["query"]
        match, label = definition.removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
        assert label == name
        found = run.prometheus.label_values(label, promfleet.substitute(match, promfleet.variable_values()))
        assert found == [value], (name, found)


def test_dashboard_counters_equal_the_routers_status(run):
    """What Prometheus holds after the last scrape is exactly what the router counted."""
    selector = f'{{namespace="{promfleet.NAMESPACE}", rolloutrouter="{promfleet.ROLLOUTROUTER}"}}'
    for field in ("affinity_kept", "affinity_broken", "new_sessions"):
        (sample,) = run.prometheus.query(f"sum(rolloutrouter_{field}_total{selector})")
        assert int(float(sample["value"][1])) == run.status[field], field


def test_the_margin_row_shows_what_the_router_measured(run):
    """The cost of moves (re-prefilled tokens) Prometheus holds is the router's own sum, and the TTFB panel
    has both moved and kept turns."""
    margin = run.status["margin"]
    assert margin["repin_prefill_turns"] > 0 and margin["kept_prefill_turns"] > 0 and margin["breaks"] > 0
    selector = f'{{namespace="{promfleet.NAMESPACE}", rolloutrouter="{promfleet.ROLLOUTROUTER}"}}'
    (sample,) = run.prometheus.query(f"sum(rolloutrouter_repin_prefill_tokens_total{selector})")
    assert int(float(sample["value"][1])) == margin["repin_prefill_tokens"] > 0
    (panel,) = [p for p in promfleet.panels(promfleet.load_dashboard()) if p["title"] == "Time to first byte: moved vs kept"]
    by_legend = {t["legendFormat"]: finite(run.range(t["expr"])) for t in panel["targets"]}
    assert all(by_legend.values()) and max(by_legend["moved p95"]) > 0 and max(by_legend["kept p95"]) > 0


def test_affinity_panel_shows_both_kept_and_broken_moving(run):
    (panel,) = [p for p in promfleet.panels(promfleet.load_dashboard()) if p["title"] == "Affinity kept vs broken"]
    by_legend = {t["legendFormat"]: max(finite(run.range(t["expr"]))) for t in panel["targets"]}
    assert by_legend["kept"] > 0 and by_legend["broken"] > 0 and by_legend["new sessions"] > 0
    (ratio,) = [p for p in promfleet.panels(promfleet.load_dashboard()) if p["title"] == "Break ratio"]
    values = finite(run.range(ratio["targets"][0]["expr"]))
    assert values and all(0 <= v <= 1 for v in values) and max(values) > 0


def test_per_replica_panels_cover_exactly_the_routers_replicas(run):
    backends = {r.url for r in run.replicas}
    instances = {url.removeprefix("http://") for url in backends}
    for panel in promfleet.panels(promfleet.load_dashboard()):
        for target in panel.get("targets", []):
            legend = target["legendFormat"]
            if "{{backend}}" in legend:
                seen = {s["metric"]["backend"] for s in run.range(target["expr"])}
                if 'code!~"2..|OK|499|CANCELLED"' in target["expr"]:  # only replicas that answered an error have an error rate
                    assert seen and seen <= backends, panel["title"]
                else:
                    assert seen == backends, panel["title"]
            elif "{{instance}}" in legend:  # vLLM's own metrics, joined to the router's backends
                assert {s["metric"]["instance"] for s in run.range(target["expr"])} == instances, panel["title"]


def test_error_panels_see_the_errors(run):
    assert run.traffic.client_errors > 0 and run.traffic.router_refusals > 0
    (errors,) = [p for p in promfleet.panels(promfleet.load_dashboard()) if p["title"] == "Router errors by reason"]
    reasons = {s["metric"]["reason"] for s in run.range(errors["targets"][0]["expr"])}
    assert "http_404" in reasons


@pytest.mark.parametrize(("broken", "fixed"), [
    ("rolloutrouter_affinity_kept_total", "rolloutrouter_affinity_keep_total"),
    ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ('"backend"', '"replica"'),
    ("rolloutrouter=~", "router=~"),
])
def test_a_wrong_name_or_label_would_fail(run, broken, fixed):
    """The check above has teeth: one misspelling empties the panel."""
    affected = [expr for _, _, expr in TARGETS if broken in expr]
    assert affected
    assert any(run.range(expr.replace(broken, fixed)) == [] for expr in affected)


def test_promtool_accepts_the_scrape_config_and_every_shipped_rule_file(run, tmp_path):
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(promfleet.scrape_config(run.router.url, [r.url for r in run.replicas])))
    done = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    rule_files = [p for p in (ROOT / "charts").rglob("*.y*ml") if "templates" not in p.parts
                  and "groups" in (yaml.safe_load(p.read_text()) or {})]
    for rules in rule_files:
        done = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr

"""The Grafana dashboard JSON: it loads as a Grafana dashboard (grafana-foundation-sdk), its layout
and variables are sound, it covers what the issue asks for, and its PromQL parses (promtool).
That each expression returns data is tests/test_prometheus.py's job."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as grafana
from grafana_foundation_sdk.models import prometheus, stat, timeseries

from tests.tools import promfleet

register_default_plugins()  # panel options and Prometheus queries decode into their typed models
RAW = promfleet.load_dashboard()
PANELS = promfleet.panels(RAW)
TARGETS = promfleet.targets(RAW)


def test_loads_as_a_grafana_dashboard_with_typed_panels_and_queries():
    dashboard = grafana.Dashboard.from_json(RAW)
    assert dashboard.title == "RolloutRouter" and dashboard.uid == "rollout-router"
    loaded = [p for p in dashboard.panels if isinstance(p, grafana.Panel)]
    assert [p.title for p in loaded] == [p["title"] for p in PANELS]
    options = {"timeseries": timeseries.Options, "stat": stat.Options}
    for panel in loaded:
        assert isinstance(panel.options, options[panel.type_val]), panel.title
        assert panel.targets and all(isinstance(t, prometheus.Dataquery) for t in panel.targets), panel.title
        assert all(t.expr for t in panel.targets)
    assert {v.name: v.type_val for v in dashboard.templating.list_val} == {
        "datasource": "datasource", "namespace": "query", "rolloutrouter": "query"}
    again = grafana.Dashboard.from_json(json.loads(JSONEncoder(sort_keys=True).encode(dashboard)))
    assert [t.expr for p in again.panels if isinstance(p, grafana.Panel) for t in p.targets] == [e for _, _, e in TARGETS]


def test_layout_fits_the_grid_without_overlap():
    ids = [p["id"] for p in RAW["panels"]] + [p["id"] for row in RAW["panels"] if row["type"] == "row" for p in row["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for panel in RAW["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))


def test_every_query_uses_the_datasource_and_the_variables():
    for panel in PANELS:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            expr = target["expr"]
            assert target["datasource"] == panel["datasource"]
            for selector in re.findall(r"(\w[\w:]*)\{([^}]*)\}", expr):
                assert 'namespace=~"$namespace"' in selector[1], (panel["title"], selector)
                if selector[0].startswith("rolloutrouter_"):
                    assert 'rolloutrouter=~"$rolloutrouter"' in selector[1], (panel["title"], selector)
            unquoted = re.sub(r'"[^"]*"', '""', expr)
            assert all(window == "$__rate_interval" for window in re.findall(r"\[([^\]]+)\]", unquoted)), expr
            assert set(re.findall(r"\$\{?(\w+)", expr)) <= {"namespace", "rolloutrouter", "__rate_interval", "1"}, expr
    variables = {v["name"]: v for v in RAW["templating"]["list"]}
    for name in ("namespace", "rolloutrouter"):
        assert variables[name]["includeAll"] and variables[name]["multi"] and variables[name]["allValue"] == ".*"
    assert "$namespace" in variables["rolloutrouter"]["query"]["query"]  # routers of the chosen namespaces


def test_covers_what_a_vllm_fleet_operator_needs():
    """The panels the issue lists, each with the metric it must read."""
    need = {
        "Affinity kept vs broken": ["rolloutrouter_affinity_kept_total", "rolloutrouter_affinity_broken_total"],
        "Break ratio": ["rolloutrouter_affinity_broken_total", "rolloutrouter_affinity_kept_total"],
        "In-flight requests per replica": ["rolloutrouter_backend_inflight_requests"],
        "In-flight skew (max - min)": ["max(", "min(", "rolloutrouter_backend_inflight_requests"],
        "Sessions pinned": ["rolloutrouter_sessions"],
        "Request rate per replica": ["rolloutrouter_requests_total"],
        "Error rate per replica": ["rolloutrouter_requests_total", 'code!~"2..|OK|499|CANCELLED"'],
        "Latency quantiles per replica": ["histogram_quantile(0.5,", "histogram_quantile(0.95,", "histogram_quantile(0.99,",
                                          "rolloutrouter_request_duration_seconds_bucket"],
        "Ready replicas": ["rolloutrouter_backends_ready"],
        "Running requests": ["vllm:num_requests_running"],
        "Waiting requests": ["vllm:num_requests_waiting"],
        "KV-cache usage": ["vllm:kv_cache_usage_perc"],
        "Prefix-cache hit rate": ["vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"],
    }
    by_title = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in PANELS}
    for title, fragments in need.items():
        assert title in by_title, title
        for fragment in fragments:
            assert fragment in by_title[title], (title, fragment)
    per_replica = [p for p in PANELS if any(label in t["legendFormat"] for t in p["targets"] for label in ("{{backend}}", "{{instance}}"))]
    assert len(per_replica) == 8  # in-flight, requests, errors, latency, and the four vLLM panels


def in_row(word: str) -> set[str]:
    """Titles of the panels under the row whose title has ``word``, down to the next row."""
    rows = sorted((p["gridPos"]["y"], p["title"]) for p in RAW["panels"] if p["type"] == "row")
    top = next(y for y, title in rows if word in title.lower())
    bottom = min((y for y, _ in rows if y > top), default=float("inf"))
    return {p["title"] for p in RAW["panels"] if p["type"] != "row" and top < p["gridPos"]["y"] < bottom}


def test_the_margin_row_sets_the_cost_of_moves_against_their_benefit():
    """Issue 25's row: re-prefilled tokens per minute beside TTFB of moved vs kept turns, breaks, gap at break."""
    need = {
        "Re-prefilled tokens per minute": ["sum by (reason) (rate(rolloutrouter_repin_prefill_tokens_total",
                                           "rolloutrouter_kept_prefill_tokens_total",
                                           "rolloutrouter_kept_prefill_turns_total",
                                           "rolloutrouter_repin_prefill_turns_total"],
        "Time to first byte: moved vs kept": ['rolloutrouter_time_to_first_byte_seconds_bucket{', 'outcome=~"broken|repinned"',
                                              'outcome="kept"'],
        "Breaks per minute": ["rolloutrouter_affinity_broken_total"],
        "Gap at break": ["rolloutrouter_break_gap_bucket", "rolloutrouter_affinity_break_margin"],
        "Pin age at break": ["rolloutrouter_break_pin_age_seconds_bucket"],
    }
    by_title = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in PANELS}
    for title, fragments in need.items():
        for fragment in fragments:
            assert fragment in by_title[title], (title, fragment)
    assert in_row("margin paying") == set(need)
    (cost,) = [p for p in PANELS if p["title"] == "Re-prefilled tokens per minute"]
    (ttfb,) = [p for p in PANELS if p["title"] == "Time to first byte: moved vs kept"]
    assert cost["gridPos"]["y"] == ttfb["gridPos"]["y"] and cost["gridPos"]["x"] + cost["gridPos"]["w"] == ttfb["gridPos"]["x"]


def test_the_fleet_row_plots_every_session_ownership_metric():
    """Issue 11's counters, peer-load age and membership, in the fleet row and nowhere else."""
    need = {
        "Forwarded, handed off, owner unreachable, re-placed, looked up": [
            "rolloutrouter_forwarded_total", "rolloutrouter_handoffs_total", "rolloutrouter_owner_unreachable_total",
            "rolloutrouter_sessions_replaced_total", "rolloutrouter_pin_lookups_total"],
        "Forwarded share": ["rolloutrouter_forwarded_total", "rolloutrouter_requests_total"],
        "Fleet members": ["min(rolloutrouter_fleet_members", "max(rolloutrouter_fleet_members"],
        "Peer load age": ["max by (peer) (rolloutrouter_peer_load_age_seconds"],
    }
    by_title = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in PANELS}
    for title, fragments in need.items():
        for fragment in fragments:
            assert fragment in by_title[title], (title, fragment)
    assert in_row("fleet") == set(need)
    reading = {title for title, _, expr in TARGETS if promfleet.reads_fleet_metrics(expr)}
    assert reading == set(need)
    plotted = {name for name in promfleet.FLEET_METRICS if any(name in expr for _, _, expr in TARGETS)}
    assert plotted == set(promfleet.FLEET_METRICS)
    assert promfleet.reads_fleet_metrics("sum(rate(rolloutrouter_forwarded_total[1m]))")
    assert not promfleet.reads_fleet_metrics("sum(rate(rolloutrouter_forwarded_totals[1m]))")


def test_promql_parses(tmp_path):
    """promtool parses every expression (as recording rules), with the variables substituted."""
    if shutil.which("promtool") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is not installed: run `make system-deps`")
        pytest.skip("promtool is not installed (make system-deps)")
    values = promfleet.variable_values()
    rules = {"groups": [{"name": "rollout-router-dashboard", "rules": [
        {"record": f"dashboard:panel_{index}", "expr": promfleet.substitute(expr, values)}
        for index, (_, _, expr) in enumerate(TARGETS)]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(TARGETS)} rules found" in done.stdout
    rules["groups"][0]["rules"][0]["expr"] = "sum(rate(rolloutrouter_requests_total[5s])"  # unbalanced: must be caught
    path.write_text(yaml.safe_dump(rules))
    assert subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, timeout=60).returncode != 0


def test_readme_preview_image_is_committed():
    """docs/img/dashboard.png comes from `python tests/tools/dashboard_preview.py` (a real Prometheus run)."""
    image = promfleet.ROOT / "docs" / "img" / "dashboard.png"
    header = image.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
    assert width >= 800 and height >= 600

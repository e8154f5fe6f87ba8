"""A real Prometheus scraping a live router and its simulated vLLM replicas, plus bounded
multi-session traffic and the dashboard's expressions; shared by tests/test_prometheus.py and
``python -m tests.tools.dashboard_preview``. Everything listens on 127.0.0.0/8.

Outside Kubernetes no target carries ``namespace`` or ``rolloutrouter``; the scrape config adds
them as static labels, as the chart's ServiceMonitor (namespace from the target, rolloutrouter
by relabeling) does in a cluster, so the dashboard's filters are exercised unchanged.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from rollout_router.localfleet import stop
from tests.support import wait_until

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "rollout-router" / "dashboards" / "rollout-router.json"
NAMESPACE, ROLLOUTROUTER = "llm-rollouts", "rollouts"
# The session-ownership metrics (issue 11, docs/fleet.md), one place for every test that names them. They
# come from the router's fleet module, which a router without peers does not run: the single-router run of
# tests/test_prometheus.py cannot give the panels that read them data.
FLEET_METRICS = ("rolloutrouter_forwarded_total", "rolloutrouter_handoffs_total", "rolloutrouter_owner_unreachable_total",
                 "rolloutrouter_sessions_replaced_total", "rolloutrouter_peer_load_age_seconds",
                 "rolloutrouter_fleet_members", "rolloutrouter_pin_lookups_total")
LISTENING = re.compile(r'"Listening on".*?\baddress=(\S+)')
VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]")


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def scrape_config(router: str | Sequence[str], replicas: list[str], interval: str = "1s") -> dict:
    """``router`` (one or several admin listeners) and ``replicas`` are base URLs (http://host:port)."""
    routers = [router] if isinstance(router, str) else list(router)
    def target(url: str) -> str:
        return urllib.parse.urlsplit(url).netloc
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": "900ms" if interval == "1s" else "5s",
                   "evaluation_interval": interval},
        "scrape_configs": [
            {"job_name": "rollout-router", "static_configs": [
                {"targets": [target(url) for url in routers], "labels": {"namespace": NAMESPACE, "rolloutrouter": ROLLOUTROUTER}}]},
            {"job_name": "vllm", "static_configs": [
                {"targets": [target(url) for url in replicas], "labels": {"namespace": NAMESPACE}}]},
        ],
    }


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen
    directory: Path

    def get(self, path: str, **params: str | float) -> dict:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr} if at is None else {"query": expr, "time": at}
        return self.get("/api/v1/query", **params)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict]:
        return self.get("/api/v1/query_range", query=expr, start=start, end=end, step=step)["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        return self.get(f"/api/v1/label/{label}/values", **{"match[]": match})

    def last_scrape(self, job: str) -> float:
        """Timestamp of the oldest latest scrape among the job's targets (0 before the first)."""
        result = self.query(f'min(timestamp(up{{job="{job}"}}))')
        return float(result[0]["value"][1]) if result else 0.0

    def wait_scraped_after(self, moment: float, jobs: tuple[str, ...] = ("rollout-router", "vllm"),
                           timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.last_scrape(job) > moment for job in jobs):
                return
            time.sleep(0.2)
        raise TimeoutError(f"Prometheus did not scrape {jobs} after {moment} within {timeout}s")


@contextlib.contextmanager
def prometheus(router: str | Sequence[str], replicas: list[str], interval: str = "1s") -> Iterator[Prometheus]:
    binary = prometheus_binary()
    if binary is None:
        raise RuntimeError("prometheus is not installed (make system-deps, or apt-get install prometheus)")
    with tempfile.TemporaryDirectory(prefix="rr-prometheus-") as tmp:
        directory = Path(tmp)
        config = directory / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(router, replicas, interval)))
        log = (directory / "prometheus.log").open("w")
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
             "--web.listen-address=127.0.0.1:0", "--storage.tsdb.retention.time=1h", "--log.level=info"],
            stdout=log, stderr=subprocess.STDOUT)
        server = Prometheus("", process, directory)
        try:
            server.url = f"http://{wait_until(lambda: _bound_address(process, directory), 'Prometheus to listen', 30)}"
            wait_until(lambda: _ready(server.url), "Prometheus to be ready", 30)
            # Target discovery reaches the scrape loops only after a few seconds (Prometheus batches
            # discovery updates); traffic before the first scrape would be invisible to rate().
            server.wait_scraped_after(0.0, timeout=30.0)
            yield server
        finally:
            stop(process)
            log.close()


def _bound_address(process: subprocess.Popen, directory: Path) -> str | None:
    """HOST:PORT from Prometheus's ``msg="Listening on" address=...`` log line (its pick for port 0)."""
    if process.poll() is not None:
        raise RuntimeError(f"prometheus exited: {(directory / 'prometheus.log').read_text()[-2000:]}")
    match = LISTENING.search((directory / "prometheus.log").read_text())
    return match.group(1) if match else None


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


# --- traffic -------------------------------------------------------------------------------------

@dataclass
class Traffic:
    ok: int = 0
    client_errors: int = 0
    router_refusals: int = 0
    started: float = 0.0
    ended: float = 0.0
    replicas_seen: set[str] = field(default_factory=set)


async def _session(http: aiohttp.ClientSession, entries: Sequence[str], key: str, turns: int, max_tokens: int,
                   deadline: float, traffic: Traffic, think: float, start_after: float = 0.0) -> None:
    """One conversation; turn ``t`` enters by ``entries[t % len(entries)]`` (several routers: a different one each turn)."""
    await asyncio.sleep(start_after)
    messages = [{"role": "system", "content": f"You are agent {key}. " + "Follow the task carefully. " * 20}]
    for turn in range(turns):
        if time.monotonic() > deadline:
            return
        messages.append({"role": "user", "content": f"step {turn} of {key}: " + "observe and act. " * 8})
        body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens}
        router = entries[turn % len(entries)]
        async with http.post(f"{router}/v1/chat/completions", json=body, headers={"X-Session-ID": key}) as response:
            payload = await response.json()
            assert response.status == 200, payload
            traffic.ok += 1
            traffic.replicas_seen.add(response.headers["X-RolloutRouter-Replica"])
        messages.append({"role": "assistant", "content": payload["choices"][0]["message"]["content"]})
        if think:
            await asyncio.sleep(think * random.random())


async def _drive(entries: Sequence[str], sessions: int, turns: int, max_tokens: int, seconds: float, think: float,
                 errors: int, seed: int, stagger: float) -> Traffic:
    random.seed(seed)
    router = entries[0]
    traffic = Traffic(started=time.time())
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=sessions + 4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        async def bad() -> None:
            """Spread over the run: a bad request (the replica answers 400), a path the router refuses (404)."""
            for i in range(errors):
                await asyncio.sleep(seconds / (errors + 1))
                async with http.post(f"{router}/v1/chat/completions", json={"model": "tiny"},
                                     headers={"X-Session-ID": f"bad-{i % 2}"}) as response:
                    assert response.status == 400, await response.text()
                    traffic.client_errors += 1
                async with http.post(f"{router}/v1/not-an-endpoint", json={}) as response:
                    assert response.status == 404
                    traffic.router_refusals += 1

        def rotated(i: int) -> list[str]:
            return [*entries[i % len(entries):], *entries[:i % len(entries)]]

        await asyncio.gather(bad(), *(_session(http, rotated(i), f"session-{seed}-{i}", turns, max_tokens, deadline, traffic, think,
                                               start_after=stagger * i / sessions) for i in range(sessions)))
    traffic.ended = time.time()
    return traffic


def drive_traffic(router: str | Sequence[str], sessions: int = 24, turns: int = 40, max_tokens: int = 24, seconds: float = 6.0,
                  think: float = 0.05, errors: int = 5, seed: int = 0, stagger: float = 2.0) -> Traffic:
    """Bounded multi-session chat traffic: at most sessions x turns requests, for at most ``seconds``;
    sessions start spread over the first ``stagger`` seconds. Several routers: each session enters by
    each of them in turn, starting from a different one."""
    entries = [router] if isinstance(router, str) else list(router)
    return asyncio.run(_drive(entries, sessions, turns, max_tokens, seconds, think, errors, seed, stagger))


def router_status(router: str) -> dict:
    with urllib.request.urlopen(f"{router}/status", timeout=5) as response:
        return json.load(response)


# --- the dashboard's expressions -------------------------------------------------------------------

def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.extend(panel.get("panels", []) if panel["type"] == "row" else [panel])
    return out


def targets(dashboard: dict) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query in the dashboard."""
    return [(panel["title"], target["refId"], target["expr"]) for panel in panels(dashboard)
            for target in panel.get("targets", [])]


def reads_fleet_metrics(expr: str) -> bool:
    """Whether ``expr`` reads one of ``FLEET_METRICS``."""
    return any(re.search(rf"\b{name}\b", expr) for name in FLEET_METRICS)


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's template interpolation for the variables the dashboard uses; unknown ones stay
    (as Grafana leaves them), so a misspelt variable makes the query fail rather than vanish."""
    def replace(match: re.Match) -> str:
        name = next(group for group in match.groups() if group)
        return values.get(name, match.group(0))
    return VARIABLE.sub(replace, expr)


def variable_values(namespace: str = NAMESPACE, rolloutrouter: str = ROLLOUTROUTER, rate_interval: str = "5s") -> dict[str, str]:
    return {"namespace": namespace, "rolloutrouter": rolloutrouter, "__rate_interval": rate_interval,
            "__interval": "1s", "datasource": "prometheus"}

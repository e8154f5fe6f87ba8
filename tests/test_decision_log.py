"""``serve --log-level debug`` logs a sample of the routing decisions: key hash, outcome, replica, loads seen."""
from __future__ import annotations

import hashlib
import http.client
import json
import logging
import re
import time
from urllib.parse import urlsplit

import pytest

from rollout_router.decisionlog import INTERVAL, DecisionLog
from rollout_router.localfleet import local_fleet, stop
from rollout_router.policy import Decision, Outcome

CHAT = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}).encode()


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_outcome_is_logged_at_most_once_an_interval_with_what_went_unlogged(caplog):
    clock = Clock()
    decisions = DecisionLog(clock)
    loads = {"http://a": 3, "http://b": 1}
    with caplog.at_level(logging.DEBUG, logger="rollout_router.decisions"):
        for _ in range(3):
            decisions.record("trajectory-7", Decision("http://a", Outcome.KEPT), loads)
        decisions.record("trajectory-8", Decision("http://b", Outcome.BROKEN, previous="http://a"), loads)
        clock.now += INTERVAL
        decisions.record("trajectory-7", Decision("http://a", Outcome.KEPT), loads)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"decision kept key={digest('trajectory-7')} replica=http://a loads: chosen 3, lowest 1, 2 replicas "
        f"(+0 kept not logged in the last 1 s)",
        f"decision broken key={digest('trajectory-8')} replica=http://b loads: pinned http://a 3, chosen 1, "
        f"lowest 1, 2 replicas (+0 broken not logged in the last 1 s)",
        f"decision kept key={digest('trajectory-7')} replica=http://a loads: chosen 3, lowest 1, 2 replicas "
        f"(+2 kept not logged in the last 1 s)"]


@pytest.mark.parametrize("level, logged", [("debug", True), ("info", False)])
def test_a_router_at_debug_accounts_for_every_decision_sticky_hits_included(level, logged):
    """Through a running router, over one keep-alive connection (so the native lane, where it is built, decides
    the sticky hits in C): a conversation's turns for a while, then one more after an interval. Its first turn is
    logged new; the kept lines and the counts they say went unlogged add up to every later turn; a request without a
    key is logged unkeyed; the key itself is never written. At info level nothing is."""
    with local_fleet(2, ["--log-level", level]) as (router, _):
        client = Client(router.url)
        served = [client.chat("conversation-1")]
        while time.monotonic() - client.first < 2.5 * INTERVAL:  # several intervals of sticky hits
            served.append(client.chat("conversation-1"))
        time.sleep(INTERVAL * 1.1)  # the log's interval passes: the next kept turn is logged with the count since
        served.append(client.chat("conversation-1"))
        client.chat(None)
        stop(router.process)
        log = router.process.stderr.read()
    assert len(set(served)) == 1
    found = re.findall(r"decision (\w+) key=(\S+) replica=(\S+) loads: .* \(\+(\d+) \w+ not logged", log)
    if not logged:
        assert found == [], found
        return
    assert [line[:3] for line in found if line[0] == "new"] == [("new", digest("conversation-1"), served[0])]
    kept = [line for line in found if line[0] == "kept"]
    assert {line[1:3] for line in kept} == {(digest("conversation-1"), served[0])} and len(kept) >= 3, kept
    assert sum(1 + int(line[3]) for line in kept) == len(served) - 1, (len(served), kept)
    assert [line[:2] for line in found if line[0] == "unkeyed"] == [("unkeyed", "-")]
    assert "conversation-1" not in log


class Client:
    """Chat turns over one keep-alive connection; each answer's replica."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        self.first = time.monotonic()

    def chat(self, session: str | None) -> str:
        headers = {"Content-Type": "application/json", **({"X-Session-ID": session} if session else {})}
        self.connection.request("POST", "/v1/chat/completions", CHAT, headers)
        response = self.connection.getresponse()
        response.read()
        assert response.status == 200
        return response.headers["X-RolloutRouter-Replica"]

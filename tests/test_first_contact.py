"""What a newcomer meets first: the peers' flags and policy names on ``serve``, and a router that says at start
(and in its 503 answers) that it has no replica, or that every replica is down."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rollout_router import cli, peer_flags
from rollout_router.localfleet import free_port

SCRIPT = str(Path(sys.executable).with_name("rollout-router"))
DOCS = Path(__file__).resolve().parent.parent / "docs"


def serve_args(*argv: str):
    full = ["serve", *argv]
    return cli.build_parser(full).parse_args(full)


def test_worker_urls_are_backends():
    args = serve_args("--worker-urls", "http://127.0.0.1:1", "http://127.0.0.1:2", "--backend", "http://127.0.0.1:3")
    assert [b["url"] for b in args.backends] == ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]


@pytest.mark.parametrize(("theirs", "ours"), sorted(peer_flags.POLICY_ALIASES.items()))
def test_a_peer_policy_that_is_one_of_our_rules_is_accepted_as_ours(theirs, ours):
    assert serve_args("--policy", theirs).policy == ours


def test_sglang_spellings_of_our_flags():
    args = serve_args("--max-idle-secs", "600", "--log-level", "warn")
    assert (args.idle_timeout, args.log_level) == (600.0, "warning")


def test_migrating_md_lists_every_peer_name():
    """docs/migrating.md maps each of their flags and policy names, accepted or refused."""
    text = (DOCS / "migrating.md").read_text()
    names = [*peer_flags.POLICY_ALIASES, *peer_flags.POLICY_REFUSALS, *peer_flags.FLAG_ALIASES,
             *peer_flags.FLAG_REFUSALS, *peer_flags.UNMATCHED]
    assert not [name for name in names if f"`{name}`" not in text]


@pytest.mark.parametrize("command", [["vllm-router", "--help"], ["sglang-router", "launch", "--help"]])
def test_every_flag_of_the_peers_is_ours_or_answered_by_name(command):
    """Their real --help (the pinned versions make install-test installs): no flag of theirs meets argparse's
    anonymous "unrecognized arguments"."""
    done = subprocess.run([str(Path(sys.executable).with_name(command[0])), *command[1:]], capture_output=True,
                          text=True, timeout=60)
    theirs = set(re.findall(r"^  (--[\w-]+)", done.stdout, re.M)) - {"--help"}
    assert len(theirs) > 50, done.stdout + done.stderr  # the help was read
    parser = cli.build_parser(["serve"])
    serve = next(a for a in parser._actions if a.dest == "command").choices["serve"]
    ours = {flag for action in serve._actions for flag in action.option_strings}
    assert not sorted(theirs - ours)


def started(args: list[str], until: str, timeout: float = 30.0) -> tuple[subprocess.Popen, list[str]]:
    """Start ``rollout-router serve ARGS`` and read its output up to the line containing ``until``."""
    proc = subprocess.Popen([SCRIPT, "serve", "--host", "127.0.0.1", "--port", "0", "--admin-port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(timeout, proc.kill)  # the line never came: end the wait instead of hanging
    timer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if until in line:
                break
    finally:
        timer.cancel()
    return proc, lines


def answer_503(lines: list[str]) -> str:
    url = re.search(r"listening on (http://\S+)", "".join(lines)).group(1)
    request = urllib.request.Request(url + "/v1/chat/completions", method="POST",
                                     data=json.dumps({"model": "m", "messages": []}).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 503
    return json.load(refused.value)["error"]["message"]


def test_serve_without_a_backend_says_so_and_so_does_its_503():
    proc, lines = started([], until="no replica is configured")
    try:
        assert "no replica is configured" in lines[-1] and "listening on" in "".join(lines), lines
        assert "no replica is configured" in answer_503(lines)
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_with_every_backend_down_says_so_once_and_its_503_says_why():
    dead = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    proc, lines = started(["--backend", dead], until="every replica is down at start")
    try:
        assert "every replica is down at start" in lines[-1] and "failing their health probe" in lines[-1], lines
        says = answer_503(lines)
        assert "the 1 configured are out of rotation" in says and "failing their health probe" in says
    finally:
        proc.terminate()
        rest = proc.communicate(timeout=10)[0]
    assert "every replica is down" not in rest  # logged once


def test_an_unreachable_api_server_is_one_line_per_backoff_step(tmp_path):
    """The address, the reason and the next try; kopf's two long lines per attempt are gone."""
    server = f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens: every attempt is refused
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    proc = subprocess.Popen([SCRIPT, "operator", "-n", "a", "--metrics-port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent",
                                                                      "KUBECONFIG": str(kubeconfig)})
    timer = threading.Timer(60, proc.kill)
    timer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "attempt 3 failed" in line:
                break
    finally:
        timer.cancel()
        proc.terminate()
        proc.wait(10)
    retries = [line for line in lines if "attempt" in line]
    assert [line.split(": ", 1)[1].strip() for line in retries] == [
        f"Kubernetes API {server} unreachable (connection refused): attempt {n} failed, next try in {delay} s"
        for n, delay in ((1, 1), (2, 2), (3, 5))], lines
    assert not any("ClientConnectorError" in line for line in lines)


@pytest.mark.parametrize("command", sorted(cli.SUBCOMMANDS))
def test_every_flag_is_described_with_its_default(command):
    """``--help`` of every subcommand: each flag has a help text, and one with a default names it."""
    parser = cli.build_parser([command])
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    vague = []
    for action in sub._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS) and action.dest == "help":
            continue
        if action.help is argparse.SUPPRESS:
            continue  # the peers' flags: docs/migrating.md lists them
        text = (action.help or "") % {"default": action.default}
        has_default = action.default not in (None, False, [], argparse.SUPPRESS) and action.dest != "help"
        if not text or has_default and "default" not in text.lower():
            vague.append(action.option_strings[0])
    assert not vague, f"{command}: {vague}"

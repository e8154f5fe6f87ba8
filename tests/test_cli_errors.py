"""Mistakes on the command line get one clear line and exit 2, never a traceback; a flag that pins a
setting of the config file says so at startup (a reload of that field will not apply)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollout_router.localfleet import free_port

SCRIPT = str(Path(sys.executable).with_name("rollout-router"))


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}  # no KUBECONFIG, no ~/.kube/config, not in a pod
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60, env={**base, **(env or {})})


@pytest.mark.parametrize(("args", "env", "says"), [
    (["serve", "--config", "/nonexistent/router.yaml"], None, "--config /nonexistent/router.yaml: No such file"),
    (["serve", "--log-level", "loud"], None, "argument --log-level: invalid choice: 'loud'"),
    (["serve", "--port", "eighty"], None, "argument --port: invalid int value"),
    (["operator", "--namespace", "a"], None, "no Kubernetes credentials"),
    (["operator", "--namespace", "a"], {"KUBECONFIG": "/nonexistent/config"}, "/nonexistent/config"),
    (["operator", "--log-level", "chatty"], None, "argument --log-level: invalid choice: 'chatty'"),
    (["operator", "--status-interval", "often"], None, "argument --status-interval: invalid float value"),
    (["operator", "-n", "a", "--all-namespaces"], None, "not allowed with argument"),
])
def test_a_mistake_is_one_line_and_exit_2(args, env, says):
    done = run(*args, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and says in done.stderr
    assert [line for line in done.stderr.splitlines() if not line.startswith(("usage:", " "))] == \
        [done.stderr.strip().splitlines()[-1]]  # one message line (argparse's usage lines aside)


@pytest.mark.parametrize(("key", "says"), [
    ("/nonexistent/key", "--admin-token-key-file /nonexistent/key: No such file or directory"),
    ("/dev/null", "--admin-token-key-file /dev/null: the key must hold at least 16 bytes"),
])
def test_a_bad_admin_token_key_file_stops_the_operator_before_it_starts(tmp_path, key, says):
    kubeconfig = tmp_path / "config"  # credentials that load (never used: the operator stops first)
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{free_port()}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    done = run("operator", "-n", "a", "--metrics-port", "0", "--admin-token-key-file", key,
               env={"KUBECONFIG": str(kubeconfig)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"rollout-router operator: {says}"


def test_serve_says_which_config_fields_its_flags_pin(tmp_path):
    config = tmp_path / "router.yaml"
    config.write_text("backends: [{url: 'http://127.0.0.1:9'}]\npolicy: affinity\n")
    port = free_port("127.0.0.1")
    proc = subprocess.Popen([SCRIPT, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                             "--policy", "round_robin", "--max-sessions", "10"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # the warning comes before the listener's announcement
            lines.append(line)
            if "listening on" in line:
                break
        warning = next((line for line in lines if "override" in line), "")
        assert "policy" in warning and "session.maxSessions" in warning and str(config) in warning, lines
        assert "not applied on reload" in warning
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_without_flags_over_the_file_says_nothing_of_overrides(tmp_path):
    config = tmp_path / "router.yaml"
    config.write_text("backends: [{url: 'http://127.0.0.1:9'}]\n")
    proc = subprocess.Popen([SCRIPT, "serve", "--config", str(config), "--host", "127.0.0.1",
                             "--port", str(free_port("127.0.0.1"))], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "listening on" in line:
                break
        assert not any("override" in line for line in lines), lines
    finally:
        proc.terminate()
        proc.wait(10)

"""Mistakes on the command line get one clear line and exit 2, never a traceback; a flag that pins a
setting of the config file says so at startup (a reload of that field will not apply)."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_router import usage
from rollout_router.localfleet import free_port

SCRIPT = str(Path(sys.executable).with_name("rollout-router"))
# Runs the command after it (exec: the same pid) with Ctrl-C at its default: a test run started in the background
# by a non-interactive shell inherits SIGINT ignored, and so would the command.
SIGINT_DEFAULT = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                                        "os.execv(sys.argv[1], sys.argv[1:])"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}  # no KUBECONFIG, no ~/.kube/config, not in a pod
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60, env={**base, **(env or {})})


@pytest.mark.parametrize(("args", "env", "says"), [
    (["serve", "--config", "/nonexistent/router.yaml"], None, "--config /nonexistent/router.yaml: No such file"),
    (["serve", "--log-level", "loud"], None, "argument --log-level: invalid choice: 'loud'"),
    (["serve", "--port", "eighty"], None, "argument --port: must be a port 0-65535 (0 picks a free one), got 'eighty'"),
    (["operator", "--namespace", "a"], None, "no Kubernetes credentials"),
    (["operator", "--namespace", "a"], {"KUBECONFIG": "/nonexistent/config"}, "/nonexistent/config"),
    (["operator", "--log-level", "chatty"], None, "argument --log-level: invalid choice: 'chatty'"),
    (["operator", "--status-interval", "often"], None, "argument --status-interval: must be a number > 0, got 'often'"),
    (["operator", "-n", "a", "--all-namespaces"], None, "not allowed with argument"),
    (["serve", "--workers", "0"], None, "argument --workers: must be an integer >= 1, got '0'"),
    (["serve", "--workers", "-1"], None, "argument --workers: must be an integer >= 1, got '-1'"),
    (["serve", "--workers", "x"], None, "argument --workers: must be an integer >= 1, got 'x'"),
    (["serve", "--workers", "2", "--peer", "http://127.0.0.1:9"], None, "--workers 2: cannot be combined with --peer"),
    (["serve", "--workers", "2", "--advertise", "http://127.0.0.1:9"], None,
     "--workers 2: cannot be combined with --advertise"),
    (["serve", "--workers", "3", "--peer-selector", "app=r", "--admin-port", "0"], None,
     "--workers 3 with --peer-selector: give a fixed --admin-port (worker i listens on --admin-port + 1 + i"),
    (["serve", "--workers", "2", "--peer-selector", "app=r", "--admin-port", "65535"], None,
     "the workers' admin ports 65536-65537 (--admin-port + 1 + i) go past 65535"),
    (["serve", "--workers", "2", "--peer-selector", "app=r", "--port", "9002", "--admin-port", "9000"], None,
     "the workers' admin ports 9001-9002 (--admin-port + 1 + i) include --port 9002"),
    (["serve", "--workers", "2", "--peer-selector", "app=r", "--admin-host", "::"], None,
     "--workers 2 with --peer-selector and --admin-host ::: set $POD_IP"),
])
def test_a_mistake_is_one_line_and_exit_2(args, env, says):
    done = run(*args, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one message line, no usage block


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


# --- every subcommand: numbers out of range, ports, files, peers' names, bind failures ----------------------

NOT_HERE = "192.0.2.1"  # TEST-NET-1: never an address of this machine; binding fails locally, nothing is sent


@pytest.fixture(scope="module")
def busy() -> Iterator[str]:
    """A loopback port something listens on."""
    with socket.create_server(("127.0.0.1", 0)) as held:
        yield str(held.getsockname()[1])


ONE_LINE_CASES = [
    (["serve", "--port", "80000"], "argument --port: must be a port 0-65535 (0 picks a free one), got '80000'"),
    (["serve", "--port", "-5"], "argument --port: must be a port 0-65535 (0 picks a free one), got '-5'"),
    (["serve", "--admin-port", "65536"], "argument --admin-port: must be a port 0-65535"),
    (["fake-vllm", "--port", "70000"], "argument --port: must be a port 0-65535 (0 picks a free one), got '70000'"),
    (["operator", "--metrics-port", "99999"], "argument --metrics-port: must be a port 0-65535"),
    (["serve", "--affinity-break-margin", "-1"], "argument --affinity-break-margin: must be a number >= 0 or "
                                                 "'null', got '-1'"),
    (["serve", "--affinity-break-margin", "inf"], "argument --affinity-break-margin: must be a number >= 0 or "
                                                  "'null', got 'inf'"),
    (["serve", "--idle-timeout", "-5"], "argument --idle-timeout: must be a number > 0, got '-5'"),
    (["serve", "--max-sessions", "0"], "argument --max-sessions: must be an integer >= 1, got '0'"),
    (["demo", "--replicas", "0"], "argument --replicas: must be an integer >= 1, got '0'"),
    (["demo", "--prompts", "0"], "argument --prompts: must be an integer >= 1, got '0'"),
    (["demo", "--margins", "2,-1"], "argument --margins: must be a number >= 0 or 'null', got '-1'"),
    (["demo", "--margins", "null"], "argument --margins: null is the sticky arm, which always runs; got 'null'"),
    (["simulate", "--margins", "8,x"], "argument --margins: must be a number >= 0 or 'null', got 'x'"),
    (["fake-vllm", "--speed", "0"], "argument --speed: must be a number > 0, got '0'"),
    (["fake-vllm", "--num-blocks", "0"], "argument --num-blocks: must be an integer >= 1, got '0'"),
    (["simulate", "--preset", "quick", "--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
    (["simulate", "--preset", "quick", "--mfu", "0"], "argument --mfu: must be a number > 0, got '0'"),
    (["crd", "-o", "/nonexistent/x.yaml"], "rollout-router crd: --output /nonexistent/x.yaml: No such file or directory"),
    (["serve", "--host", NOT_HERE, "--port", "0", "--admin-port", "0"],
     f"rollout-router serve: --host {NOT_HERE}: is not an address of this machine"),
    (["serve", "--host", "127.0.0.1", "--port", "0", "--admin-host", NOT_HERE, "--admin-port", "0"],
     f"rollout-router serve: --admin-host {NOT_HERE}: is not an address of this machine"),
    (["fake-vllm", "--host", NOT_HERE, "--port", "0"],
     f"rollout-router fake-vllm: --host {NOT_HERE}: is not an address of this machine"),
    (["serve", "--host", "127.0.0.1", "--port", "{busy}", "--admin-port", "0"],
     "rollout-router serve: --port {busy}: cannot listen on 127.0.0.1:{busy}: already in use"),
    (["serve", "--host", "127.0.0.1", "--port", "0", "--admin-port", "{busy}"],
     "rollout-router serve: --admin-port {busy}: cannot listen on 127.0.0.1:{busy}: already in use"),
    (["serve", "--host", "127.0.0.1", "--port", "0", "--admin-port", "0", "--grpc-port", "{busy}"],
     "rollout-router serve: --grpc-port {busy}: cannot listen on 127.0.0.1:{busy}: already in use"),
    (["fake-vllm", "--port", "{busy}"], "rollout-router fake-vllm: --port {busy}: cannot listen on "
                                        "127.0.0.1:{busy}: already in use"),
    (["fake-vllm", "--port", "0", "--grpc-port", "{busy}"], "rollout-router fake-vllm: --grpc-port {busy}: "
                                                            "cannot listen on 127.0.0.1:{busy}: already in use"),
    (["serve", "--port-file", "/nonexistent/p.json"], "argument --port-file: /nonexistent/p.json: directory "
                                                       "'/nonexistent' does not exist"),
    (["fake-vllm", "--port-file", "/nonexistent/p.json"], "argument --port-file: /nonexistent/p.json: directory"),
    (["fake-vllm", "--served-model-name=", "--port", "0"], "rollout-router fake-vllm: --served-model-name: must not "
                                                           "be empty"),
    (["serve", "--peer", "router-1:8081"], "argument --peer: must be an http:// or https:// URL, got 'router-1:8081'"),
    # each was taken, and the router ran alone without a word (or bound every interface: '')
    (["serve", "--peer", "http://"], "argument --peer: URL 'http://' has no host"),
    (["serve", "--peer", "http://127.0.0.1:99999"], "argument --peer: URL 'http://127.0.0.1:99999': the port must be "
                                                    "1-65535"),
    (["serve", "--peer", "http://u:p@127.0.0.1:1"], "argument --peer: URL 'http://u:p@127.0.0.1:1' must not carry "
                                                    "user:password@"),
    (["serve", "--advertise", "ftp://x"], "argument --advertise: must be an http:// or https:// URL, got 'ftp://x'"),
    (["serve", "--admin-host", ""], "argument --admin-host: must be an address or a host name"),
    (["serve", "--host", " "], "argument --host: must be an address or a host name"),
    (["fake-vllm", "--host", ""], "argument --host: must be an address or a host name"),
    (["operator", "--liveness", "ftp://x"], "argument --liveness: must be http://HOST:PORT/PATH"),  # a traceback
    (["operator", "--liveness", "http://127.0.0.1:99999/healthz"], "argument --liveness: must be http://HOST:PORT/PATH"),
    (["simulate", "--grid", "quick", "--json-out", "/tmp"], "argument --json-out: '/tmp' is a directory, not a file"),
    (["simulate", "--grid", "quick", "--cache", "/tmp"], "argument --cache: '/tmp' is a directory, not a file"),
    (["serve", "--port-file", "/tmp"], "argument --port-file: '/tmp' is a directory, not a file"),  # a traceback
    (["serve", "--port-file", ""], "argument --port-file: must name a file"),
    (["fake-vllm", "--port-file", "/tmp"], "argument --port-file: '/tmp' is a directory, not a file"),
    (["simulate", "--preset", "quick", "--policies", "bogus"], "rollout-router simulate: --policies bogus: unknown "
                                                               "arm label bogus"),
    (["simulate", "--from-json", "/nonexistent/g.json"], "argument --from-json: /nonexistent/g.json: no such file"),
    (["simulate", "--grid", "quick", "--readme", "/nonexistent/R.md"], "argument --readme: /nonexistent/R.md: no such"),
    # the peers' names: accepted where the rule is ours too, else refused by name with what to use instead
    (["serve", "--policy", "cache_aware"], "argument --policy: 'cache_aware' (vllm-router / SGLang router) is "
                                           "not served here"),
    (["serve", "--policy", "random"], "argument --policy: 'random' (vllm-router / SGLang router) is not served "
                                      "here: use --policy power_of_two"),
    (["serve", "--balance-abs-threshold", "4"], "argument --balance-abs-threshold: not a flag of this router: use "
                                                "--affinity-break-margin N"),
    (["serve", "--cache-threshold", "0.5"], "argument --cache-threshold: a vllm-router / SGLang router flag that "
                                            "has no counterpart here"),
    (["serve", "--backend", "sglang"], "argument --backend: expected a replica's http:// or https:// URL"),
    (["serve", "--worker-urls", "vllm-0:8000"], "argument --worker-urls: expected a replica's http:// or https:// URL"),
    # the settings' rules, once named by their key (backends.0.url, policy, session.bodyFields): now by the flag
    (["serve", "--workers", "100000"], "argument --workers: must be an integer <= 64, got '100000'"),
    (["serve", "--backend", "http://"], "argument --backend: backend 'http://' has no host"),
    (["serve", "--worker-urls", "http://x:99999"], "argument --worker-urls: backend 'http://x:99999': the port must be "
                                                   "1-65535"),
    (["serve", "--policy", "bogus"], "argument --policy: 'bogus' is not a policy; choose one of:"),
    (["serve", "--session-body-field", ""], "argument --session-body-field: must name a JSON body field"),
    (["serve", "--session-header", "X Session"], "argument --session-header: must be an HTTP header name"),
]


@pytest.mark.parametrize(("args", "says"), ONE_LINE_CASES)
def test_every_subcommand_says_what_is_wrong_in_one_line(args, says, busy):
    """The flag as the user wrote it and the value; exit 2, never a traceback, before anything long starts."""
    done = run(*[arg.format(busy=busy) for arg in args])
    assert done.returncode == 2, done.stderr
    message = done.stderr.strip().splitlines()  # one line: no usage block above it
    assert len(message) == 1 and says.format(busy=busy) in message[0], done.stderr


PROBE_RULE = "must be a path starting with / of URL characters (percent-encode spaces and the like)"


@pytest.mark.parametrize(("text", "says"), [
    ("affinityBreakMargin: -1\n", "affinityBreakMargin: Input should be greater than or equal to 0 (got -1)"),
    ("session: {idleTimeoutSeconds: -5}\n", "session.idleTimeoutSeconds: Input should be greater than 0 (got -5)"),
    # .inf overflowed at the first pause (500s on every request) or put Infinity in /status; true and "5" were
    # taken as numbers, "yes" as true
    ("rl: {maxPauseSeconds: .inf}\n", "rl.maxPauseSeconds: Input should be a finite number (got inf)"),
    ("health: {baseEjectionSeconds: .inf}\n", "health.baseEjectionSeconds: Input should be a finite number (got inf)"),
    ("session: {idleTimeoutSeconds: .inf}\n", "session.idleTimeoutSeconds: Input should be a finite number (got inf)"),
    ("downSeconds: true\n", "downSeconds: Input should be a valid number (got True)"),
    ('downSeconds: "5"\n', "downSeconds: Input should be a valid number (got '5')"),
    ('fullDeterminism: "on"\n', "fullDeterminism: Input should be a valid boolean (got 'on')"),
    ("metrics: {keptPrefillSampleRate: true}\n", "metrics.keptPrefillSampleRate: Input should be a valid number "
                                                 "(got True)"),
    # written into the probe's request line: a header injected into every probe, or every replica out of rotation
    ('health: {probePath: "/health\\r\\nX-Injected: 1"}\n', "health.probePath: " + PROBE_RULE
     + " (got '/health\\r\\nX-Injected: 1')"),
    ('fleet: {peers: ["http://127.0.0.1:5/?a=1"]}\n', "fleet.peers: peer 'http://127.0.0.1:5/?a=1' must not have a "
                                                      "query or a fragment"),
    ("discovery: {selector: {}}\n", "discovery.selector: selector must have matchLabels or matchExpressions (an "
                                    "empty selector matches every pod)"),
    ("discovery: {selector: {matchExpressions: [{key: app, operator: In}]}}\n",
     "discovery.selector: matchExpressions[0]: In and NotIn need values; Exists and DoesNotExist take none"),
    ('health: {probePath: "/he alth"}\n', f"health.probePath: {PROBE_RULE} (got '/he alth')"),
    # taken, it would never match a header: silently no session key
    ('session: {headers: ["X Session"]}\n', "session.headers: 'X Session' is not an HTTP header name "
                                             "(letters, digits and !#$%&'*+-.^_`|~)"),
    ('group: {headers: ["X Group"]}\n', "group.headers: 'X Group' is not an HTTP header name "
                                         "(letters, digits and !#$%&'*+-.^_`|~)"),
])
def test_a_bad_config_file_names_its_key_as_written(tmp_path, text, says):
    config = tmp_path / "router.yaml"
    config.write_text(text)
    done = run("serve", "--config", str(config))
    assert done.returncode == 2 and done.stderr.strip() == f"rollout-router serve: invalid settings: {says}"


@pytest.mark.parametrize(("content", "says"), [
    (b"\xff\xfe\n", "not UTF-8 text (byte 0 is 0xff)"),
    (b"backends: [http://127.0.0.1:9\n", "not valid YAML/JSON: while parsing a flow sequence"),
])
def test_a_config_file_that_is_not_yaml_is_one_line(tmp_path, content, says):
    config = tmp_path / "router.yaml"
    config.write_bytes(content)
    done = run("serve", "--config", str(config))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"rollout-router serve: invalid settings: {config}: {says}"), done.stderr


@pytest.mark.parametrize(("flag", "content", "says"), [
    ("--from-json", "not json", "not JSON (Expecting value"),
    ("--from-json", '{"a": 1}', 'not a grid written by --json-out (no "points" list)'),
    ("--cache", "garbage\n", "line 1 is not a row this cache wrote; name another file"),
])
def test_a_simulator_file_that_is_not_its_own_is_one_line(tmp_path, flag, content, says):
    """They were a traceback (JSONDecodeError, KeyError), the cache's after the grid had started."""
    path = tmp_path / "file"
    path.write_text(content)
    done = run("simulate", "--grid", "quick", "--no-progress", flag, str(path))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"rollout-router simulate: {flag} {path}: {says}"), done.stderr


def test_a_bind_refusal_names_the_flag_for_each_errno():
    """Permission (EACCES) cannot be provoked as root, so each errno's wording is checked on the helper."""
    async def refused(code: int) -> None:
        raise OSError(code, os.strerror(code))

    for code, flag, says in [(errno.EACCES, "--port 80", "permission denied"),
                             (errno.EADDRINUSE, "--port 80", "already in use"),
                             (errno.EADDRNOTAVAIL, "--host 10.0.0.1", "is not an address of this machine")]:
        with pytest.raises(usage.UsageError, match=f"^{flag}: .*{says}"):
            asyncio.run(usage.bind(refused(code), "--host", "--port", "10.0.0.1", 80))


def _session_members(session: int) -> list[str]:
    """Live processes (not zombies) of a session: ``/proc/PID/stat`` field 6 is the session id."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone while listing
            continue
        fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, session, ...
        if int(fields[3]) == session and fields[0] != "Z":
            members.append(text[:text.rindex(")") + 1])
    return members


def test_ctrl_c_ends_quietly_and_leaves_no_replica_running():
    """SIGINT while the demo starts its replicas: exit 130, no traceback, and no child left behind.

    The demo runs in its own session, so a replica it orphaned would still carry that session id.
    """
    proc = subprocess.Popen([*SIGINT_DEFAULT, SCRIPT, "demo", "--replicas", "1", "--prompts", "1", "--samples", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert "simulated vLLM replicas" in proc.stdout.readline()  # started: the replicas are coming up
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        left = _session_members(proc.pid)
    finally:
        proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever leaked, so one failure does not leak into later tests
    assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert left == [], left


@pytest.mark.parametrize("signum, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["ctrl-c to the terminal's group", "sigterm to the demo"])
def test_interrupted_mid_rollout_the_demo_ends_quietly_and_stops_every_child(signum, to_group):
    """Once the rounds run (the progress bar counts the first round's turns): a terminal's Ctrl-C (SIGINT to the whole group) or a
    SIGTERM to the demo ends it with exit 130 and no traceback, and no replica or router is left running. (Routers
    that got the Ctrl-C themselves would drain under the demo's feet: its requests would fail with tracebacks.)"""
    proc = subprocess.Popen([*SIGINT_DEFAULT, SCRIPT, "demo", "--replicas", "2", "--prompts", "2", "--samples", "2",
                             "--seed-steps", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        seen = ""
        while not re.search(r"round 1: .*\| *[1-9]\d*/\d+", seen):  # tqdm's bar on stderr: turns are answered
            chunk = proc.stderr.read(1)
            assert chunk, f"the demo ended before its rounds: {seen}"
            seen += chunk
        os.killpg(proc.pid, signum) if to_group else proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
        left = _session_members(proc.pid)
    finally:
        proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for line in _session_members(proc.pid):  # children have their own groups: each by its pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and "Error" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert left == [], left


def test_version_prints_the_package_version():
    import importlib.metadata
    done = run("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"rollout-router {importlib.metadata.version('rollout-router')}")


def test_serve_says_the_settings_in_force_and_the_peer_name_it_mapped():
    """vllm-router's --policy sticky_least_loaded is our affinity: the start-up line says so, and the margin."""
    from rollout_router.localfleet import spawn, stop
    router = spawn(["serve", "--log-level", "info", "--backend", "http://127.0.0.1:9", "--policy",
                    "sticky_least_loaded", "--affinity-break-margin", "4"], "127.0.0.1").bound()
    try:
        stop(router.process)
        log = router.process.stderr.read()
    finally:
        stop(router.process)
    [line] = [line for line in log.splitlines() if "settings in force" in line]
    assert "policy affinity (--policy sticky_least_loaded: that router's name for it)" in line, line
    assert "affinityBreakMargin 4" in line and "1 backends" in line

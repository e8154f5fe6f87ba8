"""Stopping, reloading and restarting a router as an operator does it, with a steady client at the router's own address.

The client is not a readiness-following balancer: it keeps sending on kept-alive connections, as a script with a
fixed router URL does, and moves on only when a connection is refused. Every request the router accepted must be
answered whole: a lone router, ``--workers 2`` and a fleet router alike.
"""
from __future__ import annotations

import http.client
import json
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rollout_router.localfleet import (
    Service,
    fleet_members,
    local_fleet,
    spawn,
    spawn_replica,
    spawn_router,
    start_router_fleet,
    stop,
    wait_healthy,
)
from rollout_router.stopping import SIGNAL_REPEAT_SECONDS
from tests.support import wait_until

REPLICA_ARGS = ["--step-base-ms", "20"]  # a turn of TOKENS tokens streams for about 150 ms
TOKENS = 6
THREADS = 4
PER_THREAD = 400  # a bound on each client thread's turns (it stops at the first refused connection)


def readyz(router: Service) -> int:
    try:
        with urllib.request.urlopen(f"{router.admin_url}/readyz", timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def status(router: Service) -> dict:
    with urllib.request.urlopen(f"{router.admin_url}/status", timeout=5) as answer:
        return json.load(answer)


class SteadyClient:
    """``THREADS`` threads, each sending streamed turns one after another on one kept-alive connection (a new one
    when the router answers ``Connection: close``), until a connection is refused. Each turn ends ``ok`` (a 200
    streamed to its ``[DONE]``), ``refused`` (the connect failed: nothing was sent) or ``cut`` (anything else)."""

    def __init__(self, router: Service, keys: int = 16):
        url = urlsplit(router.url)
        self.host, self.port, self.keys = url.hostname, url.port, keys
        self.outcomes: list[tuple[str, float, str]] = []  # (outcome, when it ended, the key or what went wrong)
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(THREADS)]

    def start(self) -> SteadyClient:
        for thread in self._threads:
            thread.start()
        return self

    def join(self, timeout: float = 60.0) -> None:
        for thread in self._threads:
            thread.join(timeout)
        assert not any(thread.is_alive() for thread in self._threads), "a client thread did not stop"

    def count(self, outcome: str) -> int:
        return sum(1 for o, _, _ in self.outcomes if o == outcome)

    def _run(self, index: int) -> None:
        conn: http.client.HTTPConnection | None = None
        for turn in range(PER_THREAD):
            key = f"session-{(index * 7 + turn) % self.keys}"
            if conn is None:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
                try:
                    conn.connect()
                except ConnectionRefusedError:
                    self.outcomes.append(("refused", time.monotonic(), ""))
                    return
            outcome, detail, closes = turn_on(conn, key)
            self.outcomes.append((outcome, time.monotonic(), detail))
            if closes or outcome != "ok":
                conn.close()
                conn = None
            time.sleep(0.01)
        if conn is not None:
            conn.close()

def turn_on(conn: http.client.HTTPConnection, key: str) -> tuple[str, str, bool]:
    """One streamed turn on ``conn``: (outcome, the key or what went wrong, whether the connection closes)."""
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": f"turn of {key}"}],
                       "max_tokens": TOKENS, "stream": True})
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json", "X-Session-ID": key})
        response = conn.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException) as error:
        return "cut", repr(error), True
    if response.status != 200 or not data.rstrip().endswith(b"data: [DONE]"):
        return "cut", f"{response.status} {data[-200:]!r}", True
    return "ok", key, response.will_close


def replicas(count: int = 2) -> list[Service]:
    started = [spawn_replica(i, REPLICA_ARGS).bound() for i in range(count)]
    for replica in started:
        wait_healthy(replica, "/health")
    return started


def stop_all(services: list[Service]) -> None:
    for service in services:
        service.stop()


def drained(router: Service, client: SteadyClient, signum: signal.Signals = signal.SIGTERM) -> str:
    """Signal ``router`` under ``client``'s traffic; its log, once it and the client have stopped. Every turn the
    router accepted must have been answered whole, and the client must have ended refused (the router stopped
    accepting, rather than exiting at its deadline)."""
    wait_until(lambda: client.count("ok") >= 3 * THREADS, "the steady client's turns to be under way")
    signalled = time.monotonic()
    router.process.send_signal(signum)
    code = router.process.wait(timeout=60)
    client.join()
    log = router.process.stderr.read() if router.process.stderr else ""
    cuts = [detail for outcome, _, detail in client.outcomes if outcome == "cut"]
    assert not cuts, (cuts, log[-3000:])
    assert code == 0, log[-3000:]
    assert client.count("refused") == THREADS, client.outcomes[-10:]
    assert any(outcome == "ok" and when > signalled for outcome, when, _ in client.outcomes)  # finished after it
    assert "none cut" in log and "stopped at --drain-timeout" not in log, log[-3000:]
    return log


def test_a_lone_router_finishes_what_it_accepted_and_stops_accepting():
    """SIGTERM to a lone router (the CLI's default): the streams in flight finish, kept-alive connections close after
    their answer, new connections are refused, and it exits long before --drain-timeout."""
    with local_fleet(2, ["--log-level", "info", "--drain-timeout", "30"], REPLICA_ARGS) as (router, _):
        drained(router, SteadyClient(router).start())


def test_a_first_ctrl_c_drains_and_a_second_cuts():
    """Ctrl-C: the first finishes the stream in flight (one log line), the second cuts it (one more)."""
    with local_fleet(1, ["--log-level", "info"], REPLICA_ARGS) as (router, _):
        url = urlsplit(router.url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.request("POST", "/v1/chat/completions", json.dumps(
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000,
             "stream": True}), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        router.process.send_signal(signal.SIGINT)
        router.process.send_signal(signal.SIGINT)  # the same Ctrl-C delivered twice (a wrapper forwards it)
        wait_until(lambda: readyz(router) == 503, "/readyz to fail once stopping")
        time.sleep(SIGNAL_REPEAT_SECONDS)  # a second Ctrl-C is one that comes later
        assert router.process.poll() is None  # it waits for the stream
        router.process.send_signal(signal.SIGINT)
        assert router.process.wait(timeout=15) == 0
        log = router.process.stderr.read()
        assert "Ctrl-C (SIGINT) (Ctrl-C again stops at once): stopping gracefully" in log, log
        assert "Ctrl-C (SIGINT) again: stopping at once, 1 requests in flight cut" in log, log
        with pytest.raises((OSError, http.client.HTTPException)):
            response.read()
        conn.close()


def test_the_accepting_window_answers_new_connections_while_readyz_fails():
    """--drain-accept-seconds: /readyz fails at once, new connections are still answered for the window."""
    with local_fleet(1, ["--log-level", "info", "--drain-accept-seconds", "3"], REPLICA_ARGS) as (router, _):
        client = SteadyClient(router).start()
        wait_until(lambda: client.count("ok") >= 3 * THREADS, "the steady client's turns to be under way")
        router.process.send_signal(signal.SIGTERM)
        wait_until(lambda: readyz(router) == 503, "/readyz to fail once stopping")
        url = urlsplit(router.url)
        late = http.client.HTTPConnection(url.hostname, url.port, timeout=30)  # a new connection, answered
        assert turn_on(late, "late")[0] == "ok"
        late.close()
        assert router.process.wait(timeout=30) == 0
        client.join()
        assert client.count("cut") == 0 and client.count("refused") == THREADS
        log = router.process.stderr.read()
        assert "none cut" in log, log[-2000:]


def test_workers_finish_what_they_accepted_and_stop_accepting():
    """``--workers 2`` under a client that never lets them be idle: they stop accepting and finish, not run to the
    deadline and cut what the replicas had received."""
    with local_fleet(2, ["--workers", "2", "--log-level", "info",
                                                         "--drain-timeout", "8"], REPLICA_ARGS) as (router, _):
        log = drained(router, SteadyClient(router).start())
        assert log.count("none cut") == 2, log[-3000:]  # one line per worker


def test_a_fleet_router_finishes_what_it_accepted_and_stops_accepting(tmp_path):
    """A router of a fleet, behind a client with a fixed router list: it hands its pins over, stops accepting and
    finishes what it accepted; the sessions' later turns go to the other router, on their replicas."""
    backends = replicas()
    try:
        routers = start_router_fleet(2, backends, tmp_path, router_args=["--log-level", "info",
                                                                         "--drain-timeout", "8"])
        try:
            for router in routers:
                wait_until(lambda r=router: len(fleet_members(r)) == 2, "the routers to see each other")
                wait_healthy(router, "/readyz")
            leaving, staying = routers
            client = SteadyClient(leaving).start()
            drained(leaving, client)
            sessions = {key for outcome, _, key in client.outcomes if outcome == "ok"}
            assert status(staying)["sessions"] == len(sessions)  # every session's pin is on the router that stays
        finally:
            stop_all(routers)
    finally:
        stop_all(backends)


def test_a_grpc_call_in_flight_finishes_and_new_calls_go_elsewhere():
    """gRPC: the connection is told GOAWAY as the router stops accepting, and the call in progress on it streams to
    its end (well past GOAWAY's 2 s linger) rather than being cut; a new call finds the router gone."""
    import grpc
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb
    from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

    backend = spawn_replica(0, ["--step-base-ms", "25"], grpc=True).bound()
    try:
        wait_healthy(backend, "/health")
        router = spawn_router([backend.backend], ["--log-level", "info"], grpc=True).bound()
        try:
            wait_healthy(router, "/readyz")
            assert router.grpc_target is not None
            with grpc.insecure_channel(router.grpc_target) as channel:
                request = pb.GenerateRequest(text="hello there", stream=True,
                                             sampling_params=pb.SamplingParams(max_tokens=160))  # about 4 s
                call = pb_grpc.VllmEngineStub(channel).Generate(request, metadata=(("x-session-id", "long"),))
                messages = iter(call)
                next(messages)
                router.process.send_signal(signal.SIGTERM)
                assert list(messages)[-1].WhichOneof("response") == "complete"
                assert router.process.wait(timeout=30) == 0
                with pytest.raises(grpc.RpcError) as refused:
                    list(pb_grpc.VllmEngineStub(channel).Generate(request, timeout=5))
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            log = router.process.stderr.read()
            assert "none cut" in log, log[-2000:]
        finally:
            router.stop()
    finally:
        backend.stop()


# Reloads that would leave no replica


@pytest.mark.parametrize("text", ["", "# the replicas move to a new file\n", "affinityBreakMargin: 2\n"])
def test_a_reload_that_would_leave_no_replica_is_refused(tmp_path, text):
    """An empty file, a comment, one with no backends (a half-written save): refused, the fleet stays, counted."""
    backend = replicas(1)
    config = tmp_path / "router.yaml"
    config.write_text(f"backends: [{backend[0].url}]\n")
    try:
        router = spawn(["serve", "--config", str(config)], "127.0.0.1").bound()
        try:
            wait_healthy(router, "/readyz")
            config.write_text(text)
            router.process.send_signal(signal.SIGHUP)
            wait_until(lambda: status(router)["config_reloads"]["rejected"] >= 1, "the reload to be refused")
            assert status(router)["config_reloads"]["applied"] == 0
            assert readyz(router) == 200 and len(status(router)["backends"]) == 1
            router.process.send_signal(signal.SIGTERM)
            assert router.process.wait(timeout=30) == 0
            log = router.process.stderr.read()
            assert "not applied, keeping the running settings" in log and "names no replica" in log, log
        finally:
            router.stop()
    finally:
        stop_all(backend)


def test_a_reload_saying_backends_empty_is_applied(tmp_path):
    backend = replicas(1)
    config = tmp_path / "router.yaml"
    config.write_text(f"backends: [{backend[0].url}]\n")
    try:
        router = spawn(["serve", "--config", str(config)], "127.0.0.1").bound()
        try:
            wait_healthy(router, "/readyz")
            config.write_text("backends: []\n")
            router.process.send_signal(signal.SIGHUP)
            wait_until(lambda: status(router)["config_reloads"]["applied"] >= 1, "the reload to be applied")
            assert readyz(router) == 503 and status(router)["backends"] == []
        finally:
            router.stop()
    finally:
        stop_all(backend)


# Pins across a restart


def chat(router: Service, key: str) -> str:
    request = urllib.request.Request(f"{router.url}/v1/chat/completions", json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": key}], "max_tokens": 2}).encode(),
        {"Content-Type": "application/json", "X-Session-ID": key})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.headers["X-RolloutRouter-Replica"]


def restarted(backends: list[Service], state: Path, *args: str) -> Service:
    router = spawn_router([b.url for b in backends], ["--state-file", str(state), "--log-level", "info", *args]).bound()
    wait_healthy(router, "/readyz")
    return router


def stopped(router: Service) -> str:
    router.process.send_signal(signal.SIGTERM)
    assert router.process.wait(timeout=30) == 0
    return router.process.stderr.read()


def test_pins_survive_a_restart_with_a_state_file(tmp_path):
    """Each session's next turn after a restart is kept on its replica; counted as restored, none new."""
    backends = replicas()
    state = tmp_path / "pins.json"
    keys = [f"trajectory-{i}" for i in range(24)]
    try:
        router = restarted(backends, state)
        try:
            first = {key: chat(router, key) for key in keys}
            assert len(set(first.values())) == 2  # both replicas hold sessions
            assert f"{state}: 24 pins written" in stopped(router)
        finally:
            router.stop()
        router = restarted(backends, state)
        try:
            before = status(router)
            assert before["restored"] == 24 and before["sessions"] == 24
            assert {key: chat(router, key) for key in keys} == first
            after = status(router)
            assert after["new_sessions"] == 0 and after["affinity_kept"] == 24, after
        finally:
            router.stop()
        router = restarted(backends[:1], state)  # a replica gone meanwhile: its pins are dropped
        try:
            kept = sum(1 for replica in first.values() if replica == backends[0].url)
            assert status(router)["restored"] == kept < 24
        finally:
            router.stop()
    finally:
        stop_all(backends)


@pytest.mark.parametrize("content", [b"{\"format\": \"rollout-router/pins/1\", \"pins\": [", b"\xff\xfe",
                                     b"[1, 2, 3]", b"{\"format\": \"other\", \"pins\": []}"])
def test_a_corrupt_or_foreign_state_file_is_one_line_and_no_pins(tmp_path, content):
    backends = replicas(1)
    state = tmp_path / "pins.json"
    state.write_bytes(content)
    try:
        router = restarted(backends, state)
        try:
            assert status(router)["sessions"] == 0 and status(router)["restored"] == 0
            log = stopped(router)
            lines = [line for line in log.splitlines() if "not read, starting with no pins" in line]
            assert len(lines) == 1 and "Traceback" not in log, log
        finally:
            router.stop()
    finally:
        stop_all(backends)


def test_state_file_flag_errors_are_one_line(tmp_path):
    for args, says in ((["--state-file", str(tmp_path / "no" / "pins.json")], "--state-file"),
                       (["--workers", "2", "--state-file", str(tmp_path / "pins.json")], "--state-file"),
                       (["--drain-timeout", "5", "--drain-accept-seconds", "5"], "--drain-accept-seconds 5")):
        result = subprocess.run([*spawn_command(), *args], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2 and says in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def spawn_command() -> list[str]:
    from rollout_router.localfleet import command
    return command("serve", "--backend", "http://127.0.0.1:9", "--port", "0", "--admin-port", "0")


def test_stop_is_bounded_for_a_router_that_cannot_drain():
    """``localfleet.stop`` (the tests' and the demo's) cuts a router whose stream never ends, after a short wait."""
    backends = replicas(1)
    try:
        router = spawn_router([b.url for b in backends]).bound()
        try:
            wait_healthy(router, "/readyz")
            url = urlsplit(router.url)
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
            conn.request("POST", "/v1/chat/completions", json.dumps(
                {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000,
                 "stream": True}), {"Content-Type": "application/json"})
            assert conn.getresponse().status == 200
            stop(router.process)
            assert router.process.returncode == 0  # the second SIGTERM, not SIGKILL
            conn.close()
        finally:
            router.stop()
    finally:
        stop_all(backends)


def test_a_request_still_being_read_when_the_router_stops_is_answered():
    """Its head and part of its body came before SIGTERM, the rest a second later: accepted, so answered whole."""
    import socket
    with local_fleet(1, ["--log-level", "info"], REPLICA_ARGS) as (router, _):
        url = urlsplit(router.url)
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * 2000}],
                           "max_tokens": 3}).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
            sock.sendall(head + body[:100])
            router.process.send_signal(signal.SIGTERM)
            wait_until(lambda: readyz(router) == 503, "the router to be stopping")
            time.sleep(1.5)  # the client pauses mid-upload past the stopping router's idle close (1 s)
            sock.sendall(body[100:])
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer, answer[:300]
        assert router.process.wait(timeout=30) == 0
        assert "none cut" in router.process.stderr.read()

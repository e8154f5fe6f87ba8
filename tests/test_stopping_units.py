"""Stopping and restarting, in process: connections queued as a listener closes, and the pins file's checks."""
from __future__ import annotations

import asyncio
import json
import socket
import time

from rollout_router import pinfile
from rollout_router.balancer import Balancer
from rollout_router.replicas import STATIC, ReplicaSet
from rollout_router.settings import RouterSettings, SessionSettings
from tests.support import running_router, scripted_replicas

REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
           b"Connection: close\r\n\r\n{}")


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


async def test_connections_queued_as_the_listener_closes_are_served():
    """Clients that connected and sent their request while the loop was busy wait in the kernel's accept queue:
    closing the listener would reset them; it takes and serves them first, then refuses new ones."""
    async with scripted_replicas(60, 1) as replicas:
        async with running_router(RouterSettings(backends=[replicas[0].url])) as (base, runtime):
            port = int(base.rsplit(":", 1)[1])
            queued = []
            for _ in range(8):  # no await between them and stop_accepting: the loop accepts none of these
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(REQUEST)
                queued.append(sock)
            runtime.http_proxy.stop_accepting()
            answers = await asyncio.gather(*(asyncio.to_thread(_read_all, sock) for sock in queued))
            assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers), [a[:40] for a in answers]
            refused = await asyncio.to_thread(_refused, port)
            assert refused


KEPT_ALIVE = REQUEST.replace(b"Connection: close\r\n", b"")


async def test_a_connection_used_since_the_last_sweep_stays_open_however_late_the_sweep():
    """Stopping closes a client connection once idle, but not one used since the last sweep, even when this sweep
    comes late (a busy loop): its last use is read on the sweep's coarse clock, one sweep behind. A client that
    sent its next turn at that moment once found the connection closed under it (a broken pipe)."""
    async with scripted_replicas(61, 1) as replicas:
        async with running_router(RouterSettings(backends=[replicas[0].url])) as (base, runtime):
            proxy = runtime.http_proxy
            reader, writer = await asyncio.open_connection("127.0.0.1", int(base.rsplit(":", 1)[1]))
            assert (await _turn(reader, writer)).startswith(b"HTTP/1.1 200")
            swept = proxy.now
            while proxy.now == swept:  # a sweep: the next turn is read on its clock
                await asyncio.sleep(0.01)
            assert (await _turn(reader, writer)).startswith(b"HTTP/1.1 200")
            proxy.stop_accepting()
            swept = proxy.now
            time.sleep(1.5)  # the loop busy: the next sweep runs half a second late
            while proxy.now == swept:
                await asyncio.sleep(0.01)
            answer = await _turn(reader, writer)
            assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer.lower(), answer[:200]
            writer.close()


async def _turn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """One request on a kept-alive connection: its answer's head and body (b"" if the connection was closed)."""
    writer.write(KEPT_ALIVE)
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError) as error:
        return getattr(error, "partial", b"")
    length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length")))
    return head + await reader.readexactly(length)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def _pins(tmp_path, pins: list, groups: list | None = None):
    path = tmp_path / "pins.json"
    path.write_text(json.dumps({"format": pinfile.FORMAT, "pins": pins, "groups": groups or []}))
    replicas = ReplicaSet(time.monotonic)
    replicas.replace([("http://a:1", None), ("http://b:1", None)], STATIC)
    balancer = Balancer(replicas, "affinity", RouterSettings().live_config())
    return path, balancer, replicas


def test_the_pins_file_honours_the_time_stopped_and_drops_what_it_cannot_use(tmp_path):
    now = time.time()
    session = SessionSettings(idle_timeout_seconds=600)
    path, balancer, replicas = _pins(tmp_path, [
        ["fresh", "http://a:1", now - 10], ["stale", "http://a:1", now - 601],  # idle past the timeout, stopped too
        ["gone", "http://c:1", now - 5], ["huge", "http://a:1", 10 ** 400], ["nan", "http://a:1", "NaN"],
        ["future", "http://a:1", now + 3600], ["twice", "http://a:1", now - 20], ["twice", "http://b:1", now - 5],
        ["bad"], "bad", ["", "http://a:1", now]])
    assert pinfile.restore(path, balancer, replicas, session, 10) == (2, 9)
    assert balancer.pinned("fresh") == "http://a:1" and balancer.pinned("twice") == "http://b:1"
    assert [key for key, _, _ in balancer.pins()] == ["fresh", "twice"]  # least recently used first
    assert balancer.policy.counters.restored == 2
    assert 8 <= time.monotonic() - balancer.last_used("fresh") <= 60  # its idle time came along


def test_the_pins_file_keeps_the_most_recent_within_max_sessions_and_its_groups(tmp_path):
    now = time.time()
    path, balancer, replicas = _pins(tmp_path, [[f"k{i}", "http://a:1", now - 100 + i] for i in range(10)],
                                     [["g1", "http://a:1"], ["g2", "http://c:1"], ["g3", "http://b:1"]])
    assert pinfile.restore(path, balancer, replicas, SessionSettings(max_sessions=3), 10) == (3, 7)
    assert [key for key, _, _ in balancer.pins()] == ["k7", "k8", "k9"]
    assert balancer.policy.placements() == [("g1", "http://a:1"), ("g3", "http://b:1")]  # g2's replica is gone


def test_a_pins_file_larger_than_max_sessions_could_fill_is_not_read(tmp_path):
    path, balancer, replicas = _pins(tmp_path, [["k", "http://a:1", time.time()]] * 50)
    session = SessionSettings(max_sessions=1, max_key_bytes=1)
    limit = session.max_sessions * (session.max_key_bytes + pinfile.BYTES_PER_PIN) + pinfile.BYTES_SLACK
    path.write_text(json.dumps({"format": pinfile.FORMAT, "pins": [], "pad": "x" * (limit + 1)}))
    assert pinfile.restore(path, balancer, replicas, session, 10) == (0, 0)


def test_pins_written_then_read_back_are_the_same(tmp_path):
    path, balancer, replicas = _pins(tmp_path, [])
    balancer.adopt("one", "http://a:1", idle=30)
    balancer.adopt("two", "http://b:1", idle=5)
    balancer.policy.place_group("g", "http://b:1")
    assert pinfile.save(path, balancer, time.monotonic()) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left
    again = Balancer(replicas, "affinity", RouterSettings().live_config())
    assert pinfile.restore(path, again, replicas, SessionSettings(), 10) == (2, 0)
    assert [(k, r) for k, r, _ in again.pins()] == [("one", "http://a:1"), ("two", "http://b:1")]
    assert again.policy.placements() == [("g", "http://b:1")]


def test_a_reload_says_what_changed_as_the_file_names_it(tmp_path, caplog):
    from rollout_router.app import Runtime
    from rollout_router.settings import parse_settings
    config = tmp_path / "router.yaml"
    config.write_text("backends: [http://127.0.0.1:9]\naffinityBreakMargin: 2\n")
    runtime = Runtime(parse_settings({"backends": ["http://127.0.0.1:9"], "affinityBreakMargin": 2}), config)
    config.write_text("backends: [http://127.0.0.1:9, http://127.0.0.2:9]\naffinityBreakMargin: 4\n"
                      "session: {maxSessions: 50}\n")
    with caplog.at_level("INFO"):
        assert runtime.reload()
        assert runtime.reload()  # the same file again
    applied = [r.getMessage() for r in caplog.records if "applied" in r.getMessage()]
    assert applied[0].endswith("applied: affinityBreakMargin: 2 -> 4; backends: [http://127.0.0.1:9] -> "
                               "[http://127.0.0.1:9, http://127.0.0.2:9]; session.maxSessions: 100000 -> 50")
    assert applied[1].endswith("applied: nothing changed")

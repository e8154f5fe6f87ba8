"""Entry ownership: the router a turn enters by owns its session, behind a front end that hashes X-Session-ID.

With ``fleet.ownership: entry`` (or ``--ownership entry``) no keyed request is
forwarded: a router lacking a session's pin pulls it from whichever peer holds
it, once per new session and once per session whose entry router changed. The
front end is emulated (``front``: every turn of a session sent to the router
the session key hashes to) and real (HAProxy, ``balance hdr(X-Session-ID)``
with ``hash-type consistent``, installed by ``make system-deps``).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rollout_router.localfleet import (
    Service,
    free_port,
    spawn,
    start_router_fleet,
    stop,
    wait_healthy,
)
from tests.support import keys_spread, wait_until
from tests.test_fleet import (  # noqa: F401  (replicas, grpc_replicas, workdir: fixtures)
    COUNTERS,
    EXPECTED,
    converged,
    grpc_replicas,
    grpc_turn,
    quick_turn,
    replicas,
    session,
    set_margin,
    status,
    workdir,
)

ENTRY = ["--ownership", "entry"]


def front(key: str, routers: list[Service]) -> Service:
    """The router a consistent-hashing front end sends ``key``'s turns to, among ``routers`` (its own hash of the
    traffic URL and the key: nothing to do with the routers' rendezvous hash of admin URLs)."""
    return max(routers, key=lambda r: hashlib.sha256(f"{r.url} {key}".encode()).digest())


def spread(routers: list[Service], prefix: str, per_router: int) -> list[str]:
    """Keys that the front end sends to each of ``routers`` ``per_router`` times, interleaved router by router."""
    return keys_spread(lambda key: front(key, routers), routers, prefix, per_router)


def fleet_counts(routers: list[Service]) -> list[dict]:
    return [{**{c: s[c] for c in (*COUNTERS, "sessions")}, **s["fleet"]} for s in map(status, routers)]


def total(counts: list[dict], name: str) -> int:
    return sum(c[name] for c in counts)


def test_entry_ownership_behind_a_hashing_front_end_forwards_nothing(replicas, workdir):
    routers = start_router_fleet(3, replicas, workdir, router_args=ENTRY)
    (workdir / "single.json").write_text(json.dumps({"backends": [r.url for r in replicas]}))
    single = spawn(["serve", "--log-level", "warning", "--config", str(workdir / "single.json")], "127.0.0.1").bound()
    try:
        converged(routers, 3)
        for margin, expected in EXPECTED.items():
            set_margin(routers, replicas, workdir, margin, fleet=True)
            set_margin([single], replicas, workdir, margin, fleet=False)
            for key in spread(routers, f"entry-{margin}", 1):  # every router is the entry of one session
                entry = front(key, routers)
                filler = next(r for r in routers if r is not entry)  # the unkeyed request enters elsewhere
                assert session([entry] * 4, filler, key, routers) == expected, (margin, key)
                assert session([single] * 4, single, key, [single]) == expected
        fleet, alone = fleet_counts(routers), status(single)
        for counter in COUNTERS:
            assert total(fleet, counter) == alone[counter], counter
        assert all(c["ownership"] == "entry" and c["forwarded"] == 0 for c in fleet), fleet
        assert total(fleet, "lookups") == 9  # one per new session, on its first turn; none on the other three
        assert total(fleet, "handoffs") == total(fleet, "ownerUnreachable") == total(fleet, "replaced") == 0
        assert all(s["total_inflight"] == 0 for s in map(status, routers))
    finally:
        for router in (*routers, single):
            router.stop()


def test_a_session_whose_entry_router_changes_takes_its_pin_along(replicas, workdir):
    routers = start_router_fleet(3, replicas, workdir, {"fleet": {"ownership": "entry"}})
    try:
        converged(routers, 3)
        keys = spread(routers, "move", 6)
        first = {key: quick_turn(front(key, routers), key).replica for key in keys}
        moved = [key for key in keys if front(key, routers) is routers[2]]
        before = fleet_counts(routers)
        assert [c["sessions"] for c in before] == [sum(front(k, routers) is r for k in keys) for r in routers]
        for _ in range(2):  # the front end lost router 2: its sessions enter by the other two from now on
            for key in keys:
                assert quick_turn(front(key, routers[:2]), key).replica == first[key], key
        after = fleet_counts(routers)
        assert total(after, "handoffs") == len(moved)  # each moved session's pin came along, once
        assert total(after, "lookups") - total(before, "lookups") == len(moved)  # second round: no lookup
        assert total(after, "new_sessions") == total(before, "new_sessions") == len(keys)
        assert total(after, "replaced") == total(after, "ownerUnreachable") == total(after, "forwarded") == 0
        assert after[2]["sessions"] == 0 and total(after, "sessions") == len(keys)  # one pin per session
        back = moved[0]  # the client switches back to router 2: the pin follows again
        assert quick_turn(routers[2], back).replica == first[back]
        assert status(routers[2])["fleet"]["handoffs"] == 1 and total(fleet_counts(routers), "sessions") == len(keys)
    finally:
        for router in routers:
            router.stop()


def test_a_router_leaving_pushes_its_pins_and_the_new_entry_pulls_them(replicas, workdir):
    routers = start_router_fleet(3, replicas, workdir, router_args=ENTRY)
    try:
        converged(routers, 3)
        keys = spread(routers, "leave-entry", 6)
        first = {key: quick_turn(front(key, routers), key).replica for key in keys}
        leaving, survivors = routers[2], routers[:2]
        mine = status(leaving)["sessions"]
        assert mine > 0
        leaving.process.send_signal(signal.SIGTERM)
        assert leaving.process.wait(timeout=30) == 0
        converged(survivors, 2)
        assert total(fleet_counts(survivors), "sessions") == len(keys)  # its pins went to the survivors
        for _ in range(2):
            for key in keys:
                assert quick_turn(front(key, survivors), key).replica == first[key], key
        counts = fleet_counts(survivors)
        assert total(counts, "new_sessions") == len(keys) - mine  # none of its sessions was placed anew
        assert total(counts, "replaced") == total(counts, "forwarded") == total(counts, "ownerUnreachable") == 0
        assert total(counts, "sessions") == len(keys)
    finally:
        for router in routers:
            router.stop()


def test_grpc_calls_are_decided_where_they_enter_and_their_pin_follows(workdir, grpc_replicas):
    routers = start_router_fleet(2, grpc_replicas, workdir, router_args=ENTRY, grpc=True)
    try:
        converged(routers, 2)
        # the entry router changes twice
        seen = [grpc_turn(router, "grpc-entry") for router in (routers[0], routers[0], routers[1], routers[0])]
        counts = fleet_counts(routers)
        assert len(set(seen)) == 1 and total(counts, "forwarded") == 0
        assert [c["handoffs"] for c in counts] == [1, 1] and total(counts, "new_sessions") == 1
        assert [c["sessions"] for c in counts] == [1, 0]  # the pin is where the last call entered
    finally:
        for router in routers:
            router.stop()


def haproxy_binary() -> str:
    """HAProxy, which ``make system-deps`` (run by ``make test``) installs: its absence is a failure."""
    found = shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy",) if Path(p).exists()), None)
    if found is None:
        pytest.fail("haproxy is not installed: `make system-deps` (run by `make test`) installs it")
    return found


def start_haproxy(routers: list[Service], workdir: Path) -> Service:
    """HAProxy on loopback in front of ``routers``: each request goes to the router its X-Session-ID hashes to
    on a consistent-hash ring (a request without the header: round robin)."""
    port = free_port()
    servers = "\n".join(f"    server r{i} {urlsplit(r.url).netloc}" for i, r in enumerate(routers))
    config = workdir / "haproxy.cfg"
    config.write_text(f"""global
    maxconn 512
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
frontend routers
    bind 127.0.0.1:{port}
    monitor-uri /haproxy-up
    default_backend routers
backend routers
    balance hdr(X-Session-ID)
    hash-type consistent
{servers}
""")
    process = subprocess.Popen([haproxy_binary(), "-db", "-f", str(config)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return wait_healthy(Service(f"http://127.0.0.1:{port}", process), "/haproxy-up")


def test_haproxy_hashing_x_session_id_in_front_of_entry_routers(replicas, workdir):
    routers = start_router_fleet(3, replicas, workdir, router_args=ENTRY)
    proxy: Service | None = None
    try:
        converged(routers, 3)
        proxy = start_haproxy(routers, workdir)
        sessions = 0
        for margin, expected in EXPECTED.items():
            set_margin(routers, replicas, workdir, margin, fleet=True)
            for n in range(2):
                assert session([proxy] * 4, proxy, f"haproxy-{margin}-{n}", routers) == expected, (margin, n)
                sessions += 1
        set_margin(routers, replicas, workdir, None, fleet=True)  # pins kept whatever the loads: stable replicas
        keys = [f"haproxy-multi-{i}" for i in range(24)]
        first = {key: quick_turn(proxy, key).replica for key in keys}
        for _ in range(3):
            for key in keys:
                assert quick_turn(proxy, key).replica == first[key], key
        sessions += len(keys)
        counts = fleet_counts(routers)
        assert all(c["forwarded"] == 0 for c in counts), counts  # every turn entered by its session's owner
        assert sum(c["new_sessions"] > 0 for c in counts) >= 2  # HAProxy spread the sessions over the routers
        assert total(counts, "lookups") == total(counts, "new_sessions") == sessions  # one per new session
        assert total(counts, "handoffs") == total(counts, "ownerUnreachable") == total(counts, "replaced") == 0
        assert total(counts, "sessions") == sessions
        wait_until(lambda: all(s["total_inflight"] == 0 for s in map(status, routers)), "no request in flight")
    finally:
        if proxy is not None:
            stop(proxy.process)
        for router in routers:
            router.stop()

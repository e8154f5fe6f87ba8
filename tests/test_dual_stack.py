"""``--host ::``, as the operator starts router pods: every listener answers over IPv4 and IPv6, and an IPv6
replica (``http://[::1]:PORT``, gRPC ``[::1]:PORT``) is routed to; the operator's status poller reads the
router's ``/status`` at an IPv4 and at an IPv6 pod IP, and its metrics endpoint on ``::`` (the chart's
``operator.bindAddress``) answers both.

The processes run in a network namespace the test creates (``unshare --user --net``: loopback only, both
families), so nothing listens on the machine's own addresses.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_router import listening

ROOT = Path(__file__).resolve().parent.parent


def in_own_network_namespace(script: Path) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("unshare (util-linux) and ip (iproute2) are needed: `make system-deps` (run by `make test`) installs them")
    # root makes the network namespace itself; anyone else needs a user namespace to (often blocked in containers)
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    done = subprocess.run(["unshare", *user, "--net", "sh", "-c",
                           f'ip link set lo up && exec "{sys.executable}" "{script}"'],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "PYTHONPATH": str(ROOT)})
    if done.returncode != 0 and done.stderr.startswith("unshare:"):
        pytest.fail(f"no network namespace of its own for the test ({done.stderr.strip()}): run it as root, or "
                    "where unprivileged user namespaces are allowed (user.max_user_namespaces > 0)")
    return done


def test_a_router_on_every_address_answers_both_families_and_routes_to_an_ipv6_replica():
    done = in_own_network_namespace(ROOT / "tests" / "dual_stack_probe.py")
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    replica = seen["replica"].split(",")[0]
    assert replica.startswith("http://[::1]:")
    assert seen["http"] == {"ipv4": [200, replica], "ipv6": [200, replica]}
    assert seen["admin"] == {"ipv4": 200, "ipv6": 200}
    assert seen["grpc"] == {"ipv4": f"complete {replica}", "ipv6": f"complete {replica}"}
    assert seen["operatorMetrics"] == {"ipv4": 200, "ipv6": 200}
    assert seen["operatorPoll"] == {"ipv4": 1, "ipv6": 1}  # the operator reads the pod's /status by either IP


def test_without_ipv6_every_address_means_every_ipv4_address(monkeypatch):
    real = socket.socket

    def no_ipv6(family: int = socket.AF_INET, *args: object) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "socket", no_ipv6)
    with listening.dual_stack_socket(0) as sock:
        assert sock.family == socket.AF_INET and sock.getsockname()[0] == "0.0.0.0"

"""The pod network: one Linux bridge, one network namespace and veth pair per pod.

Subnet 10.250.0.0/24 on bridge ``rrk8s0``: the host side (the bridge) is 10.250.0.1, the pods'
gateway, and the API server listens there too (port 443) so pods reach it as in a cluster. No
kube-proxy and no cluster DNS run, so Service ClusterIPs do not route: pods get the API server's
own address in KUBERNETES_SERVICE_HOST and, in their /etc/hosts, for kubernetes.default.svc.
Pods get 10.250.0.10 and up. Every address is on this machine; nothing leaves it. Needs root.
"""
from __future__ import annotations

import hashlib
import ipaddress
import subprocess

BRIDGE = "rrk8s0"
SUBNET = ipaddress.ip_network("10.250.0.0/24")
GATEWAY = "10.250.0.1"
FIRST_POD_HOST = 10


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def bridge_up() -> None:
    """Create the bridge with the gateway address (idempotent: a leftover bridge is reused)."""
    if _ip("link", "show", BRIDGE, check=False).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge")
    if GATEWAY not in _ip("-4", "addr", "show", "dev", BRIDGE).stdout:
        _ip("addr", "add", f"{GATEWAY}/{SUBNET.prefixlen}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def bridge_down() -> None:
    _ip("link", "del", BRIDGE, check=False)


def netns_name(pod_uid: str) -> str:
    return f"rrk8s-{pod_uid[:13]}"


class IpPool:
    """Pod addresses in the subnet, handed out and returned by pod uid."""

    def __init__(self) -> None:
        self._free = [str(h) for h in list(SUBNET.hosts())[FIRST_POD_HOST - 1:]]
        self._taken: dict[str, str] = {}

    def take(self, pod_uid: str) -> str:
        if pod_uid not in self._taken:
            self._taken[pod_uid] = self._free.pop(0)
        return self._taken[pod_uid]

    def give_back(self, pod_uid: str) -> None:
        address = self._taken.pop(pod_uid, None)
        if address:
            self._free.append(address)


def create_pod_netns(pod_uid: str, address: str) -> str:
    """A namespace with ``lo`` and ``eth0`` = ``address``/24, default route via the gateway."""
    ns = netns_name(pod_uid)
    host_veth = "rrv" + hashlib.sha1(pod_uid.encode()).hexdigest()[:10]
    delete_pod_netns(pod_uid)
    _ip("netns", "add", ns)
    _ip("link", "add", host_veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("link", "set", host_veth, "master", BRIDGE, "up")
    for args in (["addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", "eth0"], ["link", "set", "eth0", "up"],
                 ["link", "set", "lo", "up"], ["route", "add", "default", "via", GATEWAY]):
        _ip("-n", ns, *args)
    return ns


def delete_pod_netns(pod_uid: str) -> None:
    """Deleting the namespace deletes its veth end, and with it the host end."""
    _ip("netns", "del", netns_name(pod_uid), check=False)


def leftover_namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.startswith("rrk8s-")]

"""Which addresses the worker API may register: link-local and cloud metadata refused, an optional allowlist.

Anyone holding the admin token can register a worker, and the router then
connects to it and relays its answers to clients: a worker at a cloud
metadata address (``169.254.169.254``) would hand the instance's credentials
to whoever asks the traffic port. So, without an allowlist, link-local,
unspecified and multicast addresses and the metadata services' names and
addresses are refused; with ``workerApi.allowedNetworks`` only IP literals
inside those networks are taken (a name is refused: what it resolves to can
change after the check). And how a replica's address is spelled: ``http_url`` and ``host_port`` parse a
backend's URL and gRPC target strictly (a worker URL from the API ends up in every request head to it).
Pure: no name is ever resolved here.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# The metadata services' names and the addresses outside link-local they answer on (the link-local ones,
# 169.254.169.254 of AWS, GCP, Azure, OpenStack and 169.254.170.2 of ECS, are refused as link-local)
METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "instance-data", "instance-data.ec2.internal"})
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("fd00:ec2::254"),  # AWS IMDS over IPv6
                                ipaddress.ip_address("100.100.100.200")})  # Alibaba Cloud


def networks(values: Sequence[str]) -> list[Network]:
    """Parse CIDRs (``10.0.0.0/8``, ``fd00::/8``; a bare address is its /32 or /128); ValueError names a bad one."""
    parsed = []
    for value in values:
        try:
            parsed.append(ipaddress.ip_network(value, strict=False))
        except ValueError:
            raise ValueError(f"{value!r} is not a network (CIDR such as 10.0.0.0/8)") from None
    return parsed


def refusal(host: str, allowed: Sequence[Network]) -> str | None:
    """Why a worker on ``host`` (a URL's host, IPv6 in brackets or not) may not be registered; None if it may."""
    address = _literal(host)
    if allowed:
        if address is None:
            return (f"{host} is a name: with workerApi.allowedNetworks set, register workers by IP address "
                    "(a name could resolve elsewhere after the check)")
        if not any(address in network for network in allowed if network.version == address.version):
            return f"{address} is not in workerApi.allowedNetworks"
        return None
    if address is None:
        name = host.rstrip(".").lower()
        return f"{host} is a cloud metadata service" if name in METADATA_NAMES else None
    if address in METADATA_ADDRESSES:
        return f"{address} is a cloud metadata service"
    for kind in ("link_local", "unspecified", "multicast"):
        if getattr(address, f"is_{kind}"):
            return (f"{address} is a {kind.replace('_', '-')} address; list its network in "
                    "workerApi.allowedNetworks to allow it")
    return None


def _literal(host: str) -> Address | None:
    """``host`` as an IP address (an IPv4-mapped IPv6 one as its IPv4 address), or None for a name."""
    try:
        address = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


HOST_PORT = re.compile(r"[^\s:/]+:\d{1,5}|\[[0-9a-fA-F:]+\]:\d{1,5}")
CONTROL = re.compile(r"[\x00-\x20\x7f]")  # spaces and control bytes: a CR/LF would end up in a request head


def host_port(target: str) -> str:
    """A gRPC target as ``host:port`` or ``[v6]:port``, the port 1-65535."""
    if not HOST_PORT.fullmatch(target):
        raise ValueError(f"grpc target {target!r} must be host:port")
    if not 1 <= int(target.rsplit(":", 1)[1]) <= 65535:
        raise ValueError(f"grpc target {target!r}: the port must be 1-65535")
    return target


def http_url(url: str, what: str = "backend") -> str:
    """A replica's (or a peer router's: ``what``) base URL, parsed strictly: http(s), a host, a port 1-65535 if
    any, no user:password@, no query or fragment, no space or control byte (a worker URL from the API ends up in
    every request head to it)."""
    if CONTROL.search(url):
        raise ValueError(f"{what} {url!r} must not contain spaces or control characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{what} {url!r} must be an http:// or https:// URL")
    if "@" in parts.netloc:
        raise ValueError(f"{what} {url!r} must not carry user:password@")
    if not parts.hostname:
        raise ValueError(f"{what} {url!r} has no host")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or (port is None and parts.netloc.endswith(":")):
        raise ValueError(f"{what} {url!r}: the port must be 1-65535")
    if parts.query or parts.fragment:
        raise ValueError(f"{what} {url!r} must not have a query or a fragment")
    return url.rstrip("/")

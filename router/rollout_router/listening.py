"""Where a server listens, told once it is bound: a line on stdout and, on request, a port file.

With ``--port 0`` (and ``--grpc-port 0``) the kernel picks free ports, so nothing
can take them between choosing and binding. The parent learns the real ports
from the ``--port-file`` (JSON ``{"http": PORT, "grpc": PORT or null, "admin": PORT or null}``),
written only after every listener is bound and renamed into place, so a reader
never sees a partial file.

``::`` as a host means every address of both families, as Go's and nginx's
dual-stack listeners do (asyncio alone would make it IPv6 only): a router pod
then answers on its pod IP in IPv4, IPv6 and dual-stack clusters alike.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import socket
from pathlib import Path

from . import usage

EVERY_ADDRESS = "::"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port-file", type=usage.new_file, metavar="PATH",
                        help="Once listening, write the bound ports here as JSON "
                             '({"http": PORT, "grpc": PORT or null, "admin": PORT or null}); useful with --port 0.')


def dual_stack_socket(port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``[::]:port`` that also takes IPv4 (``IPV6_V6ONLY`` off), or to ``0.0.0.0:port`` on a
    machine without IPv6, for ``loop.create_server(sock=...)``; ``reuse_port``: with ``SO_REUSEPORT``, so the
    workers of ``serve --workers N`` (and their parent, which holds the port) bind it together."""
    for family, host in ((socket.AF_INET6, EVERY_ADDRESS), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as error:
            if error.errno != errno.EAFNOSUPPORT:
                raise
            continue  # the kernel has no IPv6 (ipv6.disable=1)
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
        except OSError as error:
            sock.close()
            if family == socket.AF_INET6 and error.errno == errno.EADDRNOTAVAIL:
                continue
            raise
        return sock
    raise OSError(errno.EAFNOSUPPORT, "neither IPv6 nor IPv4 is available")


def bound_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``::``: ``dual_stack_socket``), not listening yet; ``reuse_port``:
    with ``SO_REUSEPORT`` (``serve --workers N``'s parent holds the workers' ports so)."""
    if host in (EVERY_ADDRESS, f"[{EVERY_ADDRESS}]"):
        return dual_stack_socket(port, reuse_port)
    family, kind, proto, _, where = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(where)
    except OSError:
        sock.close()
        raise
    return sock


def any_address(host: str) -> bool:
    """Whether ``host`` binds every address (``::``, ``0.0.0.0``, or none given), which is no address to be named by."""
    return host.strip("[]") in ("", "0.0.0.0", EVERY_ADDRESS)


def address(host: str, port: int) -> str:
    """``host:port``, IPv6 hosts in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def announce(name: str, host: str, http_port: int, grpc_port: int | None, port_file: Path | None,
             admin: tuple[str, int] | None = None) -> None:
    """Print ``NAME listening on http://HOST:PORT`` (and the gRPC and admin lines), then write the port file."""
    print(f"{name} listening on http://{address(host, http_port)}", flush=True)
    if grpc_port is not None:
        print(f"{name} grpc listening on {address(host, grpc_port)}", flush=True)
    if admin is not None:
        print(f"{name} admin listening on http://{address(*admin)}", flush=True)
    if port_file is not None:
        partial = port_file.with_name(port_file.name + ".partial")
        partial.write_text(json.dumps({"http": http_port, "grpc": grpc_port,
                                       "admin": admin[1] if admin is not None else None}))
        os.replace(partial, port_file)


def read_port_file(path: Path) -> dict[str, int | None] | None:
    """The ports a server wrote with ``announce``; None until it has."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None

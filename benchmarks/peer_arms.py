"""The other proxies a benchmark runs beside ours, as real processes on loopback, each told to key sessions
on the header our load sends (``X-Session-ID``; SGLang's router reads ``x-smg-routing-key``, which the load
generator sends too):

  vllm-router consistent_hash   the Rust peer (pip ``vllm-router``, pinned in the Makefile's PEER_ROUTERS)
  SGLang router manual          sticky on x-smg-routing-key (pip ``sglang-router``)
  HAProxy                       Debian's 2.6, ``nbthread 1``, ``balance hdr(X-Session-ID)`` consistent, keep-alive
                                to the backends (``http-reuse always``)
  nginx                         Debian's 1.22, one worker, ``hash $http_x_session_id consistent``, upstream
                                ``keepalive``, no response buffering (SSE passes through as it comes)
  raw asyncio proxy             not a peer: benchmarks/raw_proxy.py, uvloop + httptools with a keep-alive pool and
                                no router feature, the floor for a Python proxy
  native floor                  not a peer: benchmarks/native_floor/, the same in C protocols on uvloop (built with
                                the machine's cc); "+ our routing" calls the router's Python routing and
                                bookkeeping once per request: what a native data path calling our policy costs
  lane floor                    not a peer: benchmarks/lane_floor.py, the router's own native lane with its routing
                                stubbed out (one replica, nothing recorded): what the lane's C costs alone

Each start function returns a ``Service`` once the arm answers; ``None`` when its program is not installed
(``make bench-deps`` installs them all). Configuration files go to a temporary directory.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from rollout_router.localfleet import Service, free_port, spawn, wait_healthy

SESSION_HEADERS = ("X-Session-ID", "x-smg-routing-key")
NGINX_PROXY = """      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;"""


def tool(name: str) -> str | None:
    """A command from PATH, /usr/sbin, or this interpreter's virtualenv."""
    return (shutil.which(name) or shutil.which(name, path="/usr/sbin")
            or shutil.which(name, path=str(Path(sys.executable).parent)))


def _started(args: list[str], port: int, health: str = "/health") -> Service:
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               text=True)
    return wait_healthy(Service(f"http://127.0.0.1:{port}", process), health, timeout=60)


def ours(*extra: str) -> Callable[[list[str]], Service]:
    """A starter for ``rollout-router serve`` in front of the given backends, with ``extra`` flags."""
    def start(urls: list[str]) -> Service:
        args = ["serve", "--log-level", "warning", *[a for u in urls for a in ("--backend", u)], *extra]
        return wait_healthy(spawn(args, "127.0.0.1").bound(), "/readyz")
    return start


def vllm_router(backends: list[str], policy: str = "consistent_hash") -> Service | None:
    binary = tool("vllm-router")
    if binary is None:
        return None
    port = free_port()
    return _started([binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
                     "--log-level", "warning", "--prometheus-host", "127.0.0.1",
                     "--prometheus-port", str(free_port()), "--worker-urls", *backends], port)


def sglang_router(backends: list[str], policy: str = "manual") -> Service | None:
    binary = tool("sglang-router")
    if binary is None:
        return None
    port = free_port()
    return _started([binary, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
                     "--log-level", "warn", "--prometheus-host", "127.0.0.1",
                     "--prometheus-port", str(free_port()), "--worker-urls", *backends], port)


def haproxy_config(port: int, servers: list[str], bind: str = "", front: str = "  monitor-uri /health\n",
                   header: str = "X-Session-ID") -> Path:
    """A one-thread HAProxy configuration hashing ``header`` consistently over ``servers`` ("ADDRESS [options]"),
    in a temporary directory (benchmarks/grpc_cost.py's arm adds ``proto h2`` on both sides)."""
    work = Path(tempfile.mkdtemp(prefix="bench-haproxy-"))
    lines = "\n".join(f"  server r{i} {server}" for i, server in enumerate(servers))
    (work / "haproxy.cfg").write_text(f"""global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend front
  bind 127.0.0.1:{port}{bind}
{front}  default_backend replicas
backend replicas
  balance hdr({header})
  hash-type consistent
{lines}
""")
    return work / "haproxy.cfg"


def haproxy(backends: list[str]) -> Service | None:
    binary = tool("haproxy")
    if binary is None:
        return None
    port = free_port()
    config = haproxy_config(port, [urlsplit(url).netloc for url in backends])
    return _started([binary, "-db", "-f", str(config)], port)


def nginx_config(port: int, servers: list[str], listen: str = "", location: str = NGINX_PROXY) -> Path:
    """A one-worker nginx configuration hashing the session header consistently over ``servers`` with upstream
    keep-alive, ``location`` serving ``/``, in a temporary directory (grpc_cost.py's: ``http2``, ``grpc_pass``)."""
    work = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    lines = "\n".join(f"    server {server};" for server in servers)
    (work / "nginx.conf").write_text(f"""worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {work}/body;
  proxy_temp_path {work}/proxy;
  fastcgi_temp_path {work}/fastcgi;
  uwsgi_temp_path {work}/uwsgi;
  scgi_temp_path {work}/scgi;
  upstream replicas {{
    hash $http_x_session_id consistent;
{lines}
    keepalive 64;
  }}
  server {{
    listen 127.0.0.1:{port}{listen};
    location = /health {{ return 200 "ok"; }}
    location / {{
{location}
    }}
  }}
}}
""")
    return work / "nginx.conf"


def nginx(backends: list[str]) -> Service | None:
    binary = tool("nginx")
    if binary is None:
        return None
    port = free_port()
    config = nginx_config(port, [urlsplit(url).netloc for url in backends])
    return _started([binary, "-p", str(config.parent), "-c", str(config)], port)


def raw_proxy(backends: list[str]) -> Service:
    port = free_port()
    return _started([sys.executable, str(Path(__file__).with_name("raw_proxy.py")), "127.0.0.1", str(port),
                     *backends], port)


def lane_floor(backends: list[str]) -> Service:
    port = free_port()
    return _started([sys.executable, str(Path(__file__).with_name("lane_floor.py")), "127.0.0.1", str(port),
                     backends[0]], port, "/healthz")


def native_floor(route: str) -> Callable[[list[str]], Service | None]:
    def start(backends: list[str]) -> Service | None:
        if tool("cc") is None:
            return None
        port = free_port()
        return _started([sys.executable, str(Path(__file__).with_name("native_floor") / "serve.py"), "127.0.0.1",
                         str(port), "--route", route, *backends], port)
    return start


PEERS: dict[str, Callable[[list[str]], Service | None]] = {
    "vllm-router consistent_hash": vllm_router,
    "SGLang router manual": sglang_router,
    "HAProxy 2.6 (one thread)": haproxy,
    "nginx 1.22 (one worker)": nginx,
    "raw asyncio proxy (floor)": raw_proxy,
    "native floor (C protocols)": native_floor("hash"),
    "native floor + our routing": native_floor("ours"),
    "lane floor (routing stubbed)": lane_floor,
}

"""Simulated replicas and a router as real local processes (demo, tests, benchmarks).

Each replica is ``rollout-router fake-vllm`` on its own loopback address
(127.0.0.x), each router ``rollout-router serve``; both bind port 0 and report
the ports they got through ``--port-file`` (no port is chosen ahead and raced
for), are then polled over HTTP until they answer, and stopped with SIGTERM.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .listening import address, read_port_file

ADMIN_HOST = "127.0.0.1"  # where spawned routers' admin listeners are reached (the default --admin-host)


DRAIN_WAIT = 2.0  # how long ``stop`` lets a router finish what it is serving before it cuts


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for third-party servers that cannot report a port-0 bind (real vLLM, vllm-router).

    Racy (another process may take it before the server binds): our own
    servers bind port 0 and report through ``--port-file`` instead (``spawn``).
    """
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class Service:
    url: str
    process: subprocess.Popen
    grpc_target: str | None = None  # host:port, when it also serves gRPC
    admin_url: str | None = None  # a router's admin listener (/metrics, /status, sessions)

    @property
    def backend(self) -> str:
        """How a router's ``--backend`` names this replica."""
        return f"{self.url},grpc={self.grpc_target}" if self.grpc_target else self.url

    def stop(self) -> None:
        stop(self.process)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM (a router drains: it finishes what is in flight), SIGTERM again after ``DRAIN_WAIT`` seconds (a
    router stops at once), then SIGKILL after 10 s."""
    for signum, wait in ((signal.SIGTERM, DRAIN_WAIT), (signal.SIGTERM, 10.0)):
        if process.poll() is not None:
            return
        process.send_signal(signum)
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            pass
    process.kill()
    process.wait()


def command(*args: str) -> list[str]:
    """``rollout-router ARGS`` run by this interpreter, so it works inside any virtualenv."""
    return [sys.executable, "-m", "rollout_router.cli", *args]


@dataclass
class Starting:
    """A ``rollout-router`` server started on ``--port 0``; ``bound()`` waits for its port file."""

    process: subprocess.Popen
    host: str
    port_file: Path

    def bound(self, timeout: float = 30.0) -> Service:
        """The service at the ports it reported; fail with its stderr if it died first."""
        try:
            ports = self._wait_ports(timeout)
        finally:
            shutil.rmtree(self.port_file.parent, ignore_errors=True)
        http, grpc, admin = ports["http"], ports["grpc"], ports.get("admin")
        assert http is not None, f"{self.port_file} names no HTTP port"
        return Service(f"http://{address(self.host, http)}", self.process,
                       address(self.host, grpc) if grpc is not None else None,
                       f"http://{address(ADMIN_HOST, admin)}" if admin is not None else None)

    def _wait_ports(self, timeout: float) -> dict[str, int | None]:
        deadline = time.monotonic() + timeout
        while (ports := read_port_file(self.port_file)) is None:
            if self.process.poll() is not None:
                raise RuntimeError(f"rollout-router on {self.host} exited with {self.process.returncode}: "
                                   f"{_stderr(self.process)}")
            if time.monotonic() > deadline:
                stop(self.process)
                raise TimeoutError(f"rollout-router on {self.host} did not bind within {timeout}s")
            time.sleep(0.02)
        return ports


def spawn(args: Sequence[str], host: str, log: IO[str] | None = None,
          preexec: Callable[[], None] | None = None, into: list[subprocess.Popen] | None = None) -> Starting:
    """``rollout-router ARGS --host HOST --port 0 --port-file ...``; ARGS may add ``--grpc-port 0``.

    A router's admin listener binds a free port too (on loopback, ``Service.admin_url``), unless ARGS place it.
    Output goes to ``log`` when given, else stderr is kept for the error of a server that dies. ``preexec`` runs
    in the child before it starts (e.g. to lower its resource limits). With ``into`` the process is appended to
    that list before a Ctrl-C can interrupt: a caller that stops the list on exit never orphans a child. The child
    has its own process group, so a terminal's Ctrl-C reaches the caller alone, which stops its children in order
    (a router that got it too would start draining under the caller's feet).
    """
    port_file = Path(tempfile.mkdtemp(prefix="rollout-router-")) / "ports.json"
    admin = ["--admin-port", "0"] if args[0] == "serve" and "--admin-port" not in args else []
    with interrupts_held():
        process = subprocess.Popen(command(*args, *admin, "--host", host, "--port", "0", "--port-file", str(port_file)),
                                   stdout=log or subprocess.DEVNULL,
                                   stderr=subprocess.STDOUT if log else subprocess.PIPE,
                                   stdin=subprocess.DEVNULL, text=True, preexec_fn=preexec,
                                   process_group=0)
        if into is not None:
            into.append(process)
    return Starting(process, host, port_file)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Defer Ctrl-C (main thread only) while a child starts and is recorded; a deferred one is raised after.

    Without it a Ctrl-C landing inside ``Popen`` (after the fork) or before the caller records the process
    leaves a running child nobody stops. A handler, not a signal mask: a mask would be inherited by the child,
    and unblocking it there needs ``preexec_fn``, whose plain ``fork`` runs gRPC's fork handlers in the child
    (seen aborting it: "epoll_wait error: Bad file descriptor").
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(signal.SIGINT, None)  # Python's default handler: KeyboardInterrupt, now
        elif caught and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)


def wait_healthy(service: Service, health: str, timeout: float = 30.0) -> Service:
    """Poll ``url + health`` until it answers 200; fail with the process's stderr if it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise RuntimeError(f"{service.url} exited with {service.process.returncode}: {_stderr(service.process)}")
        try:
            with urllib.request.urlopen(service.url + health, timeout=1) as response:
                if response.status == 200:
                    return service
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.05)
    service.stop()
    raise TimeoutError(f"{service.url} did not become healthy within {timeout}s")


def _stderr(process: subprocess.Popen) -> str:
    return process.stderr.read()[-2000:] if process.stderr else "(output in its log)"


def spawn_replica(index: int, fake_args: Sequence[str] = (), grpc: bool = False,
                  into: list[subprocess.Popen] | None = None) -> Starting:
    """A simulated replica on its own loopback address, 127.0.0.(10 + index)."""
    return spawn(["fake-vllm", *(["--grpc-port", "0"] if grpc else []), *fake_args], f"127.0.0.{10 + index}",
                 into=into)


def spawn_router(backends: Sequence[str], router_args: Sequence[str] = (), grpc: bool = False,
                 into: list[subprocess.Popen] | None = None) -> Starting:
    flags = [arg for backend in backends for arg in ("--backend", backend)]
    return spawn(["serve", "--log-level", "warning", *flags, *(["--grpc-port", "0"] if grpc else []), *router_args],
                 "127.0.0.1", into=into)


@contextlib.contextmanager
def local_fleet(replicas: int, router_args: Sequence[str] = (), fake_args: Sequence[str] = (),
                grpc: bool = False) -> Iterator[tuple[Service, list[Service]]]:
    """``replicas`` simulated vLLM servers behind one router; everything stops on exit.

    With ``grpc`` the replicas and the router also serve gRPC (``Service.grpc_target``).
    """
    processes: list[subprocess.Popen] = []  # stopped on exit, even those that never bound
    try:
        starting = [spawn_replica(index, fake_args, grpc, into=processes) for index in range(replicas)]
        fleet = [s.bound() for s in starting]
        router = spawn_router([s.backend for s in fleet], router_args, grpc, into=processes).bound()
        for service in fleet:
            wait_healthy(service, "/health")
        yield wait_healthy(router, "/readyz"), fleet
    finally:
        for process in reversed(processes):
            stop(process)


def fleet_config(path: Path, backends: Sequence[Service], peers: Sequence[str], settings: dict | None = None) -> None:
    """Write a router's config file: the replicas, the ``fleet`` section with ``peers``, any other ``settings``."""
    fleet = {**(settings or {}).get("fleet", {}), "peers": list(peers)}
    document = {**(settings or {}), "backends": [{"url": b.url, "grpc": b.grpc_target} for b in backends],
                "fleet": fleet}
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document))
    partial.replace(path)


def start_router_fleet(count: int, backends: Sequence[Service], workdir: Path, settings: dict | None = None,
                       router_args: Sequence[str] = (), grpc: bool = False) -> list[Service]:
    """``count`` routers sharing sessions in front of ``backends``, each told the others' admin URLs.

    Each starts on port 0 with a config naming no peer, then its config is
    rewritten with the others' admin URLs and it is sent SIGHUP; membership
    forms once they poll each other (wait for it with ``fleet_members``).
    """
    routers: list[Service] = []
    try:
        for index in range(count):
            routers.append(spawn_fleet_router(index, backends, workdir, settings, router_args, grpc))
        tell_peers(routers, backends, workdir, settings)
    except BaseException:
        for router in routers:
            router.stop()
        raise
    return routers


def spawn_fleet_router(index: int, backends: Sequence[Service], workdir: Path, settings: dict | None = None,
                       router_args: Sequence[str] = (), grpc: bool = False) -> Service:
    """Router number ``index`` of a fleet (config ``router-INDEX.json`` in ``workdir``), naming no peer yet."""
    config = workdir / f"router-{index}.json"
    fleet_config(config, backends, [], settings)
    return spawn(["serve", "--log-level", "warning", "--config", str(config), *router_args,
                  *(["--grpc-port", "0"] if grpc else [])], "127.0.0.1").bound()


def tell_peers(routers: Sequence[Service], backends: Sequence[Service], workdir: Path,
               settings: dict | None = None) -> None:
    """Rewrite every router's config (``router-N.json`` in ``workdir``) to name the others, and SIGHUP it."""
    import signal
    for index, router in enumerate(routers):
        if router.process.poll() is not None:
            continue
        peers = [r.admin_url for r in routers if r is not router and r.admin_url and r.process.poll() is None]
        fleet_config(workdir / f"router-{index}.json", backends, peers, settings)
        router.process.send_signal(signal.SIGHUP)


def fleet_members(router: Service) -> list[str]:
    """The members a router sees now (its ``/status`` ``fleet.members``)."""
    with urllib.request.urlopen(f"{router.admin_url}/status", timeout=5) as answer:
        return json.load(answer)["fleet"]["members"]

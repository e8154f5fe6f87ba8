"""Simulated replicas and a router as real local processes (demo, tests, benchmarks).

Each replica is ``rollout-router fake-vllm`` on its own loopback address
(127.0.0.x), each router ``rollout-router serve``; both are polled over HTTP
until they answer, and stopped with SIGTERM.
"""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class Service:
    url: str
    process: subprocess.Popen
    grpc_target: str | None = None  # host:port, when it also serves gRPC

    @property
    def backend(self) -> str:
        """How a router's ``--backend`` names this replica."""
        return f"{self.url},grpc={self.grpc_target}" if self.grpc_target else self.url

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def command(*args: str) -> list[str]:
    """``rollout-router ARGS`` run by this interpreter, so it works inside any virtualenv."""
    return [sys.executable, "-m", "rollout_router.cli", *args]


def spawn(args: Sequence[str], url: str) -> Service:
    return Service(url, subprocess.Popen(command(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))


def wait_healthy(service: Service, health: str, timeout: float = 30.0) -> Service:
    """Poll ``url + health`` until it answers 200; fail with the process's stderr if it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise RuntimeError(f"{service.url} exited with {service.process.returncode}: "
                               f"{service.process.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(service.url + health, timeout=1) as response:
                if response.status == 200:
                    return service
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.05)
    service.stop()
    raise TimeoutError(f"{service.url} did not become healthy within {timeout}s")


def spawn_replica(index: int, fake_args: Sequence[str] = (), grpc: bool = False) -> Service:
    host = f"127.0.0.{10 + index}"
    port, grpc_port = free_port(host), free_port(host) if grpc else None
    extra = ["--grpc-port", str(grpc_port)] if grpc else []
    service = spawn(["fake-vllm", "--host", host, "--port", str(port), *extra, *fake_args], f"http://{host}:{port}")
    service.grpc_target = f"{host}:{grpc_port}" if grpc else None
    return service


def spawn_router(backends: Sequence[str], router_args: Sequence[str] = (), grpc: bool = False) -> Service:
    port, grpc_port = free_port(), free_port() if grpc else None
    flags = [arg for backend in backends for arg in ("--backend", backend)]
    extra = ["--grpc-port", str(grpc_port)] if grpc else []
    service = spawn(["serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *flags, *extra,
                     *router_args], f"http://127.0.0.1:{port}")
    service.grpc_target = f"127.0.0.1:{grpc_port}" if grpc else None
    return service


@contextlib.contextmanager
def local_fleet(replicas: int, router_args: Sequence[str] = (), fake_args: Sequence[str] = (),
                grpc: bool = False) -> Iterator[tuple[Service, list[Service]]]:
    """``replicas`` simulated vLLM servers behind one router; everything stops on exit.

    With ``grpc`` the replicas and the router also serve gRPC (``Service.grpc_target``).
    """
    started: list[Service] = []
    try:
        started.extend(spawn_replica(index, fake_args, grpc) for index in range(replicas))
        router = spawn_router([s.backend for s in started], router_args, grpc)
        started.append(router)
        for service in started[:-1]:
            wait_healthy(service, "/health")
        wait_healthy(router, "/readyz")
        yield router, started[:-1]
    finally:
        for service in reversed(started):
            service.stop()

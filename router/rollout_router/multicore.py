"""``rollout-router serve --workers N``: N router processes behind one traffic port, sharing sessions as a fleet.

One Python process uses one core, so a pod with N cores runs N routers (docs/fleet.md, "Several cores"):

- this process, the parent, holds the ports: it binds the traffic (and gRPC) port with ``SO_REUSEPORT`` without
  listening, and one loopback admin port per worker the same way, so port 0 is chosen once and nothing can
  take a port between the parent choosing it and the workers binding it;
- each worker is a plain ``serve`` process listening on those ports with ``SO_REUSEPORT`` (the kernel spreads
  the connections over them), on its own loopback admin port, and on a private loopback traffic port where
  the others forward to it; the workers are each other's ``--peer``: each session key has one owner worker
  (the rendezvous hash), a turn entering another worker asks it for the replica over a Unix socket in a
  directory this process makes (``proxy.decisions``; failing that, goes one hop on loopback to it), and every
  worker's margin sees the others' requests in flight (``/fleet/v1/loads``);
- the parent serves the public admin port (``multicore_admin``): probes, and ``/status`` and ``/metrics`` summed
  over the workers, so the operator and Prometheus see one router per pod.

A worker that exits unexpectedly takes the pod down (the others drain, the parent exits 1, the kubelet restarts
the container): a pod silently running on fewer cores would be worse. SIGTERM or Ctrl-C drains every worker
(``stopping.py``, with their fleet's leave path); a second stops them at once; SIGHUP reloads them all.

With ``--peer-selector`` (router pods sharing sessions) every worker is a member of the pods' fleet: worker i's
admin listener is on the ``--admin-host`` at ``--admin-port`` + 1 + i, the port the other pods find as the pod's
container port named ``fleet-i`` (``fleet.peerpods``), its id the pod's address there, its private traffic ports
on the ``--admin-host`` too. ``--peer``, ``--advertise`` and a ``fleet`` section stay refused: they name one
router, not N.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import listening
from .fleet.node import advertised
from .listening import address, any_address
from .localfleet import Starting, command, interrupts_held
from .multicore_admin import WorkerAdmin
from .settings import RouterSettings
from .stopping import SIGNAL_REPEAT_SECONDS
from .usage import UsageError, bind

log = logging.getLogger(__name__)

WORKER_HOST = "127.0.0.1"  # the workers' admin and private traffic ports: this pod only
START_TIMEOUT = 60.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def refuse_peers(args: argparse.Namespace, settings: RouterSettings) -> None:
    """What ``--workers`` > 1 cannot honour: peers and an id that name one router (the workers join other routers
    through ``--peer-selector`` only), and a ``--peer-selector`` without the fixed admin port the workers' are
    counted from."""
    given = ("--peer" if args.peers else "--advertise" if args.advertise else
             "the config's fleet section" if settings.fleet is not None else None)
    if given:
        raise UsageError(f"--workers {args.workers}: cannot be combined with {given} (each worker is a router of "
                         f"its own to the fleet; docs/fleet.md, 'Several cores'): use --peer-selector, or --workers 1")
    if args.peer_selector:
        _refuse_worker_ports(args)


def _refuse_worker_ports(args: argparse.Namespace) -> None:
    """The workers' admin ports (``--admin-port`` + 1 + i) must exist, miss the traffic ports, and be named by an
    address the other pods can reach."""
    flags = f"--workers {args.workers} with --peer-selector"
    if not args.admin_port:
        raise UsageError(f"{flags}: give a fixed --admin-port (worker i listens on --admin-port + 1 + i, where the "
                         f"other pods find it), not 0")
    ports = range(args.admin_port + 1, args.admin_port + 1 + args.workers)
    if ports[-1] > 65535:
        raise UsageError(f"{flags}: the workers' admin ports {ports[0]}-{ports[-1]} (--admin-port + 1 + i) go "
                         f"past 65535: lower --admin-port")
    taken = [f"{flag} {port}" for flag, port in (("--port", args.port), ("--grpc-port", args.grpc_port))
             if port in ports]
    if taken:
        raise UsageError(f"{flags}: the workers' admin ports {ports[0]}-{ports[-1]} (--admin-port + 1 + i) include "
                         f"{taken[0]}: move one of them")
    if any_address(args.admin_host) and not os.environ.get("POD_IP"):
        raise UsageError(f"{flags} and --admin-host {args.admin_host}: set $POD_IP (the pod's address, by which the "
                         f"other pods name its workers) or give --admin-host that address")


def _worker_admin(args: argparse.Namespace, index: int) -> tuple[str, int]:
    """Where worker ``index``'s admin listener binds: loopback, any free port; in a fleet of pods, the admin host
    at ``--admin-port`` + 1 + ``index`` (the pod's container port ``fleet-<index>``)."""
    if args.peer_selector:
        return args.admin_host, args.admin_port + 1 + index
    return WORKER_HOST, 0


def _local(host: str) -> str:
    """Where this process reaches a listener bound to ``host`` (an any-address: loopback, which it includes)."""
    return WORKER_HOST if any_address(host) else host


def run(args: argparse.Namespace, argv: list[str], in_force: str = "") -> int:
    """Start ``args.workers`` workers from this command line (``argv``), serve the public admin port, supervise;
    ``in_force`` (the settings, one line) is said once they serve."""
    return asyncio.run(_parent(args, argv, in_force))


async def _parent(args: argparse.Namespace, argv: list[str], in_force: str = "") -> int:
    held = [await _reserve(args.host, args.port, "--port")]
    if args.grpc_port is not None:
        held.append(await _reserve(args.host, args.grpc_port, "--grpc-port"))
    admins = [await _reserve(*_worker_admin(args, index), "--admin-port", "--admin-host")
              for index in range(args.workers)]
    ports = [sock.getsockname()[1] for sock in held]
    admin_host = _worker_admin(args, 0)[0]
    urls = [f"http://{address(_local(admin_host), sock.getsockname()[1])}" for sock in admins]  # the parent's way
    ids = [advertised(admin_host, sock.getsockname()[1]) for sock in admins]  # the fleet's names for them
    workers: list[subprocess.Popen] = []
    sockets = Path(tempfile.mkdtemp(prefix="rollout-router-decisions-"))  # mode 0700: this user's only
    admin = WorkerAdmin(urls, workers)  # bound first: a busy --admin-port is refused before any worker starts
    try:
        admin_port = await bind(admin.start(args.admin_host, args.admin_port), "--admin-host", "--admin-port",
                                args.admin_host, args.admin_port)
        starting = [_spawn(argv, index, ports, admin_host, ids, sockets, workers) for index in range(args.workers)]
        try:
            for worker in starting:
                worker.bound(START_TIMEOUT)
        except (RuntimeError, TimeoutError) as error:  # the worker said why on stderr, which it shares
            log.error("a worker did not start, so neither does the pod: %s", error)
            return 1
        listening.announce("rollout-router", args.host, ports[0], ports[1] if len(ports) > 1 else None,
                           args.port_file, (args.admin_host, admin_port))
        log.info("%d workers serving on one port (pids %s)", len(workers), ", ".join(str(w.pid) for w in workers))
        if in_force:
            log.info("%s", in_force)
        return await _supervise(workers, args.drain_timeout)
    finally:
        await admin.close()
        _stop_all(workers)
        for sock in held + admins:
            sock.close()
        shutil.rmtree(sockets, ignore_errors=True)


async def _reserve(host: str, port: int, port_flag: str, host_flag: str = "--host") -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT``, not listening: it keeps the port for the workers."""
    async def reserve() -> socket.socket:
        return listening.bound_socket(host, port, reuse_port=True)
    return await bind(reserve(), host_flag, port_flag, host, port)


def _spawn(argv: list[str], index: int, ports: list[int], admin_host: str, ids: list[str], sockets: Path,
           into: list[subprocess.Popen]) -> Starting:
    """Worker ``index``: this command line, then the flags that make it a worker (later flags win in argparse);
    its siblings are its ``--peer``s, by the ids the fleet knows them by (``ids``); ``sockets``: where their
    decision channels are (``proxy.decisions``)."""
    port_file = Path(tempfile.mkdtemp(prefix="rollout-router-worker-")) / "ports.json"
    own = ["--workers", "1", "--worker", "--port", str(ports[0]), *(["--grpc-port", str(ports[1])] if len(ports) > 1
           else []), "--admin-host", admin_host, "--admin-port", ids[index].rpartition(":")[2],
           "--advertise", ids[index], "--port-file", str(port_file), "--worker-sockets", str(sockets),
           *(arg for url in ids if url != ids[index] for arg in ("--peer", url))]
    with interrupts_held():
        into.append(subprocess.Popen(command(*argv, *own), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent))
    return Starting(into[-1], WORKER_HOST, port_file)


def _die_with_parent() -> None:
    """In the worker: SIGTERM when the parent dies, even by SIGKILL, so a worker is never orphaned (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


async def _supervise(workers: list[subprocess.Popen], drain_timeout: float) -> int:
    """Until SIGTERM/SIGINT (0 once every worker has stopped) or a worker's exit (1, the others drained).

    The first stop signal drains the workers (SIGTERM to each), the second cuts (SIGQUIT: a worker ignores
    SIGINT, which a terminal's Ctrl-C sends the whole process group, so that the parent decides)."""
    loop = asyncio.get_running_loop()
    stopping: asyncio.Future[signal.Signals] = loop.create_future()

    first_at = [0.0]

    def ask(signum: signal.Signals) -> None:
        if not stopping.done():
            stopping.set_result(signum)
            first_at[0] = loop.time()
        elif loop.time() - first_at[0] >= SIGNAL_REPEAT_SECONDS:  # sooner: the same stop delivered twice
            log.warning("%s again: the workers stop at once, cutting what is in flight", signum.name)
            _signal_all(workers, signal.SIGQUIT)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, ask, signum)
    loop.add_signal_handler(signal.SIGHUP, _signal_all, workers, signal.SIGHUP)
    exits = [asyncio.ensure_future(asyncio.to_thread(w.wait)) for w in workers]
    waits: list[asyncio.Future[Any]] = [stopping, *exits]
    done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    died = None if stopping in done else next(w for w, e in zip(workers, exits, strict=True) if e in done)
    if died is not None:
        log.error("worker pid %d exited with %s: stopping the pod (the others drain first) rather than serve on "
                  "fewer cores", died.pid, died.returncode)
    else:
        log.info("%s: the workers stop gracefully (at most %gs); %s again stops them at once",
                 stopping.result().name, drain_timeout, stopping.result().name)
    _signal_all(workers, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.gather(*exits), drain_timeout + 5)
    except TimeoutError:
        log.error("workers still running %g s after the drain began: killed", drain_timeout + 5)
    return 0 if died is None else 1


def _signal_all(workers: list[subprocess.Popen], signum: signal.Signals) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signum)


def _stop_all(workers: list[subprocess.Popen]) -> None:
    """Whatever happened: no worker outlives the parent (SIGKILL for any still running)."""
    for worker in workers:
        if worker.poll() is None:
            worker.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(timeout=10)


def main_argv(args: argparse.Namespace) -> list[str]:
    """The command line ``serve`` was started with (``cli.main`` records it), for the workers to repeat."""
    return list(getattr(args, "argv", None) or sys.argv[1:])

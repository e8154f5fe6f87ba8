"""``rollout-router serve``: settings from a file and flags, then the traffic and admin listeners."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path

from pydantic import ValidationError

from . import addresses, listening, peer_flags, usage
from .app import Peering, Runtime
from .policy import registry
from .proxy.http.admin_listener import DEFAULT_HOST as ADMIN_HOST
from .proxy.http.admin_listener import DEFAULT_PORT as ADMIN_PORT
from .proxy.http.admin_listener import TokenFile
from .proxy.http.lane import unavailable as lane_unavailable
from .settings import (
    HEADER_NAME,
    MAX_WORKERS,
    Backend,
    RouterSettings,
    SessionSettings,
    SettingsError,
    load_settings,
    parse_settings,
)
from .stopping import SIGNAL_REPEAT_SECONDS

SESSION = SessionSettings().model_dump()  # the defaults --help names
DRAIN_TIMEOUT = 20.0  # the operator renders terminationGracePeriodSeconds 30 around it
DATA_PATH_ENV = "ROLLOUT_ROUTER_DATA_PATH"  # --data-path's default, when set (the tests run each path with it)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def _backend(text: str) -> dict:
    url, _, rest = text.partition(",")
    if url.startswith("grpc://") and not rest:  # vLLM's gRPC frontend: gRPC only
        return _checked_backend({"url": url})
    if not url.startswith(("http://", "https://")):  # SGLang router's --backend ENGINE is another flag
        raise argparse.ArgumentTypeError(f"expected a replica's http:// or https:// URL[,grpc=HOST:PORT], or "
                                         f"grpc://HOST:PORT for one that serves gRPC only, got {text!r}")
    if rest and not rest.startswith("grpc="):
        raise argparse.ArgumentTypeError(f"expected URL or URL,grpc=HOST:PORT, got {text!r}")
    return _checked_backend({"url": url, "grpc": rest.removeprefix("grpc=") or None})


def _checked_backend(backend: dict) -> dict:
    """The settings' rules for a backend, here so that argparse names the flag (--backend or --worker-urls)."""
    try:
        Backend.model_validate(backend)
    except ValidationError as error:
        raise argparse.ArgumentTypeError("; ".join(item["msg"].removeprefix("Value error, ")
                                                   for item in error.errors())) from None
    return backend


def _field(text: str) -> str:
    """An argparse type: a JSON body field's name."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a JSON body field, got ''")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="0.0.0.0", type=usage.host, help="Address of the traffic listeners (HTTP and gRPC; "
                        "default 0.0.0.0: every IPv4 address); '::' listens on every IPv6 and IPv4 address (dual "
                        "stack; IPv4 alone without IPv6).")
    parser.add_argument("--port", type=usage.port_or_zero, default=8080,
                        help="HTTP port (default 8080; 0 picks a free one).")
    parser.add_argument("--grpc-port", type=usage.port_or_zero, help="Also serve gRPC (vLLM's VllmEngine and any "
                        "other service, passed through) on this port (0 picks a free one; default: no gRPC); "
                        "replicas need a gRPC target.")
    parser.add_argument("--admin-host", default=ADMIN_HOST, type=usage.host,
                        help=f"Address of the admin listener (/metrics, /status, DELETE /v1/sessions/KEY, probes); "
                        f"default {ADMIN_HOST}: this machine only. In a pod the operator passes '::' (every address).")
    parser.add_argument("--admin-port", type=usage.port_or_zero, default=ADMIN_PORT,
                        help=f"Admin listener port (default {ADMIN_PORT}; 0 picks a free one).")
    parser.add_argument("--admin-token-file", type=Path, metavar="PATH",
                        help="Require 'Authorization: Bearer TOKEN' on admin routes but /healthz and /readyz; "
                        "TOKEN is this file's content, re-read when the file changes (default: no token).")
    listening.add_arguments(parser)
    parser.add_argument("--config", type=Path, metavar="PATH", help="YAML/JSON RouterSettings (docs/configuration.md); "
                        "reloaded on change and on SIGHUP (default: none, the flags alone).")
    parser.add_argument("--backend", action="append", dest="backends", metavar="URL[,grpc=HOST:PORT]|grpc://HOST:PORT",
                        type=_backend, help="A vLLM replica base URL, with its gRPC server if any (repeat). "
                        "Overrides the config file's backends. vllm-router's and SGLang router's --worker-urls URL... "
                        "adds the same.")
    peer_flags.add_arguments(parser, _backend, usage.number(positive=True))
    parser.add_argument("--policy", type=peer_flags.policy, help=f"Routing policy (default affinity): "
                        f"{registry.summary()}. The peers' names for the same rules are accepted (docs/migrating.md).")
    parser.add_argument("--affinity-break-margin", type=usage.margin, default=argparse.SUPPRESS, metavar="N|null",
                        help="Skew tolerated before a pin moves: a number >= 0 (2.5 keeps a pin at skew 2, moves it "
                             "at 3); null (default) keeps every pin.")
    parser.add_argument("--full-determinism", action="store_true", default=None,
                        help="Place sessions by key hash only; the margin is ignored.")
    parser.add_argument("--session-header", action="append", dest="session_headers", metavar="NAME", type=_header,
                        help="Header holding the session key (repeat; default X-Session-ID).")
    parser.add_argument("--session-body-field", action="append", dest="session_body_fields", metavar="FIELD",
                        type=_field,
                        help="JSON body field holding the session key, tried after headers (repeat; default none).")
    parser.add_argument("--max-sessions", type=usage.at_least(1), metavar="N",
                        help=f"Pins kept; the least recently used is evicted beyond this "
                        f"(default {SESSION['max_sessions']}).")
    parser.add_argument("--idle-timeout", type=usage.number(positive=True), metavar="SECONDS",
                        help=f"Seconds before an idle pin is dropped (default {SESSION['idle_timeout_seconds']:g}).")
    parser.add_argument("--peer", action="append", dest="peers", default=[], metavar="URL", type=_admin_url,
                        help="Another router's admin URL (http://HOST:ADMINPORT; repeat): the routers share the "
                        "sessions, each key owned by one of them (docs/fleet.md). Adds to the config's fleet.peers.")
    parser.add_argument("--peer-selector", metavar="LABELS",
                        help="In a cluster: the Ready pods matching these labels (k=v,...) are the other routers; "
                        "each is reached at its container port named 'admin', or one member per worker at its ports named 'fleet-<i>'.")
    parser.add_argument("--peer-namespace", metavar="NS", help="Namespace of --peer-selector's pods "
                        "(default: $POD_NAMESPACE, then the service account's).")
    parser.add_argument("--advertise", metavar="URL", type=_admin_url, help="This router's admin URL as its peers name it "
                        "(default: the admin listener's, with 0.0.0.0 or :: replaced by $POD_IP, in brackets when IPv6).")
    parser.add_argument("--ownership", choices=["rendezvous", "entry"],
                        help="Which router owns a session (overrides the config's fleet.ownership): rendezvous "
                        "(default: the rendezvous hash's winner; the others forward its turns there: for a plain "
                        "Service) or entry (the router the turn enters by; it pulls the pin from its peers: for a "
                        "front end hashing the session key, docs/fleet.md).")
    parser.add_argument("--drain-timeout", type=_seconds, default=DRAIN_TIMEOUT, metavar="SECONDS",
                        help=f"SIGTERM, or a first Ctrl-C, stops the router gracefully: /readyz answers 503, new "
                        f"connections are refused after --drain-accept-seconds, the requests and streams it accepted "
                        f"finish (with peers, its pins go to their new owners); it exits after at most this long "
                        f"(default {DRAIN_TIMEOUT:g}; keep it below the pod's terminationGracePeriodSeconds). "
                        f"A second SIGTERM or Ctrl-C stops it at once, cutting what is in flight.")
    parser.add_argument("--drain-accept-seconds", type=_seconds, default=0.0, metavar="SECONDS",
                        help="While stopping, keep accepting new connections this long after /readyz fails, so that "
                        "a Service's endpoints catch up (default 0; the operator's pods use a few seconds). "
                        "Below --drain-timeout.")
    parser.add_argument("--state-file", type=Path, metavar="PATH",
                        help="Keep the pins across restarts: written here (atomically) as the router stops, read "
                        "back as it starts (pins to unknown replicas or idle past --idle-timeout are dropped). "
                        "Default: none, a restart places every session anew.")
    parser.add_argument("--workers", type=usage.at_least(1, MAX_WORKERS), default=1, metavar="N",
                        help="Router processes (default 1): N > 1 uses N cores; they share the traffic ports "
                        "(SO_REUSEPORT) and the sessions (each key owned by one worker, docs/fleet.md 'Several cores'); "
                        "the admin port answers for all of them. With --peer-selector each worker is a member of the pods' fleet, "
                        "its admin port --admin-port + 1 + i. Not with --peer or --advertise.")
    parser.add_argument("--data-path", choices=["auto", "native", "python"],
                        default=os.environ.get(DATA_PATH_ENV, "auto"),
                        help="The traffic port's HTTP/1.1 data path: native (the common request parsed, forwarded and "
                        "relayed in C, the rest by the Python path; docs/architecture.md), python (the Python path "
                        f"alone), or auto: native where it was built at install, else python (default: "
                        f"${DATA_PATH_ENV}, else auto).")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # set by --workers' parent
    parser.add_argument("--worker-sockets", type=Path, help=argparse.SUPPRESS)  # ditto: the decision channels' dir
    parser.add_argument("--log-level", default="info", type=peer_flags.log_level,
                        choices=["debug", "info", "warning", "error", "critical"], help="Log level (default info).")


def _admin_url(text: str) -> str:
    """An argparse type: a router's admin URL (``addresses.http_url``'s rules: http(s), a host, a port in range, no
    user:password@, no query, no space or control byte)."""
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"must be an http:// or https:// URL, got {text!r}")
    try:
        return addresses.http_url(text, "URL")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _header(text: str) -> str:
    """An argparse type: a header name a request can carry (``session.headers`` checks the same)."""
    if not HEADER_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~), "
                                         f"got {text!r}")
    return text


# flag dest -> the settings field it overrides (reported at startup: a live reload cannot change it)
OVERRIDING_FLAGS = {"backends": "backends", "policy": "policy", "affinity_break_margin": "affinityBreakMargin",
                    "full_determinism": "fullDeterminism", "session_headers": "session.headers",
                    "session_body_fields": "session.bodyFields", "max_sessions": "session.maxSessions",
                    "idle_timeout": "session.idleTimeoutSeconds"}


def overridden(args: argparse.Namespace) -> list[str]:
    """The settings fields a command-line flag pins, whatever the config file says now or later."""
    return [field for dest, field in OVERRIDING_FLAGS.items() if getattr(args, dest, None) is not None
            or (dest == "affinity_break_margin" and hasattr(args, dest))]


def overrides_from(args: argparse.Namespace):
    """A function applying the command-line flags over settings read from a file."""
    top = {"backends": args.backends, "policy": args.policy,
           "full_determinism": args.full_determinism}
    session = {"headers": args.session_headers, "body_fields": args.session_body_fields,
               "max_sessions": args.max_sessions, "idle_timeout_seconds": args.idle_timeout}

    def apply(settings: RouterSettings) -> RouterSettings:
        data = settings.model_dump()
        data.update({k: v for k, v in top.items() if v is not None})
        if hasattr(args, "affinity_break_margin"):
            data["affinity_break_margin"] = args.affinity_break_margin
        data["session"].update({k: v for k, v in session.items() if v is not None})
        return parse_settings(data)  # validates the flags with the same rules as the file

    return apply


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = overrides_from(args)
    try:
        settings = overrides(load_settings(args.config) if args.config else RouterSettings())
    except SettingsError as error:
        print(f"rollout-router serve: invalid settings: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"rollout-router serve: --config {args.config}: {error.strerror}", file=sys.stderr)
        return 2
    if args.config and overridden(args):
        logging.getLogger(__name__).warning(
            "command-line flags override %s of %s: edits to these fields in the file are not applied on reload",
            ", ".join(overridden(args)), args.config)
    try:
        token = TokenFile(args.admin_token_file) if args.admin_token_file else None
    except (OSError, ValueError) as error:
        print(f"rollout-router serve: --admin-token-file {args.admin_token_file}: "
              f"{getattr(error, 'strerror', None) or error}", file=sys.stderr)
        return 2
    if refusal := _stopping_refusal(args):
        print(f"rollout-router serve: {refusal}", file=sys.stderr)
        return 2
    missing = lane_unavailable()
    if args.data_path == "native" and missing:
        print(f"rollout-router serve: --data-path native: {missing}", file=sys.stderr)
        return 2
    in_force = settings_in_force(settings, main_argv_policy(args))  # said once listening (a mistake stays one line)
    if args.workers > 1:
        from . import multicore  # the parent of the workers: it serves no traffic itself
        multicore.refuse_peers(args, settings)
        return multicore.run(args, multicore.main_argv(args), in_force)
    _use_uvloop()
    grpc_address = f"{args.host}:{args.grpc_port}" if args.grpc_port is not None else None
    peering = Peering(tuple(args.peers), args.peer_selector, args.peer_namespace, args.advertise, args.ownership,
                      args.worker, args.worker_sockets if args.worker else None)
    runtime = Runtime(settings, args.config, overrides, grpc_address, (args.admin_host, args.admin_port), token,
                      peering, args.data_path, args.state_file)
    stop = Stopping(args.drain_timeout, args.drain_accept_seconds, args.worker)
    asyncio.run(_serve(runtime, args.host, args.port, args.port_file, stop,
                       missing if args.data_path == "auto" else None, None if args.worker else in_force))
    return 0


def main_argv_policy(args: argparse.Namespace) -> str | None:
    """``--policy`` as written on the command line (a peer's name for one of ours, maybe), if given."""
    argv = list(getattr(args, "argv", None) or ())
    for i, arg in enumerate(argv):
        if arg == "--policy" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--policy="):
            return arg.partition("=")[2]
    return None


def settings_in_force(settings: RouterSettings, written_policy: str | None = None) -> str:
    """One line: the routing settings the router starts with, and the peer name it mapped, if any."""
    alias = (f" (--policy {written_policy}: that router's name for it)"
             if written_policy is not None and written_policy != settings.policy else "")
    margin = "null" if settings.affinity_break_margin is None else f"{settings.affinity_break_margin:g}"
    replicas = ("discovered by label" if settings.discovery is not None
                else f"{len(settings.backends)} backends in the settings")
    return (f"settings in force: policy {settings.policy}{alias}, affinityBreakMargin {margin}"
            f"{' (ignored: fullDeterminism)' if settings.full_determinism else ''}, {replicas}, session keys from "
            f"{', '.join(settings.session.headers) or 'no header'}"
            f"{' then body fields ' + ', '.join(settings.session.body_fields) if settings.session.body_fields else ''}"
            f", maxSessions {settings.session.max_sessions}, idleTimeoutSeconds "
            f"{settings.session.idle_timeout_seconds if settings.session.idle_timeout_seconds is not None else 'null'}")


def _stopping_refusal(args: argparse.Namespace) -> str | None:
    """What is wrong with the stopping flags together, if anything (one line, naming the flags)."""
    if args.drain_accept_seconds and args.drain_accept_seconds >= args.drain_timeout:
        return (f"--drain-accept-seconds {args.drain_accept_seconds:g} must be below --drain-timeout "
                f"{args.drain_timeout:g} (the accepting window is part of the drain)")
    if args.state_file is not None and args.workers > 1:
        return "--state-file is for one process: not with --workers N (each worker holds its own pins)"
    if args.state_file is not None and not args.state_file.parent.is_dir():
        return f"--state-file {args.state_file}: no such directory {str(args.state_file.parent)!r}"
    return None


@dataclasses.dataclass(frozen=True)
class Stopping:
    """How the router stops: ``--drain-timeout``, ``--drain-accept-seconds``; and whether it is one of
    ``--workers N``'s processes (its parent relays the signals: see ``_signals``)."""

    timeout: float
    accept_seconds: float
    worker: bool


async def _serve(runtime: Runtime, host: str, port: int, port_file: Path | None, stop: Stopping,
                 no_lane: str | None = None, in_force: str | None = None) -> None:
    """Bind, announce the bound ports (and ``no_lane``: why the native lane cannot run, when it was not asked for
    by name, and ``in_force``: the settings line), serve until a stop signal, then drain (``Runtime.drain``) unless
    told to stop at once; SIGHUP reloads the settings."""
    signals = StopSignals(runtime, stop.worker)
    try:
        port = await runtime.start(host, port)
        admin = (runtime.admin_address[0], runtime.admin_port) if runtime.admin_address and runtime.admin_port else None
        listening.announce("rollout-router", host, port, runtime.grpc_port, port_file, admin)
        if in_force is not None:
            logging.getLogger(__name__).info("%s", in_force)
        if no_lane is not None:
            logging.getLogger(__name__).warning("%s: the traffic port runs its Python data path", no_lane)
        await _first(signals.draining.wait(), _warn_without_replicas(runtime))
        await _first(signals.cut.wait(), _drain(runtime, stop, signals.why))
    finally:
        await runtime.stop()


async def _drain(runtime: Runtime, stop: Stopping, why: str) -> None:
    """``Runtime.drain``; a bug in it is logged (then the router stops at once), not lost in ``_first``."""
    try:
        await runtime.drain(stop.timeout, stop.accept_seconds, why)
    except Exception:
        logging.getLogger(__name__).exception("stopping failed: stopping at once, %d requests in flight cut",
                                              runtime.in_flight())


class StopSignals:
    """SIGTERM or Ctrl-C (SIGINT) drains, the second cuts; one log line each (the drain's, then the cut's).

    A second signal within ``SIGNAL_REPEAT_SECONDS`` of the first is the same stop delivered twice (systemd signals
    the whole control group, and a wrapper such as ``uv run`` or ``srun`` forwards it too), not a second one.
    A ``--workers`` worker drains on SIGTERM (more change nothing: a whole process group may be sent one too) and
    cuts on SIGQUIT, both from its parent, which relays Ctrl-C: the terminal's SIGINT reaches the worker too, and
    is ignored."""

    def __init__(self, runtime: Runtime, worker: bool):
        self.runtime, self.worker = runtime, worker
        self.draining, self.cut = asyncio.Event(), asyncio.Event()
        self.why = ""  # what started the drain, for its log line
        self.first_at = 0.0  # when (the loop's clock)
        loop = asyncio.get_running_loop()
        if worker:
            loop.add_signal_handler(signal.SIGINT, lambda: None)
            loop.add_signal_handler(signal.SIGTERM, self.signalled, "SIGTERM", "its parent cuts on a second")
            loop.add_signal_handler(signal.SIGQUIT, self.cutting, "SIGQUIT from the parent")
        else:
            loop.add_signal_handler(signal.SIGINT, self.signalled, "Ctrl-C (SIGINT)", "Ctrl-C again stops at once")
            loop.add_signal_handler(signal.SIGTERM, self.signalled, "SIGTERM", "SIGTERM again stops at once")
        loop.add_signal_handler(signal.SIGHUP, runtime.reload)

    def signalled(self, name: str, again: str) -> None:
        now = asyncio.get_running_loop().time()
        if not self.draining.is_set():
            self.why, self.first_at = f"{name} ({again})", now
            self.draining.set()
        elif not self.worker and now - self.first_at >= SIGNAL_REPEAT_SECONDS:
            self.cutting(f"{name} again")

    def cutting(self, name: str) -> None:
        if not self.cut.is_set():
            logging.getLogger(__name__).warning("%s: stopping at once, %d requests in flight cut", name,
                                                self.runtime.in_flight())
            self.draining.set()
            self.cut.set()


async def _warn_without_replicas(runtime: Runtime) -> None:
    """Say once, at start, that every request will get 503: no replica configured, or none passed its probe."""
    log = logging.getLogger(__name__)
    if runtime.settings.discovery is None and not runtime.settings.backends:
        log.warning("no replica is configured (no --backend, no backends in the --config file): every request "
                    "gets 503 until one is added (config file, or POST /add_worker on the admin port)")
    else:
        await runtime.prober.first_round.wait()
        if len(runtime.replicas) and not runtime.replicas.ready_count():
            log.warning("every replica is down at start: %s", runtime.replicas.unavailable())
    await asyncio.Event().wait()  # a warning is not a reason to stop


async def _first(*waits) -> None:
    """Wait until the first of ``waits`` is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pure-Python fallback keeps the router usable everywhere
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

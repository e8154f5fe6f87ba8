"""``rollout-router serve``: settings from a file and flags, then the traffic and admin listeners."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from . import listening
from .app import Peering, Runtime
from .policy import registry
from .proxy.http.admin_listener import DEFAULT_HOST as ADMIN_HOST
from .proxy.http.admin_listener import DEFAULT_PORT as ADMIN_PORT
from .proxy.http.admin_listener import TokenFile
from .settings import RouterSettings, SettingsError, load_settings, parse_settings

DRAIN_TIMEOUT = 20.0  # the operator renders terminationGracePeriodSeconds 30 around it


def _margin(text: str) -> int | None:
    if text.lower() in ("null", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 or 'null', got {text!r}") from None


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
    if rest and not rest.startswith("grpc="):
        raise argparse.ArgumentTypeError(f"expected URL or URL,grpc=HOST:PORT, got {text!r}")
    return {"url": url, "grpc": rest.removeprefix("grpc=") or None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="0.0.0.0", help="Address of the traffic listeners (HTTP and gRPC); "
                        "'::' listens on every IPv6 and IPv4 address (dual stack; IPv4 alone without IPv6).")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port (0 picks a free one).")
    parser.add_argument("--grpc-port", type=int, help="Also serve gRPC (vLLM's VllmEngine and any other "
                        "service, passed through) on this port (0 picks a free one); replicas need a gRPC target.")
    parser.add_argument("--admin-host", default=ADMIN_HOST,
                        help=f"Address of the admin listener (/metrics, /status, DELETE /v1/sessions/KEY, probes); "
                        f"default {ADMIN_HOST}: this machine only. In a pod the operator passes '::' (every address).")
    parser.add_argument("--admin-port", type=int, default=ADMIN_PORT,
                        help=f"Admin listener port (default {ADMIN_PORT}; 0 picks a free one).")
    parser.add_argument("--admin-token-file", type=Path, metavar="PATH",
                        help="Require 'Authorization: Bearer TOKEN' on admin routes but /healthz and /readyz; "
                        "TOKEN is this file's content, re-read when the file changes.")
    listening.add_arguments(parser)
    parser.add_argument("--config", type=Path, help="YAML/JSON RouterSettings; reloaded on change and on SIGHUP.")
    parser.add_argument("--backend", action="append", dest="backends", metavar="URL[,grpc=HOST:PORT]",
                        type=_backend, help="A vLLM replica base URL, with its gRPC server if any (repeat). "
                        "Overrides the config file's backends.")
    parser.add_argument("--policy", help=f"Routing policy (default affinity): {registry.summary()}.")
    parser.add_argument("--affinity-break-margin", type=_margin, default=argparse.SUPPRESS, metavar="N|null",
                        help="Skew tolerated before a pin moves; null (default) keeps every pin.")
    parser.add_argument("--full-determinism", action="store_true", default=None,
                        help="Place sessions by key hash only; the margin is ignored.")
    parser.add_argument("--session-header", action="append", dest="session_headers", metavar="NAME",
                        help="Header holding the session key (repeat; default X-Session-ID).")
    parser.add_argument("--session-body-field", action="append", dest="session_body_fields", metavar="FIELD",
                        help="JSON body field holding the session key, tried after headers (repeat).")
    parser.add_argument("--max-sessions", type=int)
    parser.add_argument("--idle-timeout", type=float, help="Seconds before an idle pin is dropped.")
    parser.add_argument("--peer", action="append", dest="peers", default=[], metavar="URL",
                        help="Another router's admin URL (http://HOST:ADMINPORT; repeat): the routers share the "
                        "sessions, each key owned by one of them (docs/fleet.md). Adds to the config's fleet.peers.")
    parser.add_argument("--peer-selector", metavar="LABELS",
                        help="In a cluster: the Ready pods matching these labels (k=v,...) are the other routers; "
                        "each is reached at its container port named 'admin'.")
    parser.add_argument("--peer-namespace", metavar="NS", help="Namespace of --peer-selector's pods "
                        "(default: $POD_NAMESPACE, then the service account's).")
    parser.add_argument("--advertise", metavar="URL", help="This router's admin URL as its peers name it "
                        "(default: the admin listener's, with 0.0.0.0 or :: replaced by $POD_IP, in brackets when IPv6).")
    parser.add_argument("--ownership", choices=["rendezvous", "entry"],
                        help="Which router owns a session (overrides the config's fleet.ownership): rendezvous "
                        "(default: the rendezvous hash's winner; the others forward its turns there: for a plain "
                        "Service) or entry (the router the turn enters by; it pulls the pin from its peers: for a "
                        "front end hashing the session key, docs/fleet.md).")
    parser.add_argument("--drain-timeout", type=_seconds, default=DRAIN_TIMEOUT, metavar="SECONDS",
                        help=f"With peers, SIGTERM makes the router leave its fleet: /readyz answers 503, its pins go "
                        f"to their new owners, its requests in flight finish; it exits after at most this long "
                        f"(default {DRAIN_TIMEOUT:g}; keep it below the pod's terminationGracePeriodSeconds). "
                        f"A second SIGTERM, or SIGINT, stops it at once.")
    parser.add_argument("--log-level", default="info", type=str.lower,
                        choices=["debug", "info", "warning", "error", "critical"])


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
    _use_uvloop()
    grpc_address = f"{args.host}:{args.grpc_port}" if args.grpc_port is not None else None
    peering = Peering(tuple(args.peers), args.peer_selector, args.peer_namespace, args.advertise, args.ownership)
    runtime = Runtime(settings, args.config, overrides, grpc_address, (args.admin_host, args.admin_port), token,
                      peering)
    asyncio.run(_serve(runtime, args.host, args.port, args.port_file, args.drain_timeout))
    return 0


async def _serve(runtime: Runtime, host: str, port: int, port_file: Path | None, drain_timeout: float) -> None:
    """Bind, announce the bound ports, serve until SIGINT/SIGTERM; SIGHUP reloads the settings.

    SIGTERM to a router with peers first leaves the fleet (``Runtime.leave``, at most ``drain_timeout``
    seconds); SIGINT, or SIGTERM again, stops it at once.
    """
    loop = asyncio.get_running_loop()
    stopping, terminated = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, stopping.set)
    loop.add_signal_handler(signal.SIGTERM, lambda: (stopping if terminated.is_set() else terminated).set())
    loop.add_signal_handler(signal.SIGHUP, runtime.reload)
    port = await runtime.start(host, port)
    try:
        admin = (runtime.admin_address[0], runtime.admin_port) if runtime.admin_address and runtime.admin_port else None
        listening.announce("rollout-router", host, port, runtime.grpc_port, port_file, admin)
        await _first(stopping.wait(), terminated.wait())
        if not stopping.is_set() and runtime.has_peers():
            await _first(stopping.wait(), runtime.leave(drain_timeout))
    finally:
        await runtime.stop()


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

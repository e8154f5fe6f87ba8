"""A way in for vllm-router and SGLang router users: their flags and policy names on ``rollout-router serve``.

Where their flag or policy means what one of ours means, it is accepted as ours; where it does not, it is
refused by name with what to use instead (one line, exit 2), never silently taken or lost among argparse's
"unrecognized arguments". docs/migrating.md describes every row of these tables (a test keeps them equal).
Names come from ``vllm-router --help`` 0.1.17 and ``sglang-router launch --help`` 0.3.2.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from .policy import registry

# their policy name -> ours: the same rule
POLICY_ALIASES = {
    "round_robin": "round_robin",
    "power_of_two": "power_of_two",
    "consistent_hash": "consistent_hash",  # ours bounds each replica's load (c=1.25); docs/migrating.md
    "sticky_least_loaded": "affinity",  # vllm-router: a session stays on its replica while it is up
    "manual": "affinity",  # SGLang: a routing key stays on its worker until idle
}

# their policy name -> what to use instead (no policy of ours is the same rule)
POLICY_REFUSALS = {
    "cache_aware": "it routes by a prefix tree of the prompt text, which this router does not build; for "
                   "multi-turn sessions use --policy affinity (the default), and --affinity-break-margin N "
                   "where you set --balance-abs-threshold N",
    "random": "use --policy power_of_two (two random picks, the less loaded wins) or round_robin",
    "kv_aware": "it scores replicas from vLLM's KV events, which this router does not read; use --policy "
                "affinity (the default) to keep each session on its warm cache",
    "bucket": "a prefill-side policy of disaggregated serving, which this router does not do",
}

# their flag -> ours, the same meaning (the value goes where ours puts it)
FLAG_ALIASES = {
    "--worker-urls": "--backend",
    "--max-idle-secs": "--idle-timeout",
}

# their flag -> what to use instead; any of their other flags gets NO_COUNTERPART
FLAG_REFUSALS = {
    "--balance-abs-threshold": "use --affinity-break-margin N (the in-flight skew tolerated before a session moves)",
    "--prometheus-port": "use --admin-port (the admin listener serves /metrics)",
    "--prometheus-host": "use --admin-host (the admin listener serves /metrics)",
    "--max-payload-size": "set maxBodyBytes in the --config file",
    "--request-timeout-secs": "set firstByteTimeoutSeconds and upstreamTimeoutSeconds in the --config file",
    "--service-discovery": "set discovery (selector, port, namespace) in the --config file, or use the operator",
    "--selector": "set discovery.selector in the --config file",
    "--service-discovery-port": "set discovery.port in the --config file",
    "--service-discovery-namespace": "set discovery.namespace in the --config file",
    "--health-check-endpoint": "set health.probePath in the --config file",
    "--health-check-interval-secs": "set health.probeIntervalSeconds in the --config file",
    "--health-check-timeout-secs": "set health.probeTimeoutSeconds in the --config file",
    "--health-failure-threshold": "set health.consecutiveFailures in the --config file",
    "--max-concurrent-requests": "set maxConnections in the --config file (client connections, not requests)",
    "--request-id-headers": "the session key's header is --session-header",
}

NO_COUNTERPART = "has no counterpart here (docs/migrating.md lists what does)"

# Their other flags: refused with NO_COUNTERPART rather than argparse's "unrecognized arguments"
UNMATCHED = (
    "--cache-threshold", "--balance-rel-threshold", "--eviction-interval-secs", "--max-tree-size",
    "--bucket-adjust-interval-secs", "--assignment-mode", "--prefill-policy", "--decode-policy",
    "--pd-disaggregation", "--vllm-pd-disaggregation", "--prefill", "--decode", "--prefill-selector",
    "--decode-selector", "--mini-lb", "--dp-aware", "--enable-igw", "--intra-node-data-parallel-size",
    "--worker-startup-timeout-secs", "--worker-startup-check-interval", "--api-key", "--log-dir",
    "--retry-max-retries", "--retry-initial-backoff-ms", "--retry-max-backoff-ms", "--retry-backoff-multiplier",
    "--retry-jitter-factor", "--disable-retries", "--cb-failure-threshold", "--cb-success-threshold",
    "--cb-timeout-duration-secs", "--cb-window-duration-secs", "--disable-circuit-breaker",
    "--health-success-threshold", "--disable-health-check", "--queue-size", "--queue-timeout-secs",
    "--rate-limit-tokens-per-second", "--cors-allowed-origins", "--shutdown-grace-period-secs",
    "--router-temperature", "--kv-penalty-host", "--kv-penalty-external", "--kv-penalty-disk",
    "--kv-aware-session-affinity-ttl-secs", "--kv-event-source", "--kv-event-replay-source",
    "--kv-event-block-size", "--kv-event-model", "--pd-kv-events", "--kv-connector", "--vllm-discovery-address",
    "--enable-program-scheduling", "--program-scheduling-config-json", "--prometheus-duration-buckets",
    "--wasm-middleware", "--wasm-middleware-sha256", "--wasm-middleware-route",
    # SGLang router's gateway features: tokenizer, tool and chat parsing, history stores, TLS, tracing, auth
    "--model-path", "--tokenizer-path", "--chat-template", "--tokenizer-cache-enable-l0",
    "--tokenizer-cache-l0-max-entries", "--tokenizer-cache-enable-l1", "--tokenizer-cache-l1-max-memory",
    "--reasoning-parser", "--tool-call-parser", "--mcp-config-path", "--history-backend", "--oracle-wallet-path",
    "--oracle-tns-alias", "--oracle-connect-descriptor", "--oracle-username", "--oracle-password", "--oracle-pool-min",
    "--oracle-pool-max", "--oracle-pool-timeout-secs", "--postgres-db-url", "--postgres-pool-max", "--redis-url",
    "--redis-pool-max", "--redis-retention-days", "--client-cert-path", "--client-key-path", "--ca-cert-paths",
    "--tls-cert-path", "--tls-key-path", "--enable-trace", "--otlp-traces-endpoint", "--control-plane-api-keys",
    "--control-plane-audit-enabled", "--jwt-issuer", "--jwt-audience", "--jwt-jwks-uri", "--jwt-role-mapping",
)


def policy(text: str) -> str:
    """``--policy``'s type: a peer's name for one of our rules becomes ours; a peer rule we lack is refused."""
    if text in POLICY_REFUSALS:
        raise argparse.ArgumentTypeError(f"{text!r} (vllm-router / SGLang router) is not served here: "
                                         f"{POLICY_REFUSALS[text]}")
    name = POLICY_ALIASES.get(text, text)
    try:
        return registry.selectable(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def log_level(text: str) -> str:
    """``--log-level``'s type: SGLang router's ``warn`` is our ``warning``."""
    return {"warn": "warning"}.get(text.lower(), text.lower())


class _Refuse(argparse.Action):
    """A peer flag without a counterpart: stop at once, naming it and what to use instead."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        hint = FLAG_REFUSALS.get(self.option_strings[0], NO_COUNTERPART)
        raise argparse.ArgumentError(self, f"a vllm-router / SGLang router flag that {hint}"
                                     if hint == NO_COUNTERPART else f"not a flag of this router: {hint}")


class _WorkerUrls(argparse.Action):
    """``--worker-urls URL...``: each URL is one ``--backend``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        urls: Sequence[dict] = values
        namespace.backends = [*(namespace.backends or []), *urls]


def add_arguments(parser: argparse.ArgumentParser, backend: Any, seconds: Any) -> None:
    """The peers' flags, hidden from --help (docs/migrating.md lists them); ``backend`` and ``seconds`` are
    the types of ``--backend`` and ``--idle-timeout``."""
    parser.add_argument("--worker-urls", nargs="+", action=_WorkerUrls, type=backend, metavar="URL",
                        help=argparse.SUPPRESS)
    parser.add_argument("--max-idle-secs", dest="idle_timeout", type=seconds, help=argparse.SUPPRESS)
    for flag in (*FLAG_REFUSALS, *UNMATCHED):
        parser.add_argument(flag, nargs="*", action=_Refuse, help=argparse.SUPPRESS)

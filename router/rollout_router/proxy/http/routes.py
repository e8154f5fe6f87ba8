"""Which paths are forwarded, which are keyed, and which headers never cross the proxy."""
from __future__ import annotations

# What vLLM's OpenAI-compatible server serves; anything else is a 404 from us.
FORWARDED_PATHS = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/models",
    "/v1/score", "/v1/rerank", "/v2/rerank", "/v1/audio/transcriptions", "/v1/audio/translations",
    "/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank", "/invocations", "/version",
})
FORWARDED_PREFIXES = ("/v1/responses/", "/v1/models/")
# Paths that read no conversation state: routed least-loaded, so they never move or count a session's pin.
UNKEYED_PATHS = frozenset({"/v1/models", "/tokenize", "/detokenize", "/version"})

REPLICA_HEADER = "X-RolloutRouter-Replica"

# Hop-by-hop headers (RFC 9110 7.6.1) plus the framing headers the proxy sets itself, lower-cased bytes
# as the parser hands them over.
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection", b"te",
    b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"host", b"content-length", b"expect",
})


def forwarded(path: str) -> bool:
    return path in FORWARDED_PATHS or path.startswith(FORWARDED_PREFIXES)


def unkeyed(path: str) -> bool:
    return path in UNKEYED_PATHS or path.startswith("/v1/models/")


def connection_tokens(value: bytes) -> set[bytes]:
    """Header names a Connection header declares hop-by-hop (``close``/``keep-alive`` are not names)."""
    return {token.strip().lower() for token in value.split(b",") if token.strip()} - {b"close", b"keep-alive"}

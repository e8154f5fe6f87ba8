"""Which paths are forwarded, which are keyed, and which headers never cross the proxy.

A path is checked in its normalised form (RFC 3986: percent-encoded unreserved
characters decoded, other escapes upper-cased), and the replica gets that same
form, so what was allowed is what is served. Anything a server behind could
read as another path is refused: dot segments (``..``, ``%2e%2e``, ``..;``, at
any depth of percent-encoding), encoded slashes and backslashes, control bytes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import unquote_to_bytes

from ...errors import RouterError

if TYPE_CHECKING:
    from .request import HttpRequest

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
WEIGHT_VERSION_HEADER = "X-Weight-Version"  # the weight_version the answering replica last reported (/v1/rl)

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


KEYED, UNKEYED = 1, 2  # a forwarded path whose session key is read, or one routed without one (``unkeyed``)


def kind(path: str) -> int:
    """What the traffic port does with ``path``: 0 (not forwarded: a probe, or 404), ``KEYED`` or ``UNKEYED``."""
    return (UNKEYED if unkeyed(path) else KEYED) if forwarded(path) else 0


def connection_tokens(value: bytes) -> set[bytes]:
    """Header names a Connection header declares hop-by-hop (``close``/``keep-alive`` are not names)."""
    return {token.strip().lower() for token in value.split(b",") if token.strip()} - {b"close", b"keep-alive"}


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_DECODE_DEPTH = 3  # percent-decodings looked through for dot segments and slashes (a chain of proxies' worth)


def normalise(request: HttpRequest) -> str:
    """Normalise ``request.target``'s path in place (the query is kept as sent) and return it as text.

    Raises a 400 ``RouterError`` for a path that could reach another route behind us.
    """
    raw, mark, query = request.target.partition(b"?")
    path = normalise_path(raw)
    if path is not raw:  # the usual path is already in its normal form, and ``request.path`` is its text
        request.target = path + mark + query
        request.path = path.decode("utf-8", "surrogateescape")
    return request.path


def normalise_path(raw: bytes) -> bytes:
    """``raw`` with unreserved characters decoded and other escapes upper-cased; RouterError 400 if ambiguous."""
    if b"%" not in raw and b"/." not in raw and b"\\" not in raw:
        return raw  # the usual path: nothing to decode, no dot segment (llhttp refuses control bytes)
    out = bytearray()
    index, size = 0, len(raw)
    while index < size:
        byte = raw[index]
        if byte == 0x25:  # %
            digits = raw[index + 1:index + 3]
            if len(digits) != 2 or not _HEX.issuperset(digits):
                raise _refused(raw, "has a malformed percent-escape")
            value = int(digits, 16)
            if value in _UNRESERVED:
                out.append(value)
            else:
                out += b"%" + digits.upper()
            index += 3
        else:
            out.append(byte)
            index += 1
    path = bytes(out)
    _check_layers(raw, path)
    return path


def _check_layers(raw: bytes, path: bytes) -> None:
    """Refuse dot segments, encoded slashes and control bytes in ``path`` and in each of its decodings."""
    layer = path
    for _ in range(_DECODE_DEPTH):
        if b"\\" in layer or any(byte < 0x20 or byte == 0x7F for byte in layer):
            raise _refused(raw, "has a backslash or a control character")
        if any(segment.partition(b";")[0] in (b".", b"..") for segment in layer.split(b"/")):
            raise _refused(raw, "has a dot segment (. or .., plain or percent-encoded)")
        decoded = unquote_to_bytes(layer)
        if decoded == layer:
            return
        if decoded.count(b"/") != layer.count(b"/"):
            raise _refused(raw, "has an encoded slash")
        layer = decoded
    raise _refused(raw, f"is percent-encoded more than {_DECODE_DEPTH} times over")


def _refused(raw: bytes, why: str) -> RouterError:
    shown = raw[:200].decode("utf-8", "backslashreplace")
    return RouterError(400, f"request path {shown} {why}; the router forwards only plain paths", "path",
                       "bad_path")

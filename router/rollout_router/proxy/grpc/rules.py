"""HTTP/2's rules on request heads (RFC 9113 8.2 and 8.3): what makes a request malformed.

A malformed request is a stream error (PROTOCOL_ERROR): the stream is reset, the connection goes on.
"""
from __future__ import annotations

from . import h2

REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
# Connection-specific fields (RFC 9113 8.2.2): never in HTTP/2; TE is allowed with "trailers" only.
CONNECTION_FIELDS = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})


def _field_problem(name: bytes, value: bytes) -> str | None:
    if name != name.lower():
        return "an upper-case header field name"
    if name in CONNECTION_FIELDS:
        return f"the connection-specific field {name.decode('latin-1')}"
    if name == b"te" and value != b"trailers":
        return "TE other than trailers"
    return None


def request_problem(headers: list[h2.Header]) -> str | None:
    """Why a request head is malformed, or None."""
    seen: dict[bytes, int] = {}
    regular = False
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                return "a pseudo-header field after a regular one"
            if name not in REQUEST_PSEUDO:
                return f"the pseudo-header field {name.decode('latin-1')} in a request"
            seen[name] = seen.get(name, 0) + 1
            if name == b":path" and not value:
                return "an empty :path"
            continue
        regular = True
        problem = _field_problem(name, value)
        if problem is not None:
            return problem
    for name in (b":method", b":scheme", b":path"):
        if seen.get(name, 0) != 1:
            return f"{'no' if name not in seen else 'more than one'} {name.decode()}"
    return None


def trailers_problem(headers: list[h2.Header], end: bool) -> str | None:
    """Why a second header block on a request stream is malformed, or None."""
    if not end:
        return "a second header block without END_STREAM"
    for name, value in headers:
        if name[:1] == b":":
            return "a pseudo-header field in trailers"
        problem = _field_problem(name, value)
        if problem is not None:
            return problem
    return None


def content_length(headers: list[h2.Header]) -> int | None:
    """The declared content-length (-1 when it is not a number), or None."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else -1
    return None

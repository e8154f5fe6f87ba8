"""HTTP/2's rules on request heads (RFC 9113 8.2 and 8.3): what makes a request malformed.

A malformed request is a stream error (PROTOCOL_ERROR): the stream is reset, the connection goes on. Every new
call's head is checked, by the compiled frame engine where it runs (``_grpc_frames.request_head``); the functions
here are its reference, which runs where it does not.
"""
from __future__ import annotations

from . import h2

REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
# Connection-specific fields (RFC 9113 8.2.2): never in HTTP/2; TE is allowed with "trailers" only.
CONNECTION_FIELDS = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})


def py_field_problem(name: bytes, value: bytes) -> str | None:
    """Why a regular field cannot be in a request head or trailers, or None."""
    if name != name.lower():
        return "an upper-case header field name"
    if name in CONNECTION_FIELDS:
        return f"the connection-specific field {name.decode('latin-1')}"
    if name == b"te" and value != b"trailers":
        return "TE other than trailers"
    return None


def py_request_head(headers: list[h2.Header]) -> tuple[str | None, bytes, bytes, int | None]:
    """A request head read in one pass: why it is malformed (or None), its :method, its :path and its declared
    content-length (-1 when it is not a number; None without one)."""
    seen: dict[bytes, int] = {}
    regular = False
    method = path = b""
    length: int | None = None
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                return "a pseudo-header field after a regular one", method, path, length
            if name not in REQUEST_PSEUDO:
                return f"the pseudo-header field {name.decode('latin-1')} in a request", method, path, length
            seen[name] = seen.get(name, 0) + 1
            if name == b":path":
                if not value:
                    return "an empty :path", method, path, length
                path = value
            elif name == b":method":
                method = value
            continue
        regular = True
        if name == b"content-length":
            if length is None:
                length = int(value) if value.isdigit() else -1
        elif name in CONNECTION_FIELDS or name == b"te" or name != name.lower():
            problem = py_field_problem(name, value)
            if problem is not None:
                return problem, method, path, length
    for name in (b":method", b":scheme", b":path"):
        if seen.get(name, 0) != 1:
            return f"{'no' if name not in seen else 'more than one'} {name.decode()}", method, path, length
    return None, method, path, length


request_head, field_problem = (py_request_head, py_field_problem) if h2.engine_rules is None else h2.engine_rules


def trailers_problem(headers: list[h2.Header], end: bool) -> str | None:
    """Why a second header block on a request stream is malformed, or None."""
    if not end:
        return "a second header block without END_STREAM"
    for name, value in headers:
        if name[:1] == b":":
            return "a pseudo-header field in trailers"
        problem = field_problem(name, value)
        if problem is not None:
            return problem
    return None

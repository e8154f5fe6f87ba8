"""One parsed client request, and how its head's headers are sorted while it is parsed (``header_kinds``)."""
from __future__ import annotations

import httptools

from ... import owner
from ...errors import RouterError
from .routes import HOP_BY_HOP

# What on_header does with a header, by lower-cased name (``header_kinds``); no entry: forwarded as it came.
# MARK, the fleet's hop mark, is read and never forwarded: a router forwarding to an owner adds its own, so the
# owner reads that one, not one a client sent first (``Fleet.hopped``), and no replica sees either.
HOST, CONNECTION, TRANSFER, EXPECT, LENGTH, HOP, MARK, KEY, TYPE, ENCODING = range(10)
_HOP_KINDS = dict.fromkeys(HOP_BY_HOP, HOP) | {b"host": HOST, b"connection": CONNECTION,
                                               b"transfer-encoding": TRANSFER, b"expect": EXPECT,
                                               b"content-length": LENGTH, owner.HOP: MARK}


def header_kinds(keys: frozenset[bytes]) -> dict[bytes, int]:
    """The kinds of header a parser sorts, ``keys`` the session-key names (hop-by-hop first, then keys)."""
    return {b"content-type": TYPE, b"content-encoding": ENCODING} | dict.fromkeys(keys, KEY) | _HOP_KINDS


class HttpRequest:
    """One parsed request: what forwarding needs and nothing more."""

    __slots__ = ("method", "target", "path", "headers", "keys", "content_type", "content_encoding", "body", "size",
                 "keep_alive", "head_only", "error", "close_after", "connection", "limit", "expect", "charged",
                 "http10", "hosts", "has_body", "head")

    def __init__(self, limit: int) -> None:
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.keys: dict[bytes, bytes] | None = None  # session-key headers seen, by lower-cased name
        self.content_type: bytes | None = None
        self.content_encoding: bytes | None = None
        self.charged = 0  # bytes counted against the listener's budget until this request is answered
        self.head = 0  # head bytes read and not charged yet: charged at the end of the head or of a read
        self.connection: bytes | None = None
        self.body: list[bytes | bytearray] | bytes = []  # pieces while read, then the whole
        self.size, self.limit = 0, limit
        self.error: RouterError | None = None
        self.close_after = self.expect = self.http10 = self.has_body = False
        self.hosts = 0  # Host headers seen: an HTTP/1.1 request needs exactly one
        self.method, self.path, self.keep_alive, self.head_only = b"GET", "/", True, False


def head_error(request: HttpRequest, parser: httptools.HttpRequestParser) -> RouterError | None:
    """What RFC 9112 makes a head wrong beyond llhttp's checks: the version, the target form, Host."""
    version = parser.get_http_version()
    request.http10 = version == "1.0"
    if version not in ("1.1", "1.0"):
        return RouterError(505, f"HTTP/{version} is not supported on this port; send HTTP/1.1")
    if not request.target.startswith(b"/"):
        return RouterError(400, "request target must be an absolute path")
    if request.hosts != 1 and not request.http10:
        return RouterError(400, f"an HTTP/1.1 request needs exactly one Host header, not {request.hosts}")
    if request.has_body and parser.should_upgrade():  # llhttp ends the message before its body
        return RouterError(400, "a request with a body and Connection: Upgrade is refused: the router does not "
                                "switch protocols; send it without Upgrade")
    return None

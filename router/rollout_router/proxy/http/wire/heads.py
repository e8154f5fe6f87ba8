"""The client's response head, built from a replica's: hop-by-hop headers out, the framing and replica headers in.

Replicas send the same head, the same Date for a second, over and over, but for its Content-Length, so
``relay.Exchange`` builds a head once per shape (``HEADS``), its length put in per response.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import answers
from .routes import HOP_BY_HOP, REPLICA_HEADER, WEIGHT_VERSION_HEADER

if TYPE_CHECKING:
    from .request import HttpRequest

REPLICA_HEADER_BYTES = REPLICA_HEADER.encode()
WEIGHT_VERSION_HEADER_BYTES = WEIGHT_VERSION_HEADER.encode()
HEADS_KEPT = 256  # response shapes remembered (HEADS); cleared when full, so a churn of Dates cannot grow it
HEADS: dict[tuple, tuple[bytes, bytes, bool, bool, bool, bool]] = {}


def remembered(status: int, reason: bytes, headers: list[tuple[bytes, bytes]], has_length: bool,
               upstream_keeps: bool, request: HttpRequest, replica: str, forwarded: bool, version: str | None
               ) -> tuple[bytes, bytes, bool, bool, bool, bool]:
    """``client_head``, built once per shape (``HEADS``): everything the client's head depends on. Replicas send
    the same head, the same Date for a second, over and over; the Content-Length value is no part of the shape
    (every completion has its own): it goes between the two halves of the remembered head. ``forwarded``: to the
    owner router, whose head names the replica already."""
    shape = (status, reason, tuple(headers), has_length, upstream_keeps, request.head_only, request.keep_alive,
             request.close_after, request.http10, forwarded, replica, version)
    built = HEADS.get(shape)
    if built is None:
        if len(HEADS) >= HEADS_KEPT:
            HEADS.clear()
        built = HEADS[shape] = client_head(status, reason, headers, has_length, upstream_keeps, request,
                                           None if forwarded else replica, version)
    return built


def client_head(status: int, reason: bytes, headers: list[tuple[bytes, bytes]], has_length: bool,
                upstream_keeps: bool, request: HttpRequest, replica: str | None, version: str | None
                ) -> tuple[bytes, bytes, bool, bool, bool, bool]:
    """The client's response head for a replica's head (``headers`` without its Content-Length, which it had if
    ``has_length``; hop-by-hop headers out, the framing and replica headers in; ``replica`` None for a forward
    to the owner router, whose head names it already), and what relaying it needs: (the head up to where
    the Content-Length line goes, the rest of it, SSE, re-chunked, body ends at the close, the client
    connection closes after); without a length the first part is the whole head and the second empty.
    A pure function of its arguments, so ``Exchange.on_headers_complete`` remembers its results (``HEADS``)."""
    sse = False
    kept: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        lower = name.lower()
        if lower == b"content-type":
            sse = value.startswith(b"text/event-stream")
        if lower not in HOP_BY_HOP:
            kept.append((name, value))
    no_body = request.head_only or status in (204, 304)
    chunked, close_after = False, request.close_after
    split = len(kept)  # where the Content-Length line goes
    if not has_length and not no_body and request.keep_alive and not close_after and not request.http10:
        chunked = True  # chunked or read-until-close upstream: re-framed as chunks
        kept.append((b"Transfer-Encoding", b"chunked"))
    until_close = not has_length and not upstream_keeps
    if replica is not None:
        kept.append((REPLICA_HEADER_BYTES, replica.encode()))
        if version is not None:  # a trainer drops samples of stale weights by it
            kept.append((WEIGHT_VERSION_HEADER_BYTES, version.encode()))
    if not chunked and not has_length and not no_body:
        close_after = True  # the end of the body is the close (always so for an HTTP/1.0 client)
    if close_after or not request.keep_alive:
        kept.append((b"Connection", b"close"))
    elif request.http10:
        kept.append((b"Connection", b"keep-alive"))  # an HTTP/1.0 client closes unless told
    line = answers.status_line(status, reason)
    if not has_length:
        return line + lines(kept) + b"\r\n", b"", sse, chunked, until_close, close_after
    return line + lines(kept[:split]), lines(kept[split:]) + b"\r\n", sse, chunked, until_close, close_after


def lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join([b"%s: %s\r\n" % pair for pair in headers])

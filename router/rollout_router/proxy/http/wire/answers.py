"""HTTP/1.1 bytes the proxy writes itself: status lines, its own answers, chunk framing."""
from __future__ import annotations

import json
from http import HTTPStatus

from ...errors import error_body

LAST_CHUNK = b"0\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_REASONS[499] = b"Client Closed Request"


def status_line(status: int, reason: bytes | None = None) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, reason if reason is not None else _REASONS.get(status, b"Unknown"))


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def answer(status: int, body: bytes, content_type: bytes = b"application/json", close: bool = False,
           extra: tuple[tuple[bytes, bytes], ...] = (), head_only: bool = False) -> bytes:
    """A complete response the router writes itself (its errors and the admin routes)."""
    lines = [status_line(status), b"Content-Type: %s\r\nContent-Length: %d\r\n" % (content_type, len(body))]
    lines += [b"%s: %s\r\n" % pair for pair in extra]
    if close:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    if not head_only:
        lines.append(body)
    return b"".join(lines)


def error_answer(status: int, message: str, param: str | None = None, close: bool = False,
                 extra: tuple[tuple[bytes, bytes], ...] = (), head_only: bool = False) -> bytes:
    """The router's own error in the OpenAI/vLLM JSON shape (``errors.error_body``)."""
    return answer(status, json.dumps(error_body(status, message, param)).encode(), close=close, extra=extra,
                  head_only=head_only)

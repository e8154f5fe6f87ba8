"""Finding a request's session key: configured headers first, then JSON body fields (both protocols).

HTTP reads headers and, failing them, the body; gRPC reads the same header names
as metadata. Both look the names up lower-cased, as ``KeyNames`` keeps them.
"""
from __future__ import annotations

import json
import zlib
from collections.abc import Mapping

from ..settings import SessionSettings
from .errors import RouterError


def session_key(headers: Mapping[str, str], body: bytes, settings: SessionSettings) -> str | None:
    """The first non-empty key found, or None (headers looked up case-insensitively by the caller's mapping)."""
    for name in settings.headers:
        value = headers.get(name)
        if value:
            return checked_key(value, name, settings)
    return body_key(body, headers.get("Content-Type"), settings)


class KeyNames:
    """The session-key header names, lower-cased, in precedence order; recomputed when the settings change.

    ``of`` also returns the names as a set with ``also`` (the headers a parser must keep for the listener).
    """

    __slots__ = ("_also", "_session", "_names", "_kept")

    def __init__(self, *also: bytes) -> None:
        self._also = also
        self._session: SessionSettings | None = None
        self._names: tuple[bytes, ...] = ()
        self._kept: frozenset[bytes] = frozenset()

    def of(self, session: SessionSettings) -> tuple[tuple[bytes, ...], frozenset[bytes]]:
        if self._session is not session:
            names = tuple(name.lower().encode() for name in session.headers)
            self._session, self._names, self._kept = session, names, frozenset((*names, *self._also))
        return self._names, self._kept


def header_key(header: str, value: bytes, session: SessionSettings) -> str:
    """A session key from a header: UTF-8, within ``session.maxKeyBytes`` (400 otherwise, never a 500)."""
    if len(value) > session.max_key_bytes:  # checked on the bytes first: a huge header is never decoded
        return checked_key(value.decode("latin-1"), header, session)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise RouterError(400, f"session key header {header} is not valid UTF-8", header,
                          "session_key_invalid") from None


def checked_key(key: str, source: str, settings: SessionSettings) -> str:
    """``key`` if it fits ``session.maxKeyBytes``: every pin keeps its key, so an unbounded one is memory."""
    size = len(key.encode("utf-8", "surrogateescape"))
    if size > settings.max_key_bytes:
        raise RouterError(400, f"session key in {source} is {size} bytes, longer than "
                               f"session.maxKeyBytes={settings.max_key_bytes}", source, "session_key_too_long")
    return key


def body_key(body: bytes, content_type: str | None, settings: SessionSettings) -> str | None:
    """The key from the configured JSON body fields, or None.

    Body fields are read only from JSON bodies (a multipart upload has none; no
    Content-Type counts as JSON); bad JSON is an error only when we must read it.
    """
    if not settings.body_fields or not body:
        return None
    if content_type is not None and not content_type.split(";")[0].strip().lower().endswith("json"):
        return None
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RouterError(400, f"request body is not valid JSON ({error}); the session key is read from "
                               f"body fields {settings.body_fields}") from None
    if not isinstance(document, dict):
        raise RouterError(400, "request body must be a JSON object")
    for field in settings.body_fields:
        value = field_value(document, field)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return checked_key(str(value), field, settings)
    return None


def field_value(document: dict, field: str) -> object:
    """The value at ``field`` in a JSON object; dots step into nested objects (``session_params.id``)."""
    value: object = document
    for name in field.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(name)
    return value


def decoded_body(body: bytes, content_encoding: bytes | None, limit: int) -> bytes:
    """The body as JSON text, for reading a session key only; what is forwarded stays as received.

    gzip and deflate are inflated up to ``limit`` bytes (a small compressed bomb is a 413, not memory);
    another Content-Encoding cannot be read, which is a 400 that says to send the key in a header.
    """
    encoding = (content_encoding or b"identity").strip().lower()
    if encoding == b"identity" or not body:
        return body
    if encoding not in (b"gzip", b"x-gzip", b"deflate"):
        raise RouterError(400, f"cannot read the session key from a body with Content-Encoding "
                               f"{encoding.decode('latin-1')}; send it in a session header", "Content-Encoding")
    inflater = zlib.decompressobj(47 if encoding != b"deflate" else 15)  # 47: gzip or zlib header
    try:
        text = inflater.decompress(body, limit)
    except zlib.error as error:
        raise RouterError(400, f"request body is not valid {encoding.decode()} ({error})", "Content-Encoding") from None
    if inflater.unconsumed_tail:
        raise RouterError(413, f"request body inflates to more than maxBodyBytes={limit}")
    return text

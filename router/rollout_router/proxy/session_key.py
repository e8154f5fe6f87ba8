"""Finding a request's session key and group key: configured headers first, then JSON body fields (both protocols).

HTTP reads headers and, failing them, the body; gRPC reads the same header names
as metadata. Both look the names up lower-cased, as ``KeyNames`` keeps them. A
group key (GRPO siblings, ``settings.group``) is found the same way from its own
names and bounded by the same ``session.maxKeyBytes``; errors name which key it was.
"""
from __future__ import annotations

import json
import zlib
from collections.abc import Mapping

from .. import jsonbody
from ..settings import GroupSettings, SessionSettings
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

    ``of`` also returns the names as a set with the group-key names (the headers a parser must
    keep for the listener); ``groups`` then holds the group-key names, lower-cased, in precedence order, and
    ``session_pairs`` and ``group_pairs`` each key's headers as (configured name, lower-cased), for lookups that
    name the header in their errors.
    """

    __slots__ = ("_session", "_group", "_names", "_kept", "groups", "session_pairs", "group_pairs")

    def __init__(self) -> None:
        self._session: SessionSettings | None = None
        self._group: GroupSettings | None = None
        self._names: tuple[bytes, ...] = ()
        self._kept: frozenset[bytes] = frozenset()
        self.groups: tuple[bytes, ...] = ()
        self.session_pairs: tuple[tuple[str, bytes], ...] = ()
        self.group_pairs: tuple[tuple[str, bytes], ...] = ()

    def of(self, session: SessionSettings, group: GroupSettings | None = None) -> tuple[tuple[bytes, ...], frozenset[bytes]]:
        if self._session is not session or self._group is not group:
            names = tuple(name.lower().encode() for name in session.headers)
            self.groups = tuple(name.lower().encode() for name in group.headers) if group is not None else ()
            self._session, self._group, self._names = session, group, names
            self.session_pairs = tuple(zip(session.headers, names))
            self.group_pairs = tuple(zip(group.headers, self.groups)) if group is not None else ()
            self._kept = frozenset((*names, *self.groups))
        return self._names, self._kept


def header_key(header: str, value: bytes, session: SessionSettings, kind: str = "session") -> str:
    """A ``kind`` key from a header: UTF-8, within ``session.maxKeyBytes`` (400 otherwise, never a 500)."""
    if len(value) > session.max_key_bytes:  # checked on the bytes first: a huge header is never decoded
        return checked_key(value.decode("latin-1"), header, session, kind)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise RouterError(400, f"{kind} key header {header} is not valid UTF-8", header,
                          f"{kind}_key_invalid") from None


def checked_key(key: str, source: str, settings: SessionSettings, kind: str = "session") -> str:
    """``key`` if it fits ``session.maxKeyBytes``: every pin (and group) keeps its key, so an unbounded one is memory."""
    try:
        size = len(key.encode("utf-8", "surrogateescape"))  # a header's undecodable bytes count as themselves
    except UnicodeEncodeError:  # a JSON field's lone surrogate ("\ud800"): no UTF-8 at all, no key to pin
        raise RouterError(400, f"{kind} key in {source} is not valid Unicode (a lone surrogate)", source,
                          f"{kind}_key_invalid") from None
    if size > settings.max_key_bytes:
        raise RouterError(400, f"{kind} key in {source} is {size} bytes, longer than "
                               f"session.maxKeyBytes={settings.max_key_bytes}", source, f"{kind}_key_too_long")
    return key


def body_key(body: bytes, content_type: str | None, settings: SessionSettings,
             fields: list[str] | None = None, kind: str = "session") -> str | None:
    """The key from the configured JSON body fields (``fields``: the session's unless given), or None.

    Body fields are read only from JSON bodies (a multipart upload has none; no
    Content-Type counts as JSON); bad JSON is an error only when we must read it.
    """
    fields = settings.body_fields if fields is None else fields
    if not fields or not body:
        return None
    if content_type is not None and not content_type.split(";")[0].strip().lower().endswith("json"):
        return None
    try:
        document = jsonbody.parse(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RouterError(400, f"request body is not valid JSON ({error}); the {kind} key is read from "
                               f"body fields {fields}") from None
    if not isinstance(document, dict):
        raise RouterError(400, "request body must be a JSON object")
    for field in fields:
        value = field_value(document, field)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return checked_key(str(value), field, settings, kind)
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

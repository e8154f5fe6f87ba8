"""Finding a request's session key: configured headers first, then JSON body fields."""
from __future__ import annotations

import json
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

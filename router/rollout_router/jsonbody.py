"""JSON from the network: a client's body, a peer's answer, a replica's usage.

``json.loads`` meets a document nested deeper than the interpreter's recursion limit (a few thousand ``[``) with a
``RecursionError``, which no ``except ValueError`` catches: a request would end in a 500 and a traceback, or, inside
a parser callback, in an exchange never finished. So does an integer of more than 4,300 digits (Python's limit on
converting one, a plain ``ValueError``). Here both are bad JSON like any other.
"""
from __future__ import annotations

import json


def parse(data: bytes | str) -> object:
    """``json.loads``; a document nested too deeply raises ``json.JSONDecodeError`` like any malformed one."""
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        raise
    except (RecursionError, ValueError) as error:
        raise json.JSONDecodeError(_why(error), data if isinstance(data, str) else "", 0) from None


def decode_prefix(decoder: json.JSONDecoder, text: str) -> tuple[object, int]:
    """``decoder.raw_decode``: the value at the start of ``text`` and where it ends; deep nesting as in ``parse``."""
    try:
        return decoder.raw_decode(text)
    except json.JSONDecodeError:
        raise
    except (RecursionError, ValueError) as error:
        raise json.JSONDecodeError(_why(error), text, 0) from None


def _why(error: Exception) -> str:
    return "nested too deeply" if isinstance(error, RecursionError) else "a number too long to read"

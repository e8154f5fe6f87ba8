"""What one routed turn cost and how fast it began, for "is the margin paying?" (docs/observability.md).

A ``Turn`` is made per request by ``attempts.forward`` from the routing decision. The listener's attempt
stamps the first byte of the response body (gRPC: the first response message): for a stream that is its
first event, the first tokens, where the head alone would say nothing (vLLM sends a stream's head before
the prefill); for a JSON answer it is the answer, which comes when generation ends. When the turn is
measured (every moved turn, a sampled share of kept ones), the attempt also hands the tail of the answer
to ``Turn.answer``: the prompt tokens the replica had to prefill are ``usage.prompt_tokens -
usage.prompt_tokens_details.cached_tokens`` of the JSON body or of the last SSE chunk that carries usage
(vLLM's gRPC ``Generate`` reports the same counts, ``grpc/usage.py``). Only the tail is kept
(``TAIL_BYTES``): the usage block is the last thing a vLLM answer says.
"""
from __future__ import annotations

import json
import logging
from typing import Final

from .. import jsonbody
from ..policy import Decision, Outcome

log = logging.getLogger(__name__)

TAIL_BYTES: Final = 4096  # a vLLM usage block (and the SSE chunk around it) is a few hundred bytes
_USAGE: Final = b'"usage"'
_DECODER: Final = json.JSONDecoder()
MEASURED: Final = frozenset({Outcome.BROKEN, Outcome.REPINNED})
_NAMES: Final = {outcome: outcome.value for outcome in Outcome}  # Enum's .value runs two Python calls
KEPT: Final = _NAMES[Outcome.KEPT]  # a kept turn's outcome (``attempts.route`` makes those itself)


class Turn:
    """One request's routing outcome, its first byte and (when measured) the prefill its replica reported."""

    __slots__ = ("outcome", "reason", "measure", "started", "first_byte", "prefill")

    def __init__(self, outcome: str, reason: str | None, measure: bool, started: float = 0.0):
        self.outcome, self.reason, self.measure = outcome, reason, measure
        self.started = started  # when its attempt was dispatched, if known as it is made (else ``begin``)
        self.first_byte: float | None = None  # seconds from the attempt's dispatch to the first body byte
        self.prefill: int | None = None  # prompt tokens prefilled, when the answer said (None: not measured)

    def begin(self, now: float) -> None:
        """An attempt is dispatched (a retry on another replica starts the clock again)."""
        self.started, self.first_byte, self.prefill = now, None, None

    def first(self, now: float) -> None:
        """The first byte of the response body (gRPC: the first message)."""
        if self.first_byte is None:
            self.first_byte = now - self.started

    def ended(self, first_at: float, tail: bytes | None, replica: str) -> None:
        """The native lane's attempt ended: its first body byte came at ``first_at`` (0: none came), ``tail`` is
        the end of its answer when measured (``answer``). ``first`` inlined: once a request, one call."""
        if first_at and self.first_byte is None:
            self.first_byte = first_at - self.started
        if tail is not None:
            self.answer(tail, replica)

    def answer(self, tail: bytes, replica: str) -> None:
        """The tail of a JSON answer or SSE stream from ``replica``: the prefill of its last usage block, if it has
        one. A bug in reading it is logged, not raised: a measurement must not keep a request from ending (a
        lease held for good)."""
        try:
            self.prefill = prefill_of(tail)
        except Exception:  # any bug of the reading: the request ends all the same
            log.exception("measuring the answer of replica %s failed", replica)


def turn_for(decision: Decision, reason: str | None, started: float = 0.0) -> Turn:
    """The ``Turn`` of a ``decision`` that kept no pin: moved turns are always measured, new and unkeyed ones
    never (a kept turn is measured when sampled: ``Turn(KEPT, None, sampled)``)."""
    return Turn(_NAMES[decision.outcome], reason, decision.outcome in MEASURED, started)


def prefill_of(tail: bytes) -> int | None:
    """``prompt_tokens - cached_tokens`` of the last ``"usage"`` object in ``tail``; None when there is none, or
    it has no ``prompt_tokens_details.cached_tokens`` (vLLM without --enable-prompt-tokens-details)."""
    at = tail.rfind(_USAGE)
    if at < 0:
        return None
    rest = tail[at + len(_USAGE):].lstrip()
    if not rest.startswith(b":"):
        return None
    try:
        usage, _ = jsonbody.decode_prefix(_DECODER, rest[1:].decode("utf-8", "replace").lstrip())
    except ValueError:
        return None
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    return tokens(usage.get("prompt_tokens"), details.get("cached_tokens") if isinstance(details, dict) else None)


def tokens(prompt: object, cached: object) -> int | None:
    """Prompt tokens not served from the prefix cache; None unless both counts are whole numbers."""
    if type(prompt) is not int or type(cached) is not int or not 0 <= cached <= prompt:
        return None
    return prompt - cached

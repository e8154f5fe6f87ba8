"""A cheap, deterministic stand-in for a tokenizer: one token per whitespace-separated word.

Generated text is made of such words too, and a word's id never depends on its
context, so a conversation that sends a reply back in its next turn
re-tokenizes to exactly the ids that were generated. The prefix cache then
hits across turns the way it does behind a real chat template.
"""
from __future__ import annotations

import functools
import hashlib
import zlib
from collections.abc import Iterable

GENERATION_PROMPT = "assistant:"

_FILLER = (
    "the", "model", "says", "that", "a", "small", "replica", "keeps", "its", "cache",
    "warm", "while", "requests", "arrive", "in", "batches", "and", "every", "token",
    "is", "simulated", "with", "care", "so", "routers", "can", "measure", "latency",
    "under", "load", "without", "GPUs",
)


@functools.lru_cache(maxsize=1 << 16)
def word_id(word: str) -> int:
    """A stable 31-bit id per word, the same in every process and run."""
    digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1


def tokenize(text: str) -> list[int]:
    return [word_id(word) for word in text.split()]


def render_chat(messages: Iterable[tuple[str, str]], add_generation_prompt: bool = True) -> str:
    """The fake chat template: one ``role: content`` line per message."""
    lines = [f"{role}: {content}" for role, content in messages]
    if add_generation_prompt:
        lines.append(GENERATION_PROMPT)
    return "\n".join(lines)


def weights_shift(weights: str) -> int:
    """How loaded weights shift the generated text: never by a whole turn of the filler (``""``, the weights the
    replica started with, by nothing), so any new weights change every answer."""
    return 1 + zlib.crc32(weights.encode()) % (len(_FILLER) - 1) if weights else 0


def output_word(seed: int, index: int) -> str:
    """The ``index``-th generated word of a request; ``seed`` varies the text per prompt."""
    return _FILLER[(seed + index) % len(_FILLER)]


def output_piece(seed: int, index: int) -> str:
    """The text a generated token adds to the output (words are space-separated)."""
    word = output_word(seed, index)
    return word if index == 0 else " " + word

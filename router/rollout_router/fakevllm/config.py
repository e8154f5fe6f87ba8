"""Every knob of the simulated replica, with defaults for a small, fast demo.

Each field doubles as a CLI flag (``--block-size`` for ``block_size``; help in
the field's metadata), so the config and the command line cannot drift apart.
"""
from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


def _knob(default: int | float | str, help: str, *aliases: str) -> Any:
    return field(default=default, metadata={"help": help, "aliases": aliases})


@dataclasses.dataclass(frozen=True, slots=True)
class FakeVllmConfig:
    served_model_name: str = _knob("tiny", "model name in /v1/models and responses")
    block_size: int = _knob(16, "tokens per KV block (prefix cache granularity)")
    num_blocks: int = _knob(4096, "KV blocks in the pool; fewer means more eviction and preemption")
    max_num_seqs: int = _knob(256, "most requests running in one engine step")
    max_num_batched_tokens: int = _knob(
        8192, "token budget of one engine step (longer prefills are chunked)", "--max-batched-tokens"
    )
    max_model_len: int = _knob(32768, "longest prompt + completion accepted, in tokens")
    default_max_tokens: int = _knob(16, "tokens generated when a request sets no max_tokens")
    step_base_ms: float = _knob(2.0, "fixed cost of every engine step")
    decode_ms_per_seq: float = _knob(0.3, "step cost per request in the batch")
    prefill_ms_per_token: float = _knob(0.05, "step cost per uncached prompt token computed")
    speed: float = _knob(1.0, "divides every simulated time (tests run faster)")

    def __post_init__(self) -> None:
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens",
                     "max_model_len", "default_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("step_base_ms", "decode_ms_per_seq", "prefill_ms_per_token"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.speed <= 0:
            raise ValueError(f"speed must be positive, got {self.speed}")
        if not self.served_model_name:
            raise ValueError("served_model_name must not be empty")

    def step_seconds(self, batch_size: int, prefill_tokens: int) -> float:
        """Simulated duration of one engine step."""
        ms = (self.step_base_ms + self.decode_ms_per_seq * batch_size
              + self.prefill_ms_per_token * prefill_tokens)
        return ms / 1000.0 / self.speed

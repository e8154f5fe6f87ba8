"""Every knob of the simulated replica, with defaults for a small, fast demo.

Each field doubles as a CLI flag (``--block-size`` for ``block_size``; help in
the field's metadata), so the config and the command line cannot drift apart.
"""
from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


def _knob(default: int | float | str, help: str, *aliases: str, low: float | None = None,
          exclusive: bool = False) -> Any:
    """A field with its CLI help and aliases, and its lowest value (``exclusive``: the value must exceed it)."""
    return field(default=default, metadata={"help": help, "aliases": aliases, "min": low, "exclusive": exclusive})


@dataclasses.dataclass(frozen=True, slots=True)
class FakeVllmConfig:
    served_model_name: str = _knob("tiny", "model name in /v1/models and responses")
    block_size: int = _knob(16, "tokens per KV block (prefix cache granularity)", low=1)
    num_blocks: int = _knob(4096, "KV blocks in the pool; fewer means more eviction and preemption", low=1)
    max_num_seqs: int = _knob(256, "most requests running in one engine step", low=1)
    max_num_batched_tokens: int = _knob(
        8192, "token budget of one engine step (longer prefills are chunked)", "--max-batched-tokens", low=1
    )
    max_model_len: int = _knob(32768, "longest prompt + completion accepted, in tokens", low=1)
    default_max_tokens: int = _knob(16, "tokens generated when a request sets no max_tokens", low=1)
    step_base_ms: float = _knob(2.0, "fixed cost of every engine step, ms", low=0)
    decode_ms_per_seq: float = _knob(0.3, "step cost per request in the batch, ms", low=0)
    prefill_ms_per_token: float = _knob(0.05, "step cost per uncached prompt token computed, ms", low=0)
    speed: float = _knob(1.0, "divides every simulated time (tests run faster)", low=0, exclusive=True)
    rl_routes: str = _knob("native", "RL routes served: native (vLLM 0.32's /pause, /resume, /update_weights, "
                           "/weight_info, ...) or legacy (a vLLM before them: /collective_rpc and "
                           "/reset_prefix_cache only)")

    def __post_init__(self) -> None:
        for knob in dataclasses.fields(self):
            low, value = knob.metadata["min"], getattr(self, knob.name)
            if low is not None and (value <= low if knob.metadata["exclusive"] else value < low):
                raise ValueError(f"{knob.name} must be {'>' if knob.metadata['exclusive'] else '>='} {low}, "
                                 f"got {value}")
        if not self.served_model_name:
            raise ValueError("served_model_name must not be empty")
        if self.rl_routes not in ("native", "legacy"):
            raise ValueError(f"rl_routes must be native or legacy, not {self.rl_routes!r}")

    def step_seconds(self, batch_size: int, prefill_tokens: int) -> float:
        """Simulated duration of one engine step."""
        ms = (self.step_base_ms + self.decode_ms_per_seq * batch_size
              + self.prefill_ms_per_token * prefill_tokens)
        return ms / 1000.0 / self.speed

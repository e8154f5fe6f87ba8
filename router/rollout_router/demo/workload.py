"""A multi-turn rollout workload: GRPO groups of agent conversations.

Every arm of the demo replays the same conversations (same seed), so the arms
differ only in routing. Each turn appends the model's answer and a tool result
to the context, as an agent trajectory does; output lengths are long-tailed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Turn:
    user_words: int  # the tool result / user message appended before this turn
    max_tokens: int  # the answer's length (the fake replica generates exactly this many)
    think_seconds: float  # tool latency before the next turn


@dataclass(frozen=True)
class Conversation:
    key: str
    prompt: str
    turns: tuple[Turn, ...]


def _words(rng: random.Random, n: int, vocabulary: int = 5000) -> str:
    return " ".join(f"w{rng.randrange(vocabulary)}" for _ in range(n))


def rollout(prompts: int, samples: int, seed: int = 0, turns: tuple[int, int] = (3, 7),
            prompt_words: tuple[int, int] = (300, 900), median_output: int = 48,
            max_output: int = 600) -> list[Conversation]:
    """``prompts`` x ``samples`` conversations; samples of one prompt share its prefix."""
    rng = random.Random(seed)
    conversations = []
    for p in range(prompts):
        prompt = _words(rng, rng.randint(*prompt_words))
        for s in range(samples):
            steps = tuple(
                Turn(user_words=rng.randint(30, 150),
                     max_tokens=min(max_output, max(4, int(rng.lognormvariate(0, 1.0) * median_output))),
                     think_seconds=rng.uniform(0.01, 0.08))
                for _ in range(rng.randint(*turns)))
            conversations.append(Conversation(f"traj-{p}-{s}-{seed}", prompt, steps))
    return conversations


def tool_text(conversation: Conversation, index: int) -> str:
    """Deterministic tool output for turn ``index`` of a conversation."""
    rng = random.Random(f"{conversation.key}/{index}")
    return _words(rng, conversation.turns[index].user_words)

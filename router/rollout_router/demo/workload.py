"""A small verl-shaped rollout: GRPO groups of ``tool_agent`` trajectories.

Shaped as verl's ``tool_agent`` loop sends them (docs/simulator.md, "The traffic verl sends"): every
context starts with one shared system prompt (template, tool schema) and the dataset's fixed
instruction; the ``samples`` trajectories of a prompt share its problem but each has its own key for
all its turns; a trajectory ends on a turn without a tool call or at ``max_turns``; a tool result is
cut to 256 characters in the middle, as verl cuts it. Every arm of a round replays the same
conversations (same seed); each round draws new ones, keys and text included, so no round hits
another round's cache (verl resets the prefix cache every step).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

MAX_TOOL_CHARS = 256  # verl rollout.yaml multi_turn.max_tool_response_length
SYSTEM = ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant. # Tools You may call one or more "
          "functions to assist with the user query. <tools> code_interpreter: run Python code and return its "
          "stdout. </tools> For each function call, return a json object within <tool_call></tool_call> tags.")
INSTRUCTION = ("Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.")


@dataclass(frozen=True)
class Turn:
    user_words: int  # words of the tool result appended after this turn (before the cap)
    max_tokens: int  # the answer's length (the fake replica generates exactly this many)
    think_seconds: float  # tool latency before the next turn


@dataclass(frozen=True)
class Conversation:
    key: str
    prompt: str
    turns: tuple[Turn, ...]


def _words(rng: random.Random, n: int, vocabulary: int = 5000) -> str:
    return " ".join(f"w{rng.randrange(vocabulary)}" for _ in range(n))


def _turns(rng: random.Random, max_turns: int, tool_call_p: float, median_output: int,
           max_output: int) -> tuple[Turn, ...]:
    """Turns until one makes no tool call (chance ``1 - tool_call_p``) or ``max_turns``."""
    out = []
    for _ in range(max_turns):
        out.append(Turn(user_words=rng.randint(20, 120),
                        max_tokens=min(max_output, max(4, int(rng.lognormvariate(0, 1.0) * median_output))),
                        think_seconds=rng.uniform(0.01, 0.05)))
        if rng.random() >= tool_call_p:
            break
    return tuple(out)


def rollout(prompts: int, samples: int, seed: int = 0, max_turns: int = 8, tool_call_p: float = 0.75,
            problem_words: tuple[int, int] = (60, 200), median_output: int = 48,
            max_output: int = 600) -> list[Conversation]:
    """``prompts`` x ``samples`` trajectories; all share the system prompt and instruction, siblings the problem."""
    rng = random.Random(seed)
    conversations = []
    for p in range(prompts):
        # the step number first: a later round's blocks never match an earlier round's (a reset cache)
        prompt = f"[step {seed}] {SYSTEM} {INSTRUCTION} {_words(rng, rng.randint(*problem_words))}"
        for s in range(samples):
            turns = _turns(rng, max_turns, tool_call_p, median_output, max_output)
            conversations.append(Conversation(f"traj-{seed}-{p}-{s}", prompt, turns))
    return conversations


def tool_text(conversation: Conversation, index: int) -> str:
    """Deterministic tool output for turn ``index``, cut to ``MAX_TOOL_CHARS`` in the middle as verl does."""
    rng = random.Random(f"{conversation.key}/{index}")
    text = _words(rng, conversation.turns[index].user_words)
    if len(text) > MAX_TOOL_CHARS:
        half = MAX_TOOL_CHARS // 2
        text = text[:half] + "...(truncated)..." + text[-half:]
    return text

"""vLLM V1's continuous-batching scheduler, minus the GPU: synchronous and clock-free.

``schedule`` plans one engine step (which requests compute how many tokens,
within the step's token budget); ``complete`` applies the plan once the step's
time has passed, sampling one token for every request whose known tokens are
all computed. The asyncio engine drives it in real time; tests drive it
directly.
"""
from __future__ import annotations

import dataclasses
import enum
from collections import deque

from .prefix_cache import Block, BlockPool, extend_hashes
from .tokens import output_word, word_id


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclasses.dataclass(slots=True, eq=False)
class Request:
    id: str
    tokens: list[int]  # the prompt, then every generated token
    num_prompt_tokens: int
    max_tokens: int
    num_computed: int = 0  # tokens whose KV is in ``blocks``
    blocks: list[Block] = dataclasses.field(default_factory=list)
    hashes: list[int] = dataclasses.field(default_factory=list)  # chained hash per full block of tokens
    num_registered: int = 0  # leading blocks already in the prefix cache
    num_cached_tokens: int | None = None  # prefix-cache hit when first scheduled
    num_preemptions: int = 0
    status: Status = Status.WAITING

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt_tokens

    @property
    def is_decoding(self) -> bool:
        """Only the last sampled token is left to compute (not a prefill or a recompute)."""
        return self.num_output > 0 and self.num_computed == len(self.tokens) - 1


@dataclasses.dataclass(slots=True)
class Step:
    scheduled: list[tuple[Request, int]] = dataclasses.field(default_factory=list)
    prefill_tokens: int = 0  # tokens computed by requests that are not plain decodes
    cache_queries: int = 0  # tokens looked up in the prefix cache (first admissions, as vLLM counts)
    cache_hits: int = 0
    preemptions: int = 0

    def add(self, request: Request, num_new: int) -> None:
        self.scheduled.append((request, num_new))
        if not request.is_decoding:
            self.prefill_tokens += num_new


class Scheduler:
    """FCFS admission, chunked prefill, and recompute-preemption of the newest request."""

    def __init__(self, pool: BlockPool, max_num_seqs: int, max_num_batched_tokens: int):
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.pool.block_size)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        needed = self.blocks_for(request.num_prompt_tokens + request.max_tokens)
        if needed > self.pool.num_blocks:
            raise ValueError(f"request needs {needed} KV blocks, the pool has {self.pool.num_blocks}")
        self.waiting.append(request)

    def abort(self, request: Request) -> bool:
        """Drop a waiting or running request and release its blocks; False if already done."""
        if request.status is Status.WAITING:
            self.waiting.remove(request)
        elif request.status is Status.RUNNING:
            self._release(request)
        else:
            return False
        request.status = Status.ABORTED
        return True

    def schedule(self) -> Step:
        step = Step()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(len(request.tokens) - request.num_computed, budget)
            if not self._grow(request, num_new, step):
                break  # the request preempted itself: it was the last one running
            step.add(request, num_new)
            budget -= num_new
            i += 1
        # Like vLLM, nothing new is admitted in a step that had to preempt.
        while (not step.preemptions and self.waiting and budget > 0
               and len(self.running) < self.max_num_seqs):
            admitted = self._admit(self.waiting[0], budget, step)
            if admitted is None:
                break
            budget -= admitted
        return step

    def complete(self, step: Step) -> list[tuple[Request, int]]:
        """Apply a scheduled step; returns the tokens sampled, in batch order."""
        sampled = []
        for request, num_new in step.scheduled:
            if request.status is not Status.RUNNING:
                continue  # aborted while the step ran
            request.num_computed += num_new
            self._register_full_blocks(request)
            if request.num_computed < len(request.tokens):
                continue  # a chunked prefill goes on next step
            token = word_id(output_word(request.num_prompt_tokens, request.num_output))
            request.tokens.append(token)
            sampled.append((request, token))
            if request.num_output >= request.max_tokens:
                self._release(request)
                request.status = Status.FINISHED
        return sampled

    def _grow(self, request: Request, num_new: int, step: Step) -> bool:
        """Give a running request the blocks for ``num_new`` more tokens, preempting if needed."""
        needed = self.blocks_for(request.num_computed + num_new) - len(request.blocks)
        while not self.pool.can_allocate(needed):
            victim = self.running.pop()
            self._preempt(victim)
            step.preemptions += 1
            if victim is request:
                return False
        request.blocks += self.pool.allocate(needed)
        return True

    def _admit(self, request: Request, budget: int, step: Step) -> int | None:
        """Move the head of the queue to running, reusing its cached prefix; None if it does not fit."""
        extend_hashes(request.hashes, request.tokens, self.pool.block_size)
        # At least one token is always computed, to have something to sample from.
        hit = self.pool.cached_prefix(request.hashes[:(len(request.tokens) - 1) // self.pool.block_size])
        num_cached = len(hit) * self.pool.block_size
        num_new = min(len(request.tokens) - num_cached, budget)
        needed = self.blocks_for(num_cached + num_new) - len(hit)
        # Like vLLM (scheduler_reserve_full_isl, on by default), admit only if the whole prompt
        # fits, not just its first chunk: a half-admitted prompt would be preempted again.
        if not self.pool.can_allocate(self.blocks_for(len(request.tokens)) - len(hit), hit):
            return None
        self.pool.touch(hit)
        request.blocks = hit + self.pool.allocate(needed)
        request.num_computed, request.num_registered = num_cached, len(hit)
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_cached
        if not request.num_preemptions:  # vLLM counts a re-admission after preemption apart, not here
            step.cache_queries += len(request.tokens)
            step.cache_hits += num_cached
        self.waiting.popleft()
        self.running.append(request)
        request.status = Status.RUNNING
        step.add(request, num_new)
        return num_new

    def _register_full_blocks(self, request: Request) -> None:
        full = request.num_computed // self.pool.block_size
        extend_hashes(request.hashes, request.tokens, self.pool.block_size)
        for j in range(request.num_registered, full):
            self.pool.cache(request.blocks[j], request.hashes[j])
        request.num_registered = full

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: drop the KV (its blocks stay cached) and requeue first."""
        self.pool.free(request.blocks)
        request.blocks = []
        request.num_computed = request.num_registered = 0
        request.num_preemptions += 1
        request.status = Status.WAITING
        self.waiting.appendleft(request)

    def _release(self, request: Request) -> None:
        self.running.remove(request)
        self.pool.free(request.blocks)
        request.blocks = []

"""The engine loop: runs the scheduler in simulated real time and streams tokens out.

One asyncio task per server plans a step, sleeps for the step's simulated
duration (see ``FakeVllmConfig.step_seconds``), applies it and hands each
sampled token to its request's stream. With nothing to do it waits on an
event, so an idle server costs no CPU.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools

from .config import FakeVllmConfig
from .metrics import Metrics
from .prefix_cache import BlockPool
from .scheduler import Request, Scheduler, Status, Step
from .tokens import weights_shift

# Timer overshoot the step clock may win back on later steps, so a busy
# engine's average step time is right even with a millisecond-grained timer.
_CATCH_UP = 0.005


@dataclasses.dataclass(eq=False)
class Stream:
    """One request's sampled tokens, as the engine produces them; ends when it finishes."""

    request: Request
    finish_reason: str  # "length" when the client set max_tokens, else "stop" (an EOS); "abort" once aborted
    arrival: float
    seed: int = 0  # what the output text is drawn from: the prompt length, shifted by the loaded weights
    queue: asyncio.Queue[int | None] = dataclasses.field(default_factory=asyncio.Queue)

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> int:
        token = await self.queue.get()
        if token is None:
            raise StopAsyncIteration
        return token


class Engine:
    def __init__(self, config: FakeVllmConfig, metrics: Metrics):
        self.config = config
        self.metrics = metrics
        self.pool = BlockPool(config.num_blocks, config.block_size)
        self.scheduler = Scheduler(self.pool, config.max_num_seqs, config.max_num_batched_tokens)
        self._streams: dict[Request, Stream] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._thawed = asyncio.Event()  # cleared while a keep-mode pause freezes the requests in flight
        self._thawed.set()
        self.weights = ""  # the path weights were last reloaded from ("": the ones it started with)
        self.weight_version = "default"  # vLLM's weight_version before any update
        metrics.bind(
            running=lambda: len(self.scheduler.running),
            waiting=lambda: len(self.scheduler.waiting),
            kv_cache_usage=lambda: self.pool.usage,
        )

    def submit(self, prompt: list[int], max_tokens: int | None) -> Stream:
        """Queue a request; ``None`` generates the default length and finishes with "stop"."""
        request = Request(
            id=str(next(self._ids)), tokens=list(prompt), num_prompt_tokens=len(prompt),
            max_tokens=self.config.default_max_tokens if max_tokens is None else max_tokens,
        )
        self.scheduler.add(request)
        stream = Stream(request, "stop" if max_tokens is None else "length", asyncio.get_running_loop().time(),
                        len(prompt) + weights_shift(self.weights))
        self._streams[request] = stream
        self._wake.set()
        return stream

    def abort(self, stream: Stream) -> None:
        """Stop a request that has not finished; no-op otherwise.

        Its stream ends (a reader still waiting on it, as after an out-of-band
        gRPC ``Abort``, sees the end; ``stream.request.status`` says ABORTED).
        """
        if self.scheduler.abort(stream.request):
            del self._streams[stream.request]
            stream.queue.put_nowait(None)
            self.metrics.request_finished("abort")

    def running(self) -> int:
        """Requests not finished yet (a wait-mode ``/pause`` answers once there are none)."""
        return len(self._streams)

    def abort_all(self) -> int:
        """vLLM's ``/abort_requests`` without ids: every unfinished request ends with finish_reason "abort"."""
        streams = list(self._streams.values())
        for stream in streams:
            stream.finish_reason = "abort"
            self.abort(stream)
        return len(streams)

    def freeze(self) -> None:
        """vLLM's ``/pause?mode=keep``: no step runs until ``thaw``; the requests in flight keep their blocks."""
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``/reset_prefix_cache``: forget every cached block; False (nothing reset) while any is held."""
        if not self.pool.reset():
            return False
        self.metrics.prefix_cache_resets.inc()
        return True

    async def run(self) -> None:
        """Forever: plan a step, sleep through its simulated duration, deliver its tokens."""
        loop = asyncio.get_running_loop()
        clock = loop.time()
        while True:
            if not self._thawed.is_set():
                await self._thawed.wait()
                clock = loop.time()
            step = self.scheduler.schedule() if self.scheduler.has_work() else None
            if step is None or not step.scheduled:  # idle: wait for a submit
                self._wake.clear()
                await self._wake.wait()
                clock = loop.time()
                continue
            self._record(step)
            now = loop.time()
            clock = max(clock, now - _CATCH_UP) + self.config.step_seconds(
                len(step.scheduled), step.prefill_tokens)
            await asyncio.sleep(clock - now)
            self._deliver(self.scheduler.complete(step), loop.time())

    def _record(self, step: Step) -> None:
        self.metrics.prefix_cache_queries.inc(step.cache_queries)
        self.metrics.prefix_cache_hits.inc(step.cache_hits)
        self.metrics.num_preemptions.inc(step.preemptions)

    def _deliver(self, sampled: list[tuple[Request, int]], now: float) -> None:
        for request, token in sampled:
            stream = self._streams[request]
            if request.num_output == 1:
                self.metrics.prompt_tokens.inc(request.num_prompt_tokens)
                self.metrics.time_to_first_token.observe(now - stream.arrival)
            self.metrics.generation_tokens.inc()
            stream.queue.put_nowait(token)
            if request.status is Status.FINISHED:
                stream.queue.put_nowait(None)
                del self._streams[request]
                self.metrics.request_finished(stream.finish_reason)

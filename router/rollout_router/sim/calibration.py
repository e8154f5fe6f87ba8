"""Replay one multi-turn workload on the replica model and on fake-vllm's scheduler, step by step.

The differential test (tests/realvllm/test_differential.py) runs a workload on a real vLLM
server whose scheduler writes down every decision, then replays the same arrivals here and
compares. Steps are vLLM's engine steps (``schedule()`` calls), numbered from 1. A request
"arrives at tag a" when it enters the waiting queue after a steps, so step a + 1 can admit it.
Arrivals are closed-loop, as a client's are: a session's first turn arrives at a fixed tag; each
later turn arrives ``gap`` steps after the step that produced its previous turn's last token, with
the tags and gaps measured on the real server. Every run yields the same record (``Run``), so
the three can be compared event by event.
"""
from __future__ import annotations

import bisect
import dataclasses
import heapq
import random
from collections.abc import Iterable

from rollout_router.fakevllm.prefix_cache import BlockPool as FakePool
from rollout_router.fakevllm.scheduler import Request as FakeRequest
from rollout_router.fakevllm.scheduler import Scheduler as FakeScheduler
from rollout_router.fakevllm.scheduler import Status

from .replica import WAITING, Replica, Req

Key = tuple[int, int]  # (session, turn)


@dataclasses.dataclass(frozen=True)
class Workload:
    """Sessions of fixed-length turns: turn k's prompt is turn k-1's prompt, its answer and ``user`` new tokens."""

    sessions: int
    turns: int
    prompt: int  # first turn's prompt tokens
    output: int  # tokens generated per turn (ignore_eos)
    user: int  # new tokens each later turn adds after the previous answer

    def context(self, turn: int) -> int:
        return self.prompt + turn * (self.output + self.user)

    def first_prompt(self, session: int) -> list[int]:
        rng = random.Random(1000 + session)
        return [rng.randrange(3, 500) for _ in range(self.prompt)]

    def user_tokens(self, session: int, turn: int) -> list[int]:
        rng = random.Random(100_000 + 1000 * session + turn)
        return [rng.randrange(3, 500) for _ in range(self.user)]

    def key_of(self, prompt_len: int, head: list[int]) -> Key:
        """Which (session, turn) a request is, from its prompt's length and first tokens."""
        turn, rest = divmod(prompt_len - self.prompt, self.output + self.user)
        sessions = [s for s in range(self.sessions) if self.first_prompt(s)[:len(head)] == head]
        if rest or len(sessions) != 1 or not 0 <= turn < self.turns:
            raise ValueError(f"a request of {prompt_len} tokens starting {head} is not part of the workload")
        return sessions[0], turn


@dataclasses.dataclass(frozen=True)
class EngineShape:
    """What all three engines share. ``num_blocks`` counts usable blocks (vLLM keeps one more, its null block)."""

    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int


@dataclasses.dataclass(frozen=True)
class Arrivals:
    first: dict[int, int]  # session -> tag of its first turn
    gap: dict[Key, int]  # (session, turn >= 1) -> steps after the previous turn's last token
    # Turns due at the same step reach the waiting queue in this order (vLLM's own order of arrival, read
    # from its trace: two sessions whose turns come due together were added in wall-clock order, not by
    # session number); without it, by session.
    order: dict[Key, int] = dataclasses.field(default_factory=dict)

    def rank(self, key: Key) -> int:
        return self.order.get(key, key[0])

    def first_turns(self) -> list[tuple[int, int, Key]]:
        return sorted((tag, self.rank((s, 0)), (s, 0)) for s, tag in self.first.items())


@dataclasses.dataclass
class Run:
    """What one engine did with the workload, in the order it happened."""

    arrivals: list[tuple[int, Key]] = dataclasses.field(default_factory=list)  # (tag, key)
    admissions: list[tuple[int, Key, int, int, bool]] = dataclasses.field(default_factory=list)  # step, key, hit, tokens, resumed
    preemptions: list[tuple[int, Key]] = dataclasses.field(default_factory=list)
    finishes: list[tuple[int, Key]] = dataclasses.field(default_factory=list)
    steps: int = 0

    def counters(self) -> dict[str, int]:
        """vLLM's prefix-cache counters: a resumed (preempted) request's lookup is kept apart."""
        new = [a for a in self.admissions if not a[4]]
        resumed = [a for a in self.admissions if a[4]]
        return {"queries": sum(a[3] for a in new), "hits": sum(a[2] for a in new),
                "preempted_queries": sum(a[3] for a in resumed), "preempted_hits": sum(a[2] for a in resumed),
                "preemptions": len(self.preemptions)}

    def turn_order(self) -> list[list[Key]]:
        """Per turn, the sessions in the order their turn finished (ties by session)."""
        by_turn: dict[int, list[tuple[int, int]]] = {}
        for step, (s, k) in self.finishes:
            by_turn.setdefault(k, []).append((step, s))
        return [[(s, k) for _, s in sorted(by_turn[k])] for k in sorted(by_turn)]


class _Closed:
    """The closed loop: arrivals due by tag; a finished turn schedules the session's next one."""

    def __init__(self, workload: Workload, arrivals: Arrivals, run: Run):
        self.workload, self.arrivals, self.run = workload, arrivals, run
        self.heap = arrivals.first_turns()
        heapq.heapify(self.heap)

    def pop_due(self, steps_done: int, idle: bool) -> list[Key]:
        """Arrivals with tag <= steps_done; an idle engine takes the next ones whenever they come."""
        if idle and self.heap and self.heap[0][0] > steps_done:
            steps_done = self.heap[0][0]
        keys = []
        while self.heap and self.heap[0][0] <= steps_done:
            tag, _, key = heapq.heappop(self.heap)
            self.run.arrivals.append((tag, key))
            keys.append(key)
        return keys

    def next_tag(self) -> float:
        return self.heap[0][0] if self.heap else float("inf")

    def finished(self, step: int, key: Key) -> None:
        self.run.finishes.append((step, key))
        s, k = key
        if k + 1 < self.workload.turns:
            turn = (s, k + 1)
            heapq.heappush(self.heap, (step + self.arrivals.gap[turn], self.arrivals.rank(turn), turn))


class _UnitCost:
    """Every engine step takes one time unit, so simulated time counts steps."""

    def step_time(self, tokens: int, ctx_read: float, attn_pairs: float) -> float:
        return 1.0

    def decode_run(self, batch: int, ctx_sum: float, k: int) -> float:
        return float(k)

    def decode_steps_within(self, batch: int, ctx_sum: float, k: int, elapsed: float) -> int:
        return min(k, int(elapsed))


def replay_replica(workload: Workload, shape: EngineShape, arrivals: Arrivals) -> Run:
    """The simulator's replica model (``sim.replica.Replica``), driven exactly as the fleet drives it."""
    run = Run()
    loop = _Closed(workload, arrivals, run)
    rep = Replica("calibration", _UnitCost(), shape.num_blocks, shape.block_size,  # type: ignore[arg-type]
                  shape.max_num_seqs, shape.max_num_batched_tokens)
    keys: dict[int, Key] = {}
    serial = 0

    def add(key: Key) -> bool:
        nonlocal serial
        s, k = key
        ctx = workload.context(k)
        fresh = ctx if k == 0 else workload.output + workload.user
        req = Req(None, serial, ctx, workload.output, gid=-1, tid=s, P=0, fresh=fresh)
        keys[serial] = key
        serial += 1
        return rep.add(req)

    t, end = 0, None
    while loop.heap or rep.running or rep.waiting:
        if end is None:
            for key in loop.pop_due(t, idle=not rep.running and not rep.waiting):
                add(key)
            waiting = list(rep.waiting)
            before = {r.serial: (r.hit, r.query) for r in waiting}
            running = {r.serial: r.preemptions for r in rep.running}
            end = rep.start(float(t))
            for r in waiting:
                if r.phase != WAITING:
                    hit, query = before[r.serial]
                    run.admissions.append((t + 1, keys[r.serial], r.hit - hit, r.query - query, r.preemptions > 0))
            run.preemptions += [(t + 1, keys[r.serial]) for r in rep.waiting
                                if r.serial in running and r.preemptions > running[r.serial]]
            continue
        tag = loop.next_tag()
        if tag < end:  # arrives while a run of decode steps is in flight: admissible from step tag + 1
            for key in loop.pop_due(int(tag), idle=False):
                if add(key):
                    cut = rep.interrupt(tag - 0.5)
                    end = cut if cut is not None else end
            continue
        t = int(round(end))
        for req in rep.finish(float(t)):
            loop.finished(t, keys[req.serial])
        end = None
    run.steps = rep.it
    return run


def replay_fake(workload: Workload, shape: EngineShape, arrivals: Arrivals) -> Run:
    """fake-vllm's scheduler (``fakevllm.scheduler.Scheduler``), one ``schedule``/``complete`` per step."""
    run = Run()
    loop = _Closed(workload, arrivals, run)
    sched = FakeScheduler(FakePool(shape.num_blocks, shape.block_size), shape.max_num_seqs,
                          shape.max_num_batched_tokens)
    keys: dict[str, Key] = {}
    answers: dict[Key, list[int]] = {}
    prompts: dict[Key, list[int]] = {}
    step = 0
    while loop.heap or sched.has_work():
        for s, k in loop.pop_due(step, idle=not sched.has_work()):
            tokens = workload.first_prompt(s) if k == 0 else (
                prompts[(s, k - 1)] + answers[(s, k - 1)] + workload.user_tokens(s, k))
            prompts[(s, k)] = tokens
            req = FakeRequest(id=f"{s}-{k}", tokens=list(tokens), num_prompt_tokens=len(tokens),
                              max_tokens=workload.output)
            keys[req.id] = (s, k)
            sched.add(req)
        waiting = list(sched.waiting)
        preempted_before = {r.id: r.num_preemptions for r in sched.running}
        plan = sched.schedule()
        step += 1
        run.admissions += [(step, keys[r.id], r.num_computed, len(r.tokens), r.num_preemptions > 0)
                           for r in waiting if r.status is Status.RUNNING]
        run.preemptions += [(step, keys[r.id]) for r in sched.waiting
                            if r.id in preempted_before and r.num_preemptions > preempted_before[r.id]]
        sched.complete(plan)
        for req, _ in plan.scheduled:
            if req.status is Status.FINISHED and keys[req.id] not in answers:
                answers[keys[req.id]] = req.tokens[req.num_prompt_tokens:]
                loop.finished(step, keys[req.id])
    run.steps = step
    return run


def parse_vllm_trace(workload: Workload, events: Iterable[dict]) -> tuple[Run, Arrivals]:
    """The tracing scheduler's JSON lines as a ``Run``, and the arrivals they imply for a replay.

    vLLM's engine runs one empty step (nothing scheduled) after its last request finishes, before
    it idles; the models do not. Steps are renumbered without those, so numbers mean work done.
    """
    run = Run()
    keys: dict[str, Key] = {}
    added: dict[Key, int] = {}
    order: dict[Key, int] = {}
    finished: dict[Key, int] = {}
    events = list(events)
    empty = sorted(ev["step"] for ev in events if ev["ev"] == "step" and not ev["tokens"])
    for ev in events:
        if "step" in ev:
            ev = {**ev, "step": ev["step"] - bisect.bisect_right(empty, ev["step"])}
        if ev["ev"] == "add":
            key = workload.key_of(ev["prompt_len"], ev["head"])
            keys[ev["id"]] = key
            added[key] = ev["step"]
            order[key] = len(order)
            run.arrivals.append((ev["step"], key))
        elif ev["ev"] == "step" and ev["tokens"]:
            for rid, hit, tokens, resumed in ev["admitted"]:
                run.admissions.append((ev["step"], keys[rid], hit, tokens, resumed))
            run.preemptions += [(ev["step"], keys[rid]) for rid in ev["preempted"]]
            run.steps = max(run.steps, ev["step"])
        elif ev["ev"] == "done":
            for rid in ev["finished"]:
                run.finishes.append((ev["step"], keys[rid]))
                finished[keys[rid]] = ev["step"]
    first = {s: added[(s, 0)] for s in range(workload.sessions)}
    gap = {(s, k): added[(s, k)] - finished[(s, k - 1)]
           for s in range(workload.sessions) for k in range(1, workload.turns)}
    return run, Arrivals(first, gap, order)

"""The fleet: a discrete-event loop over replicas, driven by a router policy.

Events are (time, seq, kind, ...) on one heap; nothing sleeps. Every turn of
every trajectory is routed by calling ``policy.route(Request(...))`` on a
policy built by ``rollout_router.policy.registry.create`` -- the router's own
code, never a copy. The policy sees the router-local load (in-flight requests
per replica, or in-flight context tokens for the token-load arm, or the
context of every unfinished session last sent there for the footprint arm); a
request counts from routing until its last token, not while the trajectory
waits on a tool, exactly like verl's acquire/release. Tool calls run in a
fleet-wide sandbox of ``Preset.tool_slots`` concurrent calls (None: unbounded);
a call beyond them waits its turn, first come first served.
"""
from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from typing import Any

from rollout_router.policy import registry
from rollout_router.policy.base import Request

from .cost import CostModel
from .replica import Replica, Req
from .workload import BlockChainPrefix, Preset, Trajectory

STEP_END, ARRIVAL, TOOL_END = 0, 1, 2
LOADS = ("requests", "tokens", "footprint")


@dataclasses.dataclass(frozen=True)
class Arm:
    """One policy configuration under test."""

    label: str
    policy: str  # a registry name
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    load: str = "requests"  # or "tokens": in-flight context tokens per replica; or "footprint": the context of
    # every session last sent to the replica and not finished, idle ones (in a tool call) included
    group: bool = False  # send each trajectory's prompt group as the request's group key (GRPO siblings)

    def build(self):
        return registry.create(self.policy, **self.options)

    def described(self) -> dict[str, Any]:
        """The arm without its label, as a result-cache key; ``group`` only when set, so the results cached
        before the field existed keep their keys."""
        out = dataclasses.asdict(self)
        out.pop("label")
        if not self.group:
            out.pop("group")
        return out


@dataclasses.dataclass
class StepResult:
    step_seconds: float
    hit_tokens: int  # first admissions only, as vLLM's prefix_cache_hits/queries count
    query_tokens: int
    prefill_tokens: int
    recomputed_tokens: int
    preemptions: int
    requests: int
    moved: int  # turns routed to a different replica than the previous turn
    skew: float  # time-averaged max - min in-flight requests
    outcomes: dict[str, int]
    replica_busy: list[float]
    load_trace: list[tuple[float, tuple[int, ...]]] | None = None
    preempted_hit_tokens: int = 0  # re-admissions after a preemption (vLLM: PrefixCacheStats.preempted_*)
    preempted_query_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


def run_step(preset: Preset, trajs: list[Trajectory], arm: Arm, cost: CostModel, kv_tokens: int | None = None,
             block_size: int = 16, record: bool = False, check: bool = False, policy=None) -> StepResult:
    """Simulate one rollout step of ``trajs`` under ``arm``; the step ends with its last trajectory."""
    kv = kv_tokens if kv_tokens is not None else preset.kv_tokens
    names = [f"r{i:02d}" for i in range(preset.replicas)]
    reps = [Replica(nm, cost, kv // block_size, block_size, preset.max_num_seqs, preset.max_batched_tokens)
            for nm in names]
    index = {nm: i for i, nm in enumerate(names)}
    policy = policy if policy is not None else arm.build()
    if arm.load not in LOADS:
        raise ValueError(f"load must be one of {LOADS}, got {arm.load!r}")
    inflight = [0] * len(reps)
    tokload = [0] * len(reps)  # in-flight context tokens
    footprint = [0] * len(reps)  # context of unfinished sessions, by the replica each was last sent to
    signal = {"requests": inflight, "tokens": tokload, "footprint": footprint}[arm.load]
    slots = preset.tool_slots
    tools_running = 0
    tools_waiting: deque[Trajectory] = deque()
    heap: list[tuple] = []
    seq = 0
    for tr in trajs:  # the whole batch is submitted at t=0, as verl's agent loop does
        heap.append((0.0, seq, ARRIVAL, tr, 0))
        seq += 1
    heapq.heapify(heap)
    serial = 0
    moved = requests = 0
    skew_area, t_last, t_end = 0.0, 0.0, 0.0
    cur_skew = 0
    trace: list | None = [] if record else None
    route = policy.route
    on_release = getattr(policy, "on_release", None)  # sim.routers.RouterFleet tracks each router's own counts
    unfinished = len(trajs)

    def push_step(i: int, t: float | None) -> None:
        nonlocal seq
        if t is not None:
            heapq.heappush(heap, (t, seq, STEP_END, i, reps[i].ver))
            seq += 1

    def call_tool(tr: Trajectory, t: float) -> None:
        """``tr``'s tool call (its latency: ``tr.lats[tr.turn - 1]``) starts now if the sandbox has a slot."""
        nonlocal seq, tools_running
        latency = tr.lats[tr.turn - 1]
        if slots is None or latency <= 0:
            heapq.heappush(heap, (t + latency, seq, ARRIVAL, tr, 0))
        elif tools_running < slots:
            tools_running += 1
            heapq.heappush(heap, (t + latency, seq, TOOL_END, tr, 0))
        else:
            tools_waiting.append(tr)
            return
        seq += 1

    while heap:
        t, _, kind, obj, ver = heapq.heappop(heap)
        if kind == TOOL_END:  # its next turn arrives now; a waiting call takes the slot
            tools_running -= 1
            heapq.heappush(heap, (t, seq, ARRIVAL, obj, 0))
            seq += 1
            if tools_waiting:
                call_tool(tools_waiting.popleft(), t)
            continue
        if kind == STEP_END:
            rep = reps[obj]
            if ver != rep.ver or rep.cur is None:
                continue
            done = rep.finish(t)
            if done:
                skew_area += cur_skew * (t - t_last)
                t_last = t
                for req in done:
                    inflight[obj] -= 1
                    tokload[obj] -= req.traj.ctx
                    if on_release is not None:
                        on_release(names[obj], req.traj.key, t)
                    tr = req.traj
                    if tr.turn + 1 < len(tr.outs):
                        tr.ctx += tr.outs[tr.turn] + tr.tools[tr.turn]
                        tr.turn += 1
                        call_tool(tr, t)
                    else:
                        footprint[obj] -= tr.ctx  # the session ends (verl's adapter releases it)
                        tr.t_done = t
                        t_end = max(t_end, t)
                        unfinished -= 1
                cur_skew = max(inflight) - min(inflight)
                if trace is not None:
                    trace.append((t, tuple(inflight)))
            if check:
                rep.pool.check()
            push_step(obj, rep.start(t))
            continue
        # a turn arrives at the router
        tr = obj
        loads = dict(zip(names, signal))
        decision = route(Request(tr.key, loads, t, BlockChainPrefix(tr.gid, tr.tid, tr.P, tr.ctx // block_size, tr.S),
                                 f"g{tr.gid}" if arm.group else None))
        i = index[decision.replica]
        if tr.last is not None:
            footprint[tr.last] -= tr.ctx - tr.outs[tr.turn - 1] - tr.tools[tr.turn - 1]  # as counted last turn
            moved += tr.last != i
        footprint[i] += tr.ctx
        tr.last = i
        skew_area += cur_skew * (t - t_last)
        t_last = t
        inflight[i] += 1
        tokload[i] += tr.ctx
        cur_skew = max(inflight) - min(inflight)
        if trace is not None:
            trace.append((t, tuple(inflight)))
        fresh = tr.ctx if tr.turn == 0 else tr.outs[tr.turn - 1] + tr.tools[tr.turn - 1]
        req = Req(tr, serial, tr.ctx, tr.outs[tr.turn], tr.gid, tr.tid, tr.P, fresh, tr.S)
        serial += 1
        requests += 1
        rep = reps[i]
        if rep.add(req):
            push_step(i, rep.interrupt(t))
        elif rep.idle:
            push_step(i, rep.start(t))
    if unfinished:
        raise RuntimeError(f"{unfinished} trajectories never finished")
    outcomes = {**policy.counters.by_outcome(), "evicted_lru": policy.counters.evicted_lru}
    return StepResult(
        step_seconds=t_end,
        hit_tokens=sum(r.hit_tokens for r in reps),
        query_tokens=sum(r.query_tokens for r in reps),
        prefill_tokens=sum(r.prefill_tokens for r in reps),
        recomputed_tokens=sum(r.recomputed_tokens for r in reps),
        preemptions=sum(r.preemptions for r in reps),
        requests=requests,
        moved=moved,
        skew=skew_area / t_end if t_end else 0.0,
        outcomes=outcomes,
        replica_busy=[r.busy_time for r in reps],
        load_trace=trace,
        preempted_hit_tokens=sum(r.preempted_hit_tokens for r in reps),
        preempted_query_tokens=sum(r.preempted_query_tokens for r in reps),
    )

"""One vLLM V1 engine: continuous batching, chunked prefill, prefix cache, recompute preemption.

Each engine step schedules every decoding request first (one token each), then
fills ``max_num_batched_tokens`` with prefill chunks: running requests still
prefilling, then waiting requests in FCFS order (only if nothing was preempted
this step, and while ``max_num_seqs`` allows). A request's prefix-cache hit is
looked up when it leaves the waiting queue, after the running requests' blocks
for this step are allocated, and it is admitted only if its whole context fits.
When the pool cannot grow a running request, the most recently admitted request
is preempted by recompute: its blocks are freed (cached blocks stay hashed until
evicted) and it goes back to the head of the waiting queue with every token it
has so far. Hits are counted as vLLM counts them: a re-admission after a
preemption apart from first admissions. tests/realvllm/test_differential.py
checks all of this step by step against vLLM's own scheduler.

A step with any prefill is simulated on its own. Between such steps the batch
is fixed until a request finishes, a block allocation would fail, or a request
arrives that could be admitted, so the engine jumps over that whole run of
decode steps at once (``CostModel.decode_run``); per-sequence work happens only
at those events, never per token. Each decoding request is stored as
``tokens = offset + it`` (``it`` = engine step counter), so the batch's context
sum and block needs over k steps are O(block_size) sums.
"""
from __future__ import annotations

import heapq
from collections import deque

from .cost import CostModel
from .kvcache import BlockPool, Chain

WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3
SHARED = -(1 << 50)  # the chain id of the prefix every request shares (no group or trajectory id is negative)


class Req:
    """One turn of a trajectory, as an engine request."""

    __slots__ = (
        "traj", "serial", "ctx", "remaining", "computed", "phase", "gid", "tid", "P", "S",
        "schain", "gchain", "tchain", "off", "fin_it", "growth0", "fresh",
        "hit", "query", "preemptions",
    )

    def __init__(self, traj, serial: int, ctx: int, out: int, gid: int, tid: int, P: int, fresh: int, S: int = 0):
        """``P`` full blocks precede the trajectory's own chain: the first ``S`` of them are the fleet-wide
        shared prefix (system prompt, instruction, tool schema: one chain every request shares), the rest the
        group's prompt."""
        self.traj, self.serial = traj, serial
        self.ctx, self.remaining, self.computed = ctx, out, 0
        self.phase = WAITING
        self.gid, self.tid, self.P, self.S = gid, tid, P, S
        self.schain: Chain | None = None
        self.gchain: Chain | None = None
        self.tchain: Chain | None = None
        self.off = self.fin_it = self.growth0 = 0
        self.fresh = fresh
        self.hit = self.query = self.preemptions = 0


class Replica:
    def __init__(self, name: str, cost: CostModel, num_blocks: int, block_size: int = 16,
                 max_num_seqs: int = 1024, max_batched_tokens: int = 22528):
        self.name, self.cost = name, cost
        self.bs = block_size
        self.max_num_seqs, self.max_batched_tokens = max_num_seqs, max_batched_tokens
        self.pool = BlockPool(num_blocks, block_size)
        self.running: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.it = 0
        self.dec_n = 0
        self.dec_off = 0
        self.hist = [0] * block_size  # decoding requests by offset % block_size
        self.fin: list[tuple[int, int, Req]] = []
        self.cur: tuple | None = None  # the step(s) in flight
        self.pre_allocated = 0  # decode growth of the step in flight's first step, allocated at its start
        self.ver = 0
        # statistics
        self.hit_tokens = self.query_tokens = self.prefill_tokens = self.recomputed_tokens = 0
        self.preempted_hit_tokens = self.preempted_query_tokens = 0  # re-admissions after preemption
        self.preemptions = 0
        self.busy_time = 0.0

    # -- block arithmetic ----------------------------------------------------
    def _need(self, k: int) -> int:
        """New blocks the decoding requests need over the next ``k`` steps."""
        bs, it, total = self.bs, self.it, 0
        for r, n in enumerate(self.hist):
            if n:
                off = (bs - (r + it) % bs) % bs
                if off < k:
                    total += n * (1 + (k - 1 - off) // bs)
        return total

    def _traj_blocks(self, tokens: int, P: int) -> int:
        return max(0, -(-tokens // self.bs) - P)

    # -- the fleet's interface -------------------------------------------------
    @property
    def idle(self) -> bool:
        return self.cur is None

    def add(self, req: Req) -> bool:
        """Queue a request; True if a decode run in flight should be cut short to admit it."""
        could_admit = not self.waiting and len(self.running) < self.max_num_seqs
        self.waiting.append(req)
        return could_admit and self.cur is not None and self.cur[0] == "decode"

    def interrupt(self, now: float) -> float | None:
        """End the decode run in flight at the first step boundary after ``now``."""
        assert self.cur is not None, "interrupt() only while a step is in flight"
        kind, t0, k, batch, ctx_sum = self.cur
        done = self.cost.decode_steps_within(batch, ctx_sum, k, now - t0)
        if done + 1 >= k:
            return None
        self.cur = (kind, t0, done + 1, batch, ctx_sum)
        self.ver += 1
        return t0 + self.cost.decode_run(batch, ctx_sum, done + 1)

    def start(self, now: float) -> float | None:
        """Schedule the next step (or run of decode steps); returns when it ends, None if idle."""
        pool = self.pool
        preempted = False
        need1 = self._need(1)
        while need1 > pool.available() and self.running:
            self._preempt(self.running[-1])
            preempted = True
            need1 = self._need(1)
        budget = self.max_batched_tokens - self.dec_n
        chunks: list[tuple[Req, int]] = []
        for req in [r for r in self.running if r.phase == PREFILL]:
            if budget <= 0:
                break
            if req.phase != PREFILL:  # preempted earlier in this loop
                continue
            n = min(req.ctx - req.computed, budget)
            assert req.tchain is not None  # admitted requests hold their chain
            grow = self._traj_blocks(req.computed + n, req.P) - req.tchain.cached
            while grow > pool.available() - need1 and req.phase == PREFILL:
                self._preempt(self.running[-1])
                preempted = True
                need1 = self._need(1)
            if req.phase != PREFILL:
                break
            if grow > 0:
                pool.grow(req.tchain, grow)
            chunks.append((req, n))
            budget -= n
        # vLLM allocates every running request's slots before it looks up a waiting request's
        # prefix, so this step's decode growth evicts cached blocks first.
        pool.allocate_pending(need1)
        self.pre_allocated = need1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                n = self._admit(self.waiting[0], budget)
                if not n:
                    break
                req = self.waiting.popleft()
                self.running.append(req)
                chunks.append((req, n))
                budget -= n
        dec_ctx = self.dec_off + self.dec_n * self.it
        if chunks:
            tokens, read, pairs = self.dec_n, dec_ctx, float(dec_ctx)
            for req, n in chunks:
                tokens += n
                read += req.computed + n
                pairs += n * (req.computed + n / 2)
            dt = self.cost.step_time(tokens, read, pairs)
            self.cur = ("mixed", now, chunks)
        elif self.dec_n:
            fin = self.fin
            while fin[0][2].phase != DECODE or fin[0][2].fin_it != fin[0][0]:
                heapq.heappop(fin)
            k = fin[0][0] - self.it
            avail = pool.available() + need1  # the first step's growth is already allocated
            if self._need(k) > avail:
                lo, hi = 1, k - 1
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if self._need(mid) <= avail:
                        lo = mid
                    else:
                        hi = mid - 1
                k = lo
            dt = self.cost.decode_run(self.dec_n, dec_ctx, k)
            self.cur = ("decode", now, k, self.dec_n, dec_ctx)
        else:
            if preempted and self.waiting:  # everything was preempted: admit afresh next pass
                return self.start(now)
            if self.waiting and not self.running:
                raise MemoryError(f"{self.name}: a {self.waiting[0].ctx}-token request does not fit the KV pool")
            self.cur = None
            return None
        self.ver += 1
        return now + dt

    def finish(self, now: float) -> list[Req]:
        """Commit the step(s) in flight at time ``now``; returns the requests that finished."""
        cur, self.cur = self.cur, None
        assert cur is not None, "finish() only while a step is in flight"
        self.busy_time += now - cur[1]
        done: list[Req] = []
        if cur[0] == "decode":
            self.pool.allocate_pending(self._need(cur[2]) - self.pre_allocated)
            self.it += cur[2]
        else:
            self.it += 1
            for req, n in cur[2]:
                req.computed += n
                self.prefill_tokens += n
                if req.computed >= req.ctx:
                    req.remaining -= 1
                    if req.remaining <= 0:
                        self.running.remove(req)
                        self._release(req, req.computed)
                        done.append(req)
                    else:
                        self._to_decode(req)
        fin, it = self.fin, self.it
        while fin and fin[0][0] <= it:
            _, _, req = heapq.heappop(fin)
            if req.phase != DECODE or req.fin_it > it:
                continue
            self._leave_decode(req)
            self.running.remove(req)
            self._release(req, req.off + it)
            done.append(req)
        for req in done:
            req.phase = DONE
        return done

    # -- internals ---------------------------------------------------------------
    def _admit(self, req: Req, budget: int) -> int:
        pool, bs, P, S = self.pool, self.bs, req.P, req.S
        G = P - S  # the group prompt's own blocks
        sc = pool.cached(SHARED) if S else 0
        gc = pool.cached(req.gid) if G else 0
        tc = pool.cached(req.tid)
        hit_blocks = sc if sc < S else S + gc if gc < G else P + tc
        hit_blocks = min(hit_blocks, (req.ctx - 1) // bs)
        hit = hit_blocks * bs
        n = min(req.ctx - hit, budget)
        need_s = max(0, S - sc)
        need_g = max(0, G - gc)
        need_t = max(0, self._traj_blocks(hit + n, P) - tc)
        # vLLM admits a request only if its whole context fits, not just the first chunk
        # (SchedulerConfig.scheduler_reserve_full_isl, on by default).
        full_t = max(0, self._traj_blocks(req.ctx, P) - tc)
        cids = (*((SHARED,) if S else ()), *((req.gid,) if G else ()), req.tid)
        if need_s + need_g + full_t > pool.evictable_after_touch(*cids):
            return 0
        if S:
            req.schain = pool.acquire(SHARED)
            if req.schain.cached < S:
                pool.grow(req.schain, S - req.schain.cached)
        if G:
            req.gchain = pool.acquire(req.gid)
            if req.gchain.cached < G:
                pool.grow(req.gchain, G - req.gchain.cached)
        req.tchain = pool.acquire(req.tid)
        pool.grow(req.tchain, need_t)
        req.computed = hit
        req.phase = PREFILL
        req.hit += hit
        req.query += req.ctx
        # Counted as vLLM counts vllm:prefix_cache_queries/hits: a preempted request's re-admission
        # (which finds its own blocks still cached) is kept apart (PrefixCacheStats.preempted_*).
        if req.preemptions:
            self.preempted_hit_tokens += hit
            self.preempted_query_tokens += req.ctx
        else:
            self.hit_tokens += hit
            self.query_tokens += req.ctx
        self.recomputed_tokens += max(0, req.ctx - hit - req.fresh)
        req.fresh = 0  # after a preemption everything recomputed was computed before
        return n

    def _to_decode(self, req: Req) -> None:
        req.phase = DECODE
        req.off = req.computed - self.it
        req.fin_it = self.it + req.remaining
        req.growth0 = -(-req.computed // self.bs)
        self.dec_n += 1
        self.dec_off += req.off
        self.hist[req.off % self.bs] += 1
        heapq.heappush(self.fin, (req.fin_it, req.serial, req))

    def _leave_decode(self, req: Req) -> None:
        self.dec_n -= 1
        self.dec_off -= req.off
        self.hist[req.off % self.bs] -= 1

    def _release(self, req: Req, tokens: int) -> None:
        """Free a request's blocks; its full blocks stay cached."""
        pool = self.pool
        assert req.tchain is not None  # admitted requests hold their chain
        if req.phase == DECODE:
            pool.settle(req.tchain, -(-tokens // self.bs) - req.growth0)
        pool.release(req.tchain, max(0, tokens // self.bs - req.P))
        if req.gchain is not None:
            pool.release(req.gchain, req.P - req.S)
        if req.schain is not None:
            pool.release(req.schain, req.S)
        req.schain = req.gchain = req.tchain = None

    def _preempt(self, req: Req) -> None:
        self.running.remove(req)
        if req.phase == DECODE:
            tokens = req.off + self.it
            self._leave_decode(req)
            self._release(req, tokens)
            req.remaining = req.fin_it - self.it
            req.ctx = tokens + 1  # the last sampled token is recomputed too (vLLM's num_tokens)
        else:
            self._release(req, req.computed)
        req.computed = 0
        req.phase = WAITING
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

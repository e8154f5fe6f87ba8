"""A replica's paged KV pool with vLLM-style prefix caching, kept per block chain.

vLLM hashes every full block by (parent hash, tokens), so a request can reuse
only a cached *prefix* of its block chain. In an RL rollout every context is
one of two chains: a GRPO group's prompt (shared by the group's samples) and,
after it, one trajectory's own blocks (with the verl workload, a third chain
before both: the prefix every request shares; ``replica.Req.S``). The pool therefore tracks, per chain, how
many leading blocks are cached and how many requests hold it, instead of
hashing individual blocks:

* held chains (``refs > 0``) are in use and cannot be evicted;
* a released chain enters the LRU free queue as one segment; a request frees
  its blocks in reverse order, so its trajectory segment is queued before
  its prompt segment and each segment is evicted from its tail;
* allocation takes never-hashed free blocks first, then evicts from the head
  of the queue; a hit ("touch") takes the chain out of the queue.

Invariant (checked by ``check``): in_use + free_cached + free_uncached == num_blocks,
where in_use is the held chains' blocks plus decode growth not yet settled.
"""
from __future__ import annotations

from collections import deque


class Chain:
    __slots__ = ("cid", "cached", "refs", "ver")

    def __init__(self, cid: int):
        self.cid = cid
        self.cached = 0  # leading blocks of this chain present on the replica
        self.refs = 0  # running requests holding it
        self.ver = 0  # bumped whenever it leaves the free queue (lazy deletion)


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._empty()

    def _empty(self) -> None:
        self.chains: dict[int, Chain] = {}
        self.queue: deque[tuple[Chain, int]] = deque()
        self.in_use = 0
        self.free_cached = 0
        self.free_uncached = self.num_blocks
        self.pending = 0  # blocks handed to decoding requests, not yet booked on their chains

    # -- queries -----------------------------------------------------------
    def available(self) -> int:
        return self.free_uncached + self.free_cached

    def cached(self, cid: int) -> int:
        chain = self.chains.get(cid)
        return chain.cached if chain is not None else 0

    def evictable_after_touch(self, *cids: int) -> int:
        """Free blocks left for allocation once ``cids`` are taken out of the queue."""
        free = self.free_uncached + self.free_cached
        for cid in cids:
            chain = self.chains.get(cid)
            if chain is not None and chain.refs == 0:
                free -= chain.cached
        return free

    # -- mutations ---------------------------------------------------------
    def acquire(self, cid: int) -> Chain:
        """Hold chain ``cid`` (a hit "touches" its cached blocks out of the queue)."""
        chain = self.chains.get(cid)
        if chain is None:
            chain = self.chains[cid] = Chain(cid)
        if chain.refs == 0:
            chain.ver += 1
            self.free_cached -= chain.cached
            self.in_use += chain.cached
        chain.refs += 1
        return chain

    def allocate(self, n: int) -> None:
        """Take ``n`` free blocks (the caller checked ``available``), evicting LRU-first."""
        if n <= 0:
            return
        if n > self.free_uncached + self.free_cached:
            raise MemoryError(f"KV pool exhausted: need {n}, have {self.available()}")
        take = min(n, self.free_uncached)
        self.free_uncached -= take
        self.in_use += take
        n -= take
        queue = self.queue
        while n > 0:
            chain, ver = queue[0]
            if chain.ver != ver or chain.refs or chain.cached == 0:
                queue.popleft()
                continue
            x = min(n, chain.cached)
            chain.cached -= x
            self.free_cached -= x
            self.in_use += x
            n -= x
            if chain.cached == 0:
                queue.popleft()
                if chain.refs == 0:
                    del self.chains[chain.cid]

    def grow(self, chain: Chain, n: int) -> None:
        """Allocate ``n`` blocks and append them to a held chain."""
        self.allocate(n)
        chain.cached += n

    def allocate_pending(self, n: int) -> None:
        """Allocate decode growth for many requests at once; ``settle`` books it per chain."""
        self.allocate(n)
        self.pending += n

    def settle(self, chain: Chain, growth: int) -> None:
        """Book ``growth`` blocks of decode growth on a held chain before it is released."""
        self.pending -= growth
        chain.cached += growth

    def release(self, chain: Chain, keep: int) -> None:
        """Drop one hold; if it was the last, keep ``keep`` leading blocks cached, free the rest unhashed."""
        chain.refs -= 1
        if chain.refs:
            return
        keep = min(keep, chain.cached)
        drop = chain.cached - keep
        self.in_use -= chain.cached
        self.free_uncached += drop
        chain.cached = keep
        if keep:
            self.free_cached += keep
            chain.ver += 1
            self.queue.append((chain, chain.ver))
        else:
            del self.chains[chain.cid]

    def reset(self) -> None:
        """Sleep/wake between RL steps: the whole cache is dropped."""
        self._empty()

    def check(self) -> None:
        in_use = sum(c.cached for c in self.chains.values() if c.refs)
        free_cached = sum(c.cached for c in self.chains.values() if not c.refs)
        assert in_use + self.pending == self.in_use, (in_use, self.pending, self.in_use)
        assert free_cached == self.free_cached, (free_cached, self.free_cached)
        assert self.in_use + self.free_cached + self.free_uncached == self.num_blocks
        assert min(self.in_use, self.free_cached, self.free_uncached) >= 0

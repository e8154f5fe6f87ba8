"""A bounded pool of KV blocks with vLLM V1's automatic prefix caching.

A full block is identified by a hash chained with its parent block's hash, so
a block hit implies the whole prefix before it matches. Blocks held by
requests are pinned (``ref_cnt > 0``); released blocks join an LRU free queue
and keep their hash, so they can still be hit until a new allocation evicts
them from the head of that queue.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Sequence


@dataclasses.dataclass(slots=True, eq=False)
class Block:
    id: int
    ref_cnt: int = 0
    hash: int | None = None  # set once the block is full and registered in the cache


def extend_hashes(hashes: list[int], tokens: Sequence[int], block_size: int) -> None:
    """Append the chained hash of every full block of ``tokens`` not hashed yet."""
    parent = hashes[-1] if hashes else 0
    for start in range(len(hashes) * block_size, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start:start + block_size])))
        hashes.append(parent)


class BlockPool:
    """Every block is either pinned or in the free queue: ``num_free + num_used == num_blocks``."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, Block] = OrderedDict((b.id, b) for b in self.blocks)
        self._cached: dict[int, Block] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks pinned by requests (vLLM's ``kv_cache_usage_perc``)."""
        return self.num_used / self.num_blocks

    def free_order(self) -> list[int]:
        """Free block ids, next to be evicted first."""
        return list(self._free)

    def cached_prefix(self, hashes: Sequence[int]) -> list[Block]:
        """The cached blocks of the longest prefix of ``hashes``; nothing is pinned yet."""
        hit = []
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def can_allocate(self, num_new: int, hit: Iterable[Block] = ()) -> bool:
        """Whether ``num_new`` fresh blocks fit once the ``hit`` blocks are pinned."""
        reclaimed = sum(1 for block in hit if block.ref_cnt == 0)
        return num_new <= len(self._free) - reclaimed

    def touch(self, blocks: Iterable[Block]) -> None:
        """Pin cache-hit blocks, taking free ones out of the eviction queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.id]
            block.ref_cnt += 1

    def allocate(self, num_new: int) -> list[Block]:
        """Pin ``num_new`` blocks from the queue head, evicting their cached content."""
        if num_new > len(self._free):
            raise MemoryError(f"{num_new} blocks requested, {len(self._free)} free")
        blocks = []
        for _ in range(num_new):
            _, block = self._free.popitem(last=False)
            if block.hash is not None:
                del self._cached[block.hash]
                block.hash = None
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def cache(self, block: Block, block_hash: int) -> None:
        """Register a full block; a hash already cached by another block keeps that block."""
        if block.hash is None and block_hash not in self._cached:
            block.hash = block_hash
            self._cached[block_hash] = block

    def free(self, blocks: Sequence[Block]) -> None:
        """Unpin a request's blocks like vLLM's ``BlockPool.free_blocks``.

        Cached blocks join the queue's end tail first, so the request's prefix is evicted last;
        blocks never cached (a partial last block) go to the queue's head, to be reused first.
        """
        uncached = []
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.hash is None:
                    uncached.append(block)
                else:
                    self._free[block.id] = block
        for block in reversed(uncached):
            self._free[block.id] = block
            self._free.move_to_end(block.id, last=False)

    def reset(self) -> bool:
        """Forget every cached hash (vLLM's prefix-cache reset); refused (False) while a request holds blocks."""
        if self.num_used:
            return False
        for block in self.blocks:
            block.hash = None
        self._cached.clear()
        return True

    def check(self) -> None:
        """Assert the pool's invariants (for tests)."""
        assert self.num_free + sum(1 for b in self.blocks if b.ref_cnt > 0) == self.num_blocks
        assert all(b.ref_cnt == 0 for b in self._free.values())
        assert all(b.hash == h for h, b in self._cached.items())
        assert sum(1 for b in self.blocks if b.hash is not None) == len(self._cached)

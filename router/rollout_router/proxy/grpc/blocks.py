"""Header blocks decoded once per table state: a peer's repeated blocks recognised, not decoded again.

A gRPC peer sends nearly the same header blocks call after call (a replica's
response head and its ``grpc-status: 0`` trailers, a client's head when its
encoder indexes nothing new), and pure-Python ``hpack`` costs some 30 µs for
each. HPACK decoding is a pure function of the block's bytes and the decoder's
dynamic table (RFC 7541 2.3, 3): the same bytes decoded against the same table
give the same fields and leave the same table. So a block whose decoding left
the table exactly as it found it (no insertion, no eviction, no size change) is
remembered with its fields, and the next time the same bytes arrive while the
table is still in that state, the fields are reused without decoding.

The table's state is recognised by its newest entry *object* (held here, so its
identity cannot be reused), its length and its maximum size: entries are only
ever added at the front (each a new tuple) and evicted from the back, so no
insertion happened since while the front is the same object, and without one
only a size change can evict, which changes the length or the maximum size.
Only successful decodes are remembered; a block that fails is decoded (and
fails) every time. What is remembered is bounded per connection (``ENTRIES``
blocks of at most ``LARGEST`` bytes each).
"""
from __future__ import annotations

import hpack

from .guard import decoded_size

ENTRIES = 16  # blocks remembered per connection, the oldest forgotten first
LARGEST = 512  # bytes: a longer block is always decoded (remembering it would hold too much per connection)
Header = tuple[bytes, bytes]
_State = tuple[object, int, int]


class BlockDecoder:
    """``hpack.Decoder`` behind a memo of the blocks that leave its dynamic table as they found it."""

    __slots__ = ("_decoder", "_table", "_memo")

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size)
        self._table = self._decoder.header_table
        self._memo: dict[bytes, tuple[_State, list[Header], int]] = {}

    def _state(self) -> _State:
        """What identifies the dynamic table's contents (the module's docstring says why this is enough)."""
        entries = self._table.dynamic_entries
        return (entries[0] if entries else None, len(entries), self._table.maxsize)

    def decode(self, block: bytes) -> tuple[list[Header], int]:
        """The block's fields (a new list each time) and their decoded size (``guard.decoded_size``); raises what
        ``hpack.Decoder.decode`` raises."""
        state = self._state()
        known = self._memo.get(block)
        if known is not None and _same(known[0], state):
            return list(known[1]), known[2]
        headers: list[Header] = self._decoder.decode(block, raw=True)  # type: ignore[assignment]
        size = decoded_size(headers)
        if len(block) <= LARGEST and _same(self._state(), state):
            self._remember(block, (state, list(headers), size))
        return headers, size

    def _remember(self, block: bytes, entry: tuple[_State, list[Header], int]) -> None:
        memo = self._memo
        memo.pop(block, None)
        if len(memo) >= ENTRIES:
            del memo[next(iter(memo))]
        memo[block] = entry


def _same(a: _State, b: _State) -> bool:
    """The same table: the same newest entry object (identity, not equality), length and maximum size."""
    return a[0] is b[0] and a[1] == b[1] and a[2] == b[2]

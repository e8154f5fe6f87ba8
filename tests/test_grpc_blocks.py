"""Differential tests of the header block memo (proxy/grpc/blocks.py) against plain ``hpack``: the same fields,
the same errors and the same dynamic table after every block, whatever the blocks do to the table."""
from __future__ import annotations

import random

import hpack
import pytest

from rollout_router.proxy.grpc.blocks import ENTRIES, BlockDecoder
from rollout_router.proxy.grpc.guard import decoded_size

MAX_LIST = 64 * 1024


def _indexed(name: bytes, value: bytes) -> bytes:
    """A literal field with incremental indexing, new name, no Huffman (RFC 7541 6.2.1)."""
    return b"\x40" + bytes((len(name),)) + name + bytes((len(value),)) + value


def _size_update(size: int) -> bytes:
    """A dynamic table size update (6.3); sizes below 31 fit the prefix."""
    assert size < 31
    return bytes((0x20 | size,))


def _table(decoder: hpack.Decoder) -> tuple[list[tuple[bytes, bytes]], int]:
    return list(decoder.header_table.dynamic_entries), decoder.header_table.maxsize


def _both(blocks: list[bytes]) -> None:
    """Decode ``blocks`` in order with the memo and with plain hpack: identical answers and tables throughout."""
    memo, plain = BlockDecoder(MAX_LIST), hpack.Decoder(MAX_LIST)
    for block in blocks:
        try:
            expected: object = plain.decode(block, raw=True)
        except hpack.HPACKError as error:
            expected = type(error)
        try:
            got: object
            got, size = memo.decode(block)
            assert size == decoded_size(got)
        except hpack.HPACKError as error:
            got = type(error)
        assert got == expected
        assert _table(memo._decoder) == _table(plain)


def test_a_reference_to_the_table_follows_the_table() -> None:
    """The same bytes (index 62, the newest entry) decode to whatever the table holds now."""
    newest = b"\xbe"
    blocks = [_indexed(b"x-a", b"1"), newest, newest, _indexed(b"x-a", b"2"), newest, newest,
              _indexed(b"x-a", b"1"), newest]
    _both(blocks)
    memo = BlockDecoder(MAX_LIST)
    answers = [memo.decode(b)[0] for b in blocks]
    assert [a for a, b in zip(answers, blocks) if b == newest] == [[(b"x-a", b"1")]] * 2 + [[(b"x-a", b"2")]] * 2 + \
        [[(b"x-a", b"1")]]


def test_an_equal_newest_entry_is_not_the_same_table() -> None:
    """Eviction can leave a table of the same length whose newest entry equals the old one by value: [X, Y] then
    X inserted again is [X, X]; index 63 must say X, not the Y remembered."""
    size = len(b"x-a") + len(b"1") + 32
    blocks = [_indexed(b"x-b", b"y"), _indexed(b"x-a", b"1"), b"\xbf", b"\xbf"]
    memo, plain = BlockDecoder(MAX_LIST), hpack.Decoder(MAX_LIST)
    for decoder in (memo._decoder, plain):
        decoder.header_table.maxsize = 2 * size  # room for two entries: the third insertion evicts one
    for block in [*blocks, _indexed(b"x-a", b"1"), b"\xbf"]:
        assert memo.decode(block)[0] == plain.decode(block, raw=True)
        assert _table(memo._decoder) == _table(plain)


def test_size_updates_and_errors() -> None:
    """Blocks that resize the table, or fail, are decoded each time and end where plain hpack ends."""
    _both([_size_update(0), _size_update(0) + b"\x82", b"\x82", b"\xbe", b"\xbe", b"\x82", _size_update(0) + b"\x82",
           b"\x82\x20", b"\x82\x20", b"\x00", b"\x00", b"\x82"])


def test_the_memo_stays_bounded() -> None:
    memo = BlockDecoder(MAX_LIST)
    for index in range(3 * ENTRIES):
        memo.decode(b"\x00\x03x-a" + bytes((len(str(index)),)) + str(index).encode())
    assert len(memo._memo) == ENTRIES


@pytest.mark.parametrize("seed", range(20))
def test_random_traffic_from_an_indexing_encoder(seed: int) -> None:
    """hpack's own encoder (which indexes what it can, and signals table size changes), blocks repeated as a peer
    repeats its heads, some of them corrupted."""
    rng = random.Random(seed)
    encoder = hpack.Encoder()
    heads = [[(b":status", b"200"), (b"content-type", b"application/grpc")], [(b"grpc-status", b"0")],
             [(b":method", b"POST"), (b":path", b"/vllm.grpc.engine.VllmEngine/Generate"), (b"te", b"trailers")]]
    blocks: list[bytes] = []
    for _ in range(200):
        roll = rng.random()
        if roll < 0.1:
            encoder.header_table_size = rng.choice([0, 64, 256, 4096])
        if roll < 0.3:
            head = [(b"x-session-id", str(rng.randrange(40)).encode() * rng.randrange(1, 8))]
        else:
            head = rng.choice(heads)
        block = encoder.encode(head)
        if rng.random() < 0.05:
            block = block + bytes((rng.randrange(256),))
        blocks += [block] * rng.randrange(1, 4)
    _both(blocks)

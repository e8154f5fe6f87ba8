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


# The compiled HPACK decoder (_grpc_frames.HeaderDecoder) against plain hpack: the same fields, sizes, errors and
# dynamic table after every block.

def _compiled_decoder():
    from rollout_router.proxy.grpc import h2
    reason = h2.engine_unavailable()
    if reason is not None and reason != "ROLLOUT_ROUTER_GRPC_FRAMES=python":
        pytest.skip(reason)
    import importlib
    return importlib.import_module("rollout_router.proxy.grpc._grpc_frames").HeaderDecoder


def _against_hpack(blocks: list[bytes], max_list: int = MAX_LIST) -> int:
    """Decode ``blocks`` with both; how many failed (in both)."""
    compiled, plain = _compiled_decoder()(max_list), hpack.Decoder(max_list)
    failed = 0
    for block in blocks:
        try:
            expected: object = [tuple(h) for h in plain.decode(block, raw=True)]
        except hpack.HPACKError:
            expected = "error"
        try:
            got: object
            got, size = compiled.decode(block)
            assert size == decoded_size(got)  # type: ignore[arg-type]
            assert all(type(n) is bytes and type(v) is bytes for n, v in got)  # type: ignore[union-attr]
        except ValueError:
            got = "error"
        assert got == expected, block
        failed += got == "error"
        if got == "error":  # the connection ends on an error: a table after one is not compared, nor used
            compiled, plain = _compiled_decoder()(max_list), hpack.Decoder(max_list)
            continue
        assert compiled.table() == _table(plain)
    return failed


@pytest.mark.parametrize("seed", range(60))
def test_the_compiled_decoder_matches_hpack(seed: int) -> None:
    """Blocks from hpack's encoder (indexing, Huffman on and off, table size changes, sizes that evict), repeated,
    and corrupted: a byte changed, cut short, or random bytes appended."""
    rng = random.Random(seed)
    encoder = hpack.Encoder()
    blocks: list[bytes] = []
    for _ in range(150):
        if rng.random() < 0.1:
            encoder.header_table_size = rng.choice([0, 40, 64, 256, 1000, 4096])
        head = [(b":method", b"POST"), (b":path", b"/vllm.grpc.engine.VllmEngine/Generate")]
        head += [(f"x-{rng.randrange(30)}".encode(), bytes(rng.randrange(33, 127) for _ in range(rng.randrange(0, 90))))
                 for _ in range(rng.randrange(0, 6))]
        if rng.random() < 0.2:
            head.append((b"x-big", b"v" * rng.choice([3000, 4100, 5000])))
        block = encoder.encode(head, huffman=rng.random() < 0.7)
        roll = rng.random()
        if roll < 0.1 and block:
            block = bytearray(block)
            block[rng.randrange(len(block))] = rng.randrange(256)
            block = bytes(block)
        elif roll < 0.15:
            block = block[:rng.randrange(len(block) + 1)]
        elif roll < 0.2:
            block += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
        blocks += [block] * rng.randrange(1, 3)
    _against_hpack(blocks)


@pytest.mark.parametrize("seed", range(40))
def test_the_compiled_decoder_on_random_bytes(seed: int) -> None:
    """Bytes no encoder wrote (every representation, indexes past the table, Huffman padding and EOS, integers
    too long), and a small header list limit: whatever hpack accepts or refuses, so does the compiled decoder."""
    rng = random.Random(seed)
    blocks = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))) for _ in range(200)]
    blocks += [bytes((rng.choice([0x00, 0x10, 0x40]), 0x80 | n)) + bytes(rng.randrange(256) for _ in range(n)) +
               b"\x01a" for n in range(1, 12)]  # a Huffman name of random bits
    blocks += [b"\x3f\xe1\x1f", b"\x3f\xe1\xff\xff\xff\xff\x0f", b"\x20\x82", b"\x82\x20", b"\x3f\xff\xff\xff\xff\xff"]
    assert _against_hpack(blocks, max_list=rng.choice([100, MAX_LIST])) > 0

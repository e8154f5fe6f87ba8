"""The compiled frame engine (proxy/grpc/_grpc_frames.pyx) against its pure-Python reference in h2.py: the same
frames split from the same buffers (whole, cut short, oversized, with the work limit stopping them anywhere) and
the same bytes built. The rest of the suite runs whichever ``h2`` picked; ``ROLLOUT_ROUTER_GRPC_FRAMES=python``
runs it all on the reference."""
from __future__ import annotations

import importlib
import random
from types import ModuleType

import pytest

from rollout_router.proxy.grpc import h2


def _engine() -> ModuleType:
    reason = h2.engine_unavailable()
    if reason is not None and reason != "ROLLOUT_ROUTER_GRPC_FRAMES=python":
        pytest.skip(reason)
    return importlib.import_module("rollout_router.proxy.grpc._grpc_frames")


def _buffer(rng: random.Random) -> bytearray:
    """Frames of every type, some oversized, the last perhaps cut short; the R bit set on some stream ids."""
    out = bytearray()
    for _ in range(rng.randrange(0, 12)):
        size = rng.choice([0, 1, 5, 8, 100, h2.FRAME_SIZE, h2.FRAME_SIZE + 1]) if rng.random() < 0.9 else \
            rng.randrange(1 << 24)
        body = bytes(rng.randrange(256) for _ in range(min(size, 64))) * (size // 64 + 1)
        head = size.to_bytes(3, "big") + bytes((rng.randrange(12), rng.randrange(256))) + \
            rng.randrange(1 << 32).to_bytes(4, "big")
        out += head + body[:size]
    return out[:rng.randrange(len(out) + 1)] if rng.random() < 0.3 else out


@pytest.mark.parametrize("seed", range(200))
def test_split_frames_matches_the_reference(seed: int) -> None:
    engine, rng = _engine(), random.Random(seed)
    buffer = _buffer(rng)
    limit, head_work = rng.randrange(1, 20), rng.choice([1, 2, 4, 8])
    assert engine.split_frames(bytearray(buffer), limit, head_work) == h2.py_split_frames(buffer, limit, head_work)


def test_split_frames_masks_the_reserved_bit_and_copies() -> None:
    engine = _engine()
    buffer = bytearray(h2.py_frame(h2.DATA, h2.END_STREAM, 7, b"abc"))
    buffer[5] |= 0x80
    frames, used, more = engine.split_frames(buffer, 10, 1)
    assert (frames, used, more) == ([(h2.DATA, h2.END_STREAM, 7, b"abc")], 12, False)
    buffer[9:] = b"xyz"  # the payload returned is a copy, not a view of the buffer
    assert frames[0][3] == b"abc" and type(frames[0][3]) is bytes


@pytest.mark.parametrize("seed", range(50))
def test_frame_matches_the_reference(seed: int) -> None:
    engine, rng = _engine(), random.Random(seed)
    kind, flags, stream_id = rng.randrange(256), rng.randrange(256), rng.randrange(1 << 31)
    payload = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 9, 300, h2.FRAME_SIZE])))
    assert engine.frame(kind, flags, stream_id, payload) == h2.py_frame(kind, flags, stream_id, payload)
    assert engine.frame(kind, flags, stream_id) == h2.py_frame(kind, flags, stream_id)


def test_the_engine_runs_where_it_is_built() -> None:
    """``h2`` uses the compiled functions unless told not to (or they are not built, or stale)."""
    _engine()
    if h2.engine_unavailable() is None:
        assert h2.split_frames is not h2.py_split_frames and h2.frame is not h2.py_frame
    else:
        assert h2.split_frames is h2.py_split_frames and h2.frame is h2.py_frame

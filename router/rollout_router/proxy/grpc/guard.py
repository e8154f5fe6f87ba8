"""Per-connection budgets against HTTP/2 floods, each with the default of a mature server (docs/security.md).

A peer that spends a budget faster than it refills is told GOAWAY (ENHANCE_YOUR_CALM) and closed, and the
listener counts it (``rolloutrouter_request_errors_total{reason="h2_..."}``). The budgets are token buckets:
a burst, then a steady rate, so a busy but honest client never meets them.
"""
from __future__ import annotations

import math
import time

# Streams the client resets (or makes us reset): nghttp2's stream reset rate limit (burst 1000, 33 a second),
# its answer to rapid reset (CVE-2023-44487).
RESET_BURST, RESET_RATE = 1000, 33.0
# PING, SETTINGS, PRIORITY and WINDOW_UPDATE frames received: Envoy bounds the frames it queues (1000 control
# frames); we bound what a client may ask for, as a burst of 1000 and 100 a second.
CONTROL_BURST, CONTROL_RATE = 1000, 100.0
# ACKs queued for a client that does not read: nghttp2's max_outbound_ack and Envoy's max_outbound_control_frames.
MAX_QUEUED_CONTROL = 1000
# Frames with an empty payload that end nothing (DATA without END_STREAM, CONTINUATION without END_HEADERS):
# Envoy's max_consecutive_inbound_frames_with_empty_payload (1).
MAX_EMPTY_IN_A_ROW = 1
# Decoded header bytes (names and values, plus HPACK's 32 per field): a header inserted once in the dynamic
# table and referenced by many streams is counted each time it is decoded. A burst of 4 MiB, then 1 MiB a
# second, per connection (a gRPC head is a few hundred bytes).
HEADER_BURST, HEADER_RATE = 4 << 20, float(1 << 20)
# Frames parsed in one turn of the event loop before the connection yields (and stops reading meanwhile); a
# client's header block counts HEAD_WORK frames: decoding it (HPACK, Huffman in Python) costs some 50 us, ten
# times a PING, so a turn holds at most 20 of a client's heads (about 1 ms), not 200 (measured: 4-7x other
# clients' p99 under rapid reset at 200; benchmarks/h2_floods.py).
FRAMES_PER_TURN = 200
HEAD_WORK = 10


class Bucket:
    """A token bucket: ``take`` says whether ``amount`` fit."""

    __slots__ = ("burst", "rate", "tokens", "stamp")

    def __init__(self, burst: float, rate: float) -> None:
        self.burst, self.rate, self.tokens, self.stamp = burst, rate, float(burst), time.monotonic()

    def take(self, amount: float = 1.0) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate) - amount
        self.stamp = now
        return self.tokens >= 0


class Guard:
    """One connection's budgets; each ``*_ok`` says whether the peer is still within it."""

    __slots__ = ("resets", "control", "headers", "empty", "queued")
    head_work = HEAD_WORK

    def __init__(self) -> None:
        self.resets = Bucket(RESET_BURST, RESET_RATE)
        self.control = Bucket(CONTROL_BURST, CONTROL_RATE)
        self.headers = Bucket(HEADER_BURST, HEADER_RATE)
        self.empty = 0  # empty frames in a row
        self.queued = 0  # control frames answered while the peer was not reading

    def empty_ok(self, empty: bool) -> bool:
        self.empty = self.empty + 1 if empty else 0
        return self.empty <= MAX_EMPTY_IN_A_ROW

    def queued_ok(self, paused: bool) -> bool:
        self.queued = self.queued + 1 if paused else 0
        return self.queued <= MAX_QUEUED_CONTROL


class Unlimited(Bucket):
    """A bucket that always has room (no clock read: a replica's heads pass here twice a call)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(math.inf, 0.0)

    def take(self, amount: float = 1.0) -> bool:
        return True


class ReplicaGuard(Guard):
    """A replica's connection carries every call to it at once (thousands of heads a second), and the replica is
    ours: only the frame rules apply to it, not a client's budgets."""

    __slots__ = ()
    head_work = 1  # a replica's heads answer our own calls: as many per turn as any frame

    def __init__(self) -> None:
        super().__init__()
        self.resets = self.control = self.headers = Unlimited()

    def empty_ok(self, empty: bool) -> bool:
        return True

    def queued_ok(self, paused: bool) -> bool:
        return True


def decoded_size(headers: list[tuple[bytes, bytes]]) -> int:
    """Header list size as RFC 7541 4.1 counts it."""
    return sum(len(name) + len(value) + 32 for name, value in headers)

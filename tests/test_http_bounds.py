"""The request side's bounds where one read can hold more than a socket test can arrange: a whole head, several
pipelined requests, thousands of chunks. ``ClientConnection`` is fed those reads directly, with the listener's
own ``Share`` of a ``Budget`` and ``Limits``; what it dispatches, writes and holds is what the tests read."""
from __future__ import annotations

import dataclasses
import json
import tracemalloc

import pytest

from rollout_router.core.budget import Budget, Share
from rollout_router.proxy.http.connection.client import HELD_PER_REQUEST, MAX_HEAD, MAX_HEADERS, ClientConnection
from rollout_router.proxy.http.wire.request import HttpRequest
from rollout_router.proxy.listener import Limits

LIMITS = Limits(max_connections=100, max_body_bytes=32 << 20, max_buffered_bytes=256 << 20, header_timeout=30.0,
                body_timeout=300.0, min_body_rate=1024)


class Transport:
    """What the connection writes, and whether it stopped reading."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.reading = True

    def set_write_buffer_limits(self, high: int) -> None: ...
    def write(self, data: bytes) -> None: self.written.append(data)
    def pause_reading(self) -> None: self.reading = False
    def resume_reading(self) -> None: self.reading = True
    def is_closing(self) -> bool: return False
    def can_write_eof(self) -> bool: return True
    def write_eof(self) -> None: ...
    def close(self) -> None: ...


class Listener:
    """The part of ``HttpListener`` a client connection uses; requests it is handed are answered by the test."""

    def __init__(self, limits: Limits) -> None:
        self.now, self.share, self.clients = 0.0, Share(Budget()), set()
        self.budget = self.share.budget
        self.dispatched: list[HttpRequest] = []
        self._limits = limits

    def limits(self) -> Limits: return self._limits
    def admit(self) -> bool: return True
    def key_names(self) -> tuple[tuple[bytes, ...], frozenset[bytes]]: return (b"x-session-id",), frozenset({b"x-session-id"})

    def release(self, size: int) -> None:
        self.share.release(size)

    def dispatch(self, client: ClientConnection, request: HttpRequest) -> None:
        self.dispatched.append(request)


def connected(limits: Limits = LIMITS) -> tuple[ClientConnection, Listener, Transport]:
    listener, transport = Listener(limits), Transport()
    client = ClientConnection(listener)  # type: ignore[arg-type]
    client.connection_made(transport)  # type: ignore[arg-type]
    return client, listener, transport


def answered_with(request: HttpRequest) -> tuple[int, str]:
    assert request.error is not None, "the request was not refused"
    return request.error.status, request.error.message


def big_head(fields: int, name: bytes = b"X-A") -> bytes:
    return b"GET /v1/models HTTP/1.1\r\nHost: r\r\n" + b"%s: b\r\n" % name * fields + b"\r\n"


async def test_a_whole_head_over_the_bound_in_one_read_gets_431():
    """A loop busy elsewhere can find a whole 160 KB head waiting in one read: it must not pass for being whole."""
    client, listener, _ = connected()
    data = big_head(20_000, b"X-Some-Long-Name-Here")
    assert len(data) > 2 * MAX_HEAD
    client.data_received(data)
    [request] = listener.dispatched
    assert answered_with(request) == (431, f"request head exceeds {MAX_HEAD} bytes")
    assert request.close_after


async def test_a_big_head_behind_a_pipelined_request_in_the_same_read_gets_431():
    client, listener, _ = connected()
    client.data_received(b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n" + big_head(20_000, b"X-Some-Long-Name-Here"))
    first = listener.dispatched[0]
    assert first.error is None
    client.answered(first)
    second = listener.dispatched[1]
    assert answered_with(second)[0] == 431


@pytest.mark.parametrize("reads", [1, 2])
async def test_more_header_fields_than_the_bound_get_431(reads):
    """Each field is charged its bytes but held as Python objects worth several times more: their number is bounded
    too, in a head that came whole (one read) or in pieces."""
    client, listener, _ = connected()
    data = big_head(MAX_HEADERS + 1)
    cut = len(data) // 2 if reads == 2 else len(data)
    client.data_received(data[:cut])
    if cut < len(data):
        client.data_received(data[cut:])
    [request] = listener.dispatched
    assert answered_with(request) == (431, f"request head has more than {MAX_HEADERS} header fields")


async def test_as_many_header_fields_as_the_bound_are_fine():
    client, listener, _ = connected()
    client.data_received(big_head(MAX_HEADERS - 1))  # and Host
    [request] = listener.dispatched
    assert request.error is None and len(request.headers) == MAX_HEADERS - 1


async def test_a_body_in_thousands_of_chunks_holds_about_its_bytes_not_an_object_per_chunk():
    client, listener, _ = connected()
    client.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(20):
            client.data_received(b"2\r\nab\r\n" * 5000)  # 100,000 chunks of 2 bytes
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    body_bytes = 200_000
    assert listener.budget.held >= body_bytes
    assert held < 2 * body_bytes, f"{held} bytes held for a {body_bytes}-byte body"
    client.data_received(b"0\r\n\r\n")
    [request] = listener.dispatched
    assert request.error is None and request.body == b"ab" * 100_000


async def test_trailers_are_dropped_and_bounded():
    """A chunked body's trailers are not forwarded (the body goes on with a length) nor read for a session key; more
    than the head's bound of them is a 431, and their bytes are never left held."""
    client, listener, _ = connected()
    body = json.dumps({"model": "m"}).encode()
    client.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"%x\r\n%s\r\n0\r\nX-Session-ID: from-trailer\r\nX-Injected: yes\r\n\r\n" % (len(body), body))
    [request] = listener.dispatched
    assert request.error is None and request.body == body
    assert request.keys is None and all(name.lower() != b"x-injected" for name, _ in request.headers)
    client.answered(request)
    assert listener.budget.held == 0

    client.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"2\r\n{}\r\n0\r\n")
    line = b"X-T: " + b"a" * 1000 + b"\r\n"
    for _ in range(MAX_HEAD // len(line) + 2):
        client.data_received(line)
    refused = listener.dispatched[1]
    assert answered_with(refused) == (431, f"request trailers exceed {MAX_HEAD} bytes")
    client.answered(refused)
    assert listener.budget.held == 0 and not refused.headers[1:]


async def test_a_trailer_that_never_ends_is_bounded_as_it_comes():
    """llhttp holds an unfinished trailer field itself (no callback until it ends): its bytes count as they are
    read, so one endless value is a 431 at the head's bound, not memory held until a timeout."""
    client, listener, _ = connected()
    client.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"2\r\n{}\r\n0\r\nX-T: ")
    for _ in range(MAX_HEAD // 1000 + 2):
        client.data_received(b"a" * 1000)
    [refused] = listener.dispatched
    assert answered_with(refused) == (431, f"request trailers exceed {MAX_HEAD} bytes")


async def test_chunk_framing_in_reads_of_its_own_is_not_taken_for_trailers():
    """Reads holding only a chunk's size line (a client writing each chunk in pieces) are not trailers."""
    client, listener, _ = connected()
    client.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"x" * 10
    for _ in range(MAX_HEAD // 5):  # some 26 KiB of size lines alone, and 131 KiB of body
        client.data_received(b"%x\r\n" % len(piece))
        client.data_received(piece + b"\r\n")
    client.data_received(b"0\r\n\r\n")
    [request] = listener.dispatched
    assert request.error is None and request.body == piece * (MAX_HEAD // 5)


async def test_a_pipelined_request_expecting_100_continue_gets_it_when_its_turn_comes():
    """Its body waits for the 100; sent only while the connection was idle at its head, a request behind another
    never got it and timed out waiting for its own body (408)."""
    client, listener, transport = connected()
    first = b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\n{}"
    client.data_received(first + b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nExpect: 100-continue\r\n"
                                 b"Content-Length: 2\r\n\r\n")
    [request] = listener.dispatched
    assert b"HTTP/1.1 100 Continue\r\n\r\n" not in transport.written  # not before the first is answered
    client.answered(request)
    assert transport.written.count(b"HTTP/1.1 100 Continue\r\n\r\n") == 1
    client.data_received(b"{}")
    assert len(listener.dispatched) == 2 and listener.dispatched[1].body == b"{}"
    client.answered(listener.dispatched[1])
    assert transport.written.count(b"HTTP/1.1 100 Continue\r\n\r\n") == 1


async def test_thousands_of_tiny_pipelined_requests_in_one_read_are_bounded_by_the_budget():
    """Reading pauses only after the read: what one read queues is charged what holding it costs, not its few
    bytes, so maxBufferedBytes bounds it (those beyond get 503) however tiny the requests."""
    budget = 64 * 1024
    client, listener, _ = connected(dataclasses.replace(LIMITS, max_buffered_bytes=budget))
    requests = 1000  # 37 bytes each: 37 KB in all, within the budget, but held as some 430 KB of objects
    client.data_received(b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n" * requests)
    assert listener.budget.held <= budget
    assert budget // HELD_PER_REQUEST // 2 < listener.budget.held // HELD_PER_REQUEST <= budget // HELD_PER_REQUEST
    served = refused = 0
    while listener.dispatched:
        request = listener.dispatched.pop()
        if request.error is None:
            served += 1
        else:
            assert request.error.status == 503 and "maxBufferedBytes" in request.error.message
            refused += 1
            break  # answered, then the connection closes
        client.answered(request)
    assert served > 0 and refused == 1

"""Property: whatever bytes a client sends, the router answers well-formed HTTP and loses nothing.

One router and two scripted replicas run on real sockets in a background
event loop for the whole module; hypothesis sends requests built from
paths (allowlisted, dot segments, escapes), headers (session keys of any
bytes and size) and bodies (JSON, gzip, garbage), plus plain garbage. Every
answer must parse as HTTP; one the router wrote itself (no replica header)
must carry the JSON error shape; afterwards no request is in flight, no
request byte is held, and a normal request still gets 200.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
from collections.abc import Iterator

import httptools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_router.app import Runtime
from rollout_router.settings import RouterSettings, SessionSettings
from tests.support import ScriptedReplica

PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/tiny", "/v1/responses/r1",
         "/healthz", "/readyz", "/status", "/metrics", "/v1/sessions/s", "/tokenize", "/nope"]
PIECES = ["..", ".", "%2e", "%2E", "%2e%2e", "..;", "%252e", "%2f", "%2F", "%5c", "%00", "%", "%zz", "a", "~",
          "caf%c3%a9", "//", "?", "?q=../", ";x"]


@st.composite
def paths(draw) -> bytes:
    base = draw(st.sampled_from(PATHS))
    tail = "".join(draw(st.lists(st.sampled_from(PIECES).map(lambda p: "/" + p), max_size=4)))
    return (base + tail).encode()


def keys() -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
                     st.integers(200, 400).map(lambda n: b"k" * n),
                     st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass").replace(b"\r", b"")
                                              .replace(b"\n", b"")))


def bodies() -> st.SearchStrategy[tuple[bytes, bytes]]:
    """(body, extra headers)."""
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    documents = st.fixed_dictionaries({"session_id": st.one_of(st.text(max_size=300), st.integers(), st.none())},
                                      optional={"stream": st.booleans()}).map(lambda d: {**chat, **d})
    return st.one_of(
        documents.map(lambda d: (json.dumps(d).encode(), b"")),
        documents.map(lambda d: (gzip.compress(json.dumps(d).encode()), b"Content-Encoding: gzip\r\n")),
        st.binary(max_size=200).map(lambda b: (b, b"")),
        st.binary(max_size=50).map(lambda b: (b, b"Content-Encoding: gzip\r\n")),
    )


@st.composite
def requests(draw) -> bytes:
    method = draw(st.sampled_from([b"GET", b"POST", b"DELETE", b"HEAD", b"PUT", b"OPTIONS"]))
    body, extra = draw(bodies())
    key = draw(st.one_of(st.none(), keys()))
    headers = b"Host: r\r\nContent-Type: application/json\r\n" + extra
    if key is not None:
        headers += b"X-Session-ID: " + key.strip() + b"\r\n"
    if draw(st.booleans()):
        chunks = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        return b"%s %s HTTP/1.1\r\n%sTransfer-Encoding: chunked\r\n\r\n%s" % (method, draw(paths()), headers, chunks)
    return b"%s %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (method, draw(paths()), headers, len(body), body)


def garbage() -> st.SearchStrategy[bytes]:
    """Bytes that are probably not HTTP, ended so that a parser that waits for a head's end gets one."""
    return st.binary(min_size=1, max_size=300).map(lambda b: b + b"\r\n\r\n")


class Router:
    """A live router and its replicas on a loop in a background thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.replicas = [self.call(ScriptedReplica(f"127.0.0.{40 + i}").start()) for i in range(2)]
        self.runtime = Runtime(RouterSettings(
            backends=[r.url for r in self.replicas], header_timeout_seconds=2, max_body_bytes=4096,
            session=SessionSettings(body_fields=["session_id"])), admin_address=("127.0.0.1", 0))
        self.port = self.call(self.runtime.start("127.0.0.1", 0))

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def stop(self) -> None:
        self.call(self.runtime.stop())
        for replica in self.replicas:
            self.call(replica.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def settled(self) -> bool:
        proxy = self.runtime.http_proxy
        return self.runtime.replicas.total_inflight() == 0 and proxy.buffered == 0 and not proxy.active


class Response:
    """One response parsed by llhttp: a malformed one fails the parse."""

    def __init__(self) -> None:
        self.status, self.headers, self.body, self.done = 0, {}, b"", False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode().lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True


def send(port: int, data: bytes, head_only: bool) -> Response:
    response = Response()
    parser = httptools.HttpResponseParser(response)
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(data)
        while not response.done:
            chunk = sock.recv(65536)
            if not chunk:
                break
            parser.feed_data(chunk)
            if head_only and response.headers:  # HEAD: llhttp would wait for a body that never comes
                break
    response.status = parser.get_status_code()
    return response


@pytest.fixture(scope="module")
def router() -> Iterator[Router]:
    started = Router()
    yield started
    started.stop()


def check(router: Router, data: bytes) -> None:
    response = send(router.port, data, head_only=data.startswith(b"HEAD "))
    assert 100 <= response.status < 600
    if "x-rolloutrouter-replica" not in response.headers and response.status >= 400 and not data.startswith(b"HEAD "):
        error = json.loads(response.body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == response.status
    deadline = 200
    while not router.settled() and deadline:  # the router's loop finishes its bookkeeping in its own thread
        threading.Event().wait(0.01)
        deadline -= 1
    assert router.settled(), "a request stayed in flight or its bytes stayed held"


FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])


@FUZZ
@given(data=requests())
def test_any_request_gets_well_formed_http_and_nothing_leaks(router, data):
    check(router, data)


@FUZZ
@given(data=garbage())
def test_garbage_gets_a_json_error_and_the_router_keeps_serving(router, data):
    check(router, data)
    ok = send(router.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\n{}",
              head_only=False)
    assert ok.status == 200

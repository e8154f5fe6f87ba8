"""The native lane's head parsers against llhttp, the Python path's parser (``_lane_heads.pxi``).

A request the lane takes must be one llhttp reads the same way (method, target, every field, the body's
length) and one the Python path would forward as the lane does (one Host, a target already normal, no
hop-by-hop field but ``Connection: keep-alive``): the lane forwards such requests itself, and a difference
would be a request read two ways (smuggling). A request it does not take goes to the Python path whole,
so it may refuse anything. A head must never leave it waiting once llhttp has read or refused it.
A replica's response head it reads must be read by llhttp the same way, and a well-formed one must be read.
"""
from __future__ import annotations

import httptools
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rollout_router.proxy.http import lane
from rollout_router.proxy.http.wire.routes import connection_tokens, normalise_path

pytestmark = pytest.mark.skipif(lane._lane is None, reason=f"{lane.unavailable()} (tests/test_lane.py says whether "
                                                            "it should have been)")

NAMES = (b"x-session-id", b"x-group-id")
NOT_FORWARDED = {b"host", b"content-length", b"connection"}  # what the lane drops and the replica gets anew


class Request:
    """What llhttp reads of one request (httptools' callbacks)."""

    def __init__(self) -> None:
        self.url, self.headers, self.body, self.done, self.head_done = b"", [], b"", False, False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True


def llhttp(data: bytes) -> tuple[Request, httptools.HttpRequestParser | None, Exception | None]:
    seen = Request()
    parser = httptools.HttpRequestParser(seen)
    try:
        parser.feed_data(data)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade) as error:
        return seen, None, error
    return seen, parser, None


TOKENS = st.sampled_from([b"Host", b"X-Session-ID", b"x-session-id", b"X-Group-ID", b"Content-Length",
                          b"content-length", b"Transfer-Encoding", b"Connection", b"Expect", b"Upgrade", b"TE",
                          b"Keep-Alive", b"X-RolloutRouter-Forwarded-By", b"Content-Type", b"Authorization",
                          b"User-Agent", b"X-Stainless-Lang", b"Accept"])
ODD = st.sampled_from([b"", b" ", b"\t", b"\x00", b"\x7f", b"\x80", b"\xff", b"\r", b"\n", b":", b",", b"%", b"#",
                       b"\\", b"/.", b"..", b"?", b"\x01", b"\x0b"])


@st.composite
def values(draw) -> bytes:
    plain = draw(st.sampled_from([b"s-1", b"keep-alive", b"close", b"chunked", b"100-continue", b"12", b"0",
                                  b"application/json", b"Bearer x", b"h:1", b"", b"+12", b"1 2", b"abc"]))
    return draw(st.lists(st.one_of(st.just(plain), ODD), max_size=3).map(b"".join)) or plain


@st.composite
def fields(draw) -> bytes:
    name = draw(st.one_of(TOKENS, st.text("abcXYZ-_!~^`|", min_size=0, max_size=6).map(str.encode),
                          st.tuples(TOKENS, ODD).map(b"".join)))
    colon = draw(st.sampled_from([b": ", b":", b":  ", b":\t", b" : ", b": "]))
    value = draw(values())
    trailing = draw(st.sampled_from([b"", b"", b" ", b"\t"]))
    end = draw(st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r\n "]))
    return name + colon + value + trailing + end


@st.composite
def requests(draw) -> bytes:
    method = draw(st.sampled_from([b"POST", b"GET", b"POST", b"HEAD", b"PUT", b"get", b"OPTIONS", b"P0ST"]))
    path = draw(st.sampled_from([b"/v1/chat/completions", b"/v1/completions", b"/v1/models", b"/a/b", b"/", b"*",
                                 b"http://h/v1", b"/v1/chat/completions?x=1", b"/a%20b", b"/a/./b", b"/a#f",
                                 b"/caf\xc3\xa9", b"//a", b"/a\\b", b"/.well-known"]))
    path += draw(st.lists(ODD, max_size=1).map(b"".join)) if draw(st.booleans()) else b""
    space = draw(st.sampled_from([b" ", b" ", b"  ", b"\t"]))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"http/1.1", b"HTTP/1.1 "]))
    lead = draw(st.sampled_from([b"", b"", b"\r\n"]))
    head = [draw(st.sampled_from([b"Host: h\r\n", b"Host: h\r\n", b""]))] + draw(st.lists(fields(), max_size=6))
    if draw(st.booleans()):
        head.insert(draw(st.integers(0, len(head))), b"Content-Length: 5\r\n")
    return lead + method + space + path + space + version + b"\r\n" + b"".join(head) + b"\r\n" + b"hello"


@given(requests())
@settings(max_examples=600, deadline=None)
@example(b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nX-Session-ID: s-1\r\nContent-Length: 5\r\n\r\nhello")
@example(b"GET /v1/models HTTP/1.1\r\nHost: h\r\nConnection: keep-alive\r\n\r\n")
def test_a_request_the_lane_takes_is_one_llhttp_and_the_python_path_read_the_same_way(data):
    read = lane._lane.read_request_head(data, NAMES)
    if read == "incomplete":
        seen, _, error = llhttp(data)
        assert error is None and not seen.head_done, "the lane waits on a head llhttp has read or refused"
        return
    if isinstance(read, str):
        assert read in lane._lane.HANDOVER_REASONS
        return
    message = data[:read["length"] + (read["body"] or 0)]  # what follows it is the next request's
    seen, parser, error = llhttp(message)
    assert error is None and parser is not None, f"the lane takes what llhttp refuses: {error}"
    assert seen.done and parser.get_http_version() == "1.1" and parser.should_keep_alive()
    assert parser.get_method() == read["method"] and seen.url == read["target"]
    names = [(name.lower(), value) for name, value in seen.headers]
    assert [(name.lower(), value) for name, value in read["fields"]] == [
        (name, value) for name, value in names if name not in NOT_FORWARDED]
    assert read["keys"] == [next((v for n, v in names if n == key), None) for key in NAMES]
    assert [n for n, _ in names].count(b"host") == 1
    lengths = [int(v) for n, v in names if n == b"content-length"]
    assert read["body"] == (lengths[0] if lengths else None) and len(seen.body) == (read["body"] or 0)
    assert not any(connection_tokens(v) for n, v in names if n == b"connection")
    assert normalise_path(read["path"]) == read["path"] and b"%" not in read["path"] and b"/." not in read["path"]
    assert data[read["length"] - 4:read["length"]] == b"\r\n\r\n"


@st.composite
def responses(draw, well_formed: bool) -> bytes:
    version = b"HTTP/1.1" if well_formed else draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"HTTP/1.1"]))
    status = draw(st.integers(100, 599) if well_formed else st.sampled_from([200, 204, 99, 1000, 101]))
    reason = draw(st.sampled_from([b" OK", b" Not Found", b" ", b"", b" A  B"]))
    names = [b"date", b"server", b"content-type", b"x-request-id", b"Connection", b"X-A"]
    head = [name + b": " + draw(st.sampled_from([b"Sun, 06 Dec 2026 03:49:01 GMT", b"uvicorn", b"text/event-stream",
                                                 b"keep-alive", b"close", b"v", b"a b", b"\x80x"])) + b"\r\n"
            for name in draw(st.lists(st.sampled_from(names), max_size=5))]
    framing = draw(st.sampled_from([b"content-length: 12\r\n", b"transfer-encoding: chunked\r\n", b"",
                                    b"Content-Length: 12 \r\n"]))
    head.insert(draw(st.integers(0, len(head))), framing)
    if not well_formed:
        head += draw(st.lists(fields(), max_size=2))
    return version + b" " + str(status).encode() + reason + b"\r\n" + b"".join(head) + b"\r\n"


class Response:
    def __init__(self) -> None:
        self.status, self.headers, self.head_done = b"", [], False

    def on_status(self, status: bytes) -> None:
        self.status += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True


def check_response(data: bytes, must_read: bool) -> None:
    if data.find(b"\r\n\r\n") != len(data) - 4:
        return  # a field's bytes made a blank line early: not one whole head
    read = lane._lane.read_response_head(data)
    seen = Response()
    parser = httptools.HttpResponseParser(seen)
    try:
        parser.feed_data(data)
        error = None
    except (httptools.HttpParserError, httptools.HttpParserUpgrade) as failed:
        error = failed
    if isinstance(read, str):
        assert not must_read, f"a well-formed head refused: {read}"
        return
    if read["status"] == 101:  # both paths fail it: "answered 101 Switching Protocols, which the router does not relay"
        return
    assert error is None and seen.head_done, f"the lane reads a head llhttp refuses: {error}"
    assert parser.get_status_code() == read["status"] and seen.status == read["reason"]
    lengths = [v for n, v in seen.headers if n.lower() == b"content-length"]
    assert read["length"] == (lengths[0] if lengths else None)
    assert read["fields"] == [(n, v) for n, v in seen.headers if n.lower() != b"content-length"]


@given(responses(well_formed=True))
@settings(max_examples=300, deadline=None)
def test_a_well_formed_response_head_is_read_as_llhttp_reads_it(data):
    check_response(data, must_read=True)


@given(responses(well_formed=False))
@settings(max_examples=400, deadline=None)
def test_a_response_head_the_lane_reads_is_one_llhttp_reads_the_same_way(data):
    check_response(data, must_read=False)


class Body(Response):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.done = b"", False

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True


@st.composite
def chunked_bodies(draw, well_formed: bool) -> bytes:
    pieces = draw(st.lists(st.binary(min_size=1, max_size=40), max_size=5))
    size = (lambda n: b"%x" % n) if well_formed else draw(st.sampled_from([lambda n: b"%x" % n, lambda n: b"%X" % n,
                                                                           lambda n: b"0%x" % n]))
    extension = b"" if well_formed else draw(st.sampled_from([b"", b";a=1", b" ;x"]))
    trailers = draw(st.sampled_from([b"", b"x-t: 1\r\n", b"x-a: 1\r\nx-b: 2\r\n"]))
    body = b"".join(size(len(p)) + extension + b"\r\n" + p + b"\r\n" for p in pieces) + b"0\r\n" + trailers + b"\r\n"
    if not well_formed:
        body = mutate_bytes(body, draw(st.randoms()))
    return body + b"NEXT"  # what follows the body is the next answer's: not its


def mutate_bytes(data: bytes, rng) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(0, 3)):
        if out:
            at = rng.randrange(len(out))
            out[at:at + rng.randint(0, 2)] = bytes([rng.choice(b"\r\n ;0aZ:\x00\x80")])
    return bytes(out)


def check_chunked(body: bytes, must_read: bool) -> None:
    data, end, error = lane._lane.read_chunked(body)
    if error is not None or end is None:
        assert not must_read, f"well-formed chunks not read: {error}"
        return
    seen, refused = llhttp_chunks(body[:end])
    assert refused is None and seen.done, f"the lane reads chunks llhttp refuses: {refused}"
    assert data == seen.body and not llhttp_chunks(body[:end - 1])[0].done  # the same bytes, the same end
    if must_read:
        assert body[end:] == b"NEXT"


def llhttp_chunks(body: bytes) -> tuple[Body, Exception | None]:
    seen = Body()
    try:
        httptools.HttpResponseParser(seen).feed_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body)
    except httptools.HttpParserError as failed:
        return seen, failed
    return seen, None


@given(chunked_bodies(well_formed=True))
@settings(max_examples=300, deadline=None)
def test_a_well_formed_chunked_body_is_read_as_llhttp_reads_it(body):
    check_chunked(body, must_read=True)


@given(chunked_bodies(well_formed=False))
@settings(max_examples=500, deadline=None)
def test_a_chunked_body_the_lane_reads_is_one_llhttp_reads_the_same_way(body):
    check_chunked(body, must_read=False)

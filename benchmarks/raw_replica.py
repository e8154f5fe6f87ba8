"""A replica fast enough not to be the limit: an asyncio Protocol with httptools, on uvloop.

It answers what the proxy benchmarks send: ``POST /v1/chat/completions`` with a small
JSON completion (Content-Length), or with ``"stream": true`` a chunked SSE stream of
``EVENTS`` events written one by one, then ``data: [DONE]``. Its heads are vLLM's (uvicorn adds
``server`` and ``date`` to every response and sends lower-case names: encode/uvicorn
docs/server-behavior.md), and its completions vary in length as generated text does (1 to 512
tokens, verl's default ``response_length``), so a router cannot answer every response with one
remembered head. ``GET /health``; ``GET /seen``: the session ids it has answered (the
``X-Session-ID`` or ``x-smg-routing-key`` header, else the body's ``"user"`` field), one per line,
so a benchmark can check that every arm forwarded and kept each session on one replica.

    python benchmarks/raw_replica.py HOST PORT
"""
from __future__ import annotations

import asyncio
import email.utils
import itertools
import re
import sys
import time

import httptools
import uvloop

EVENTS = 32
# One completion per length of its content, 1 to 512 tokens of "t " (verl's rollout.yaml default response_length),
# answered in turn.
BODIES = [b'{"id":"x","object":"chat.completion","model":"tiny","choices":[{"index":0,'
          b'"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}]}' % (b"t " * tokens)
          for tokens in range(1, 513)]
JSON_HEAD = b"HTTP/1.1 200 OK\r\ndate: %s\r\nserver: uvicorn\r\ncontent-length: %d\r\ncontent-type: application/json\r\n\r\n"
SSE_HEAD = (b"HTTP/1.1 200 OK\r\ndate: %s\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
EVENT = (b'data: {"id":"x","object":"chat.completion.chunk","model":"tiny","choices":[{"index":0,'
         b'"delta":{"content":"t "},"finish_reason":null}]}\n\n')
HEALTH = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
WEIGHT_INFO = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 29\r\n\r\n{"weight_version": "default"}'  # vLLM's
USER = re.compile(rb'"user"\s*:\s*"([^"]*)"')
SESSION_HEADERS = (b"x-session-id", b"x-smg-routing-key")  # ours and the peers'; SGLang's forwards only its own
SEEN: set[bytes] = set()  # session ids answered
ANSWERS = itertools.cycle(BODIES)
_DATE: list = [0, b""]  # the second and its HTTP date, as uvicorn keeps it


def date() -> bytes:
    now = int(time.time())
    if _DATE[0] != now:
        _DATE[:] = [now, email.utils.formatdate(now, usegmt=True).encode()]
    return _DATE[1]


def text(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def user(body: bytes) -> bytes:
    """The ``"user": "..."`` field of a JSON body, found without parsing it (b"" when absent)."""
    found = USER.search(body)
    return found.group(1) if found else b""


class Replica(asyncio.Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []
        self.session = b""

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in SESSION_HEADERS:
            self.session = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body = b"".join(self.body), []
        session, self.session = self.session or user(body), b""
        if session:
            SEEN.add(session)
        if self.url.startswith(b"/health"):
            self.transport.write(HEALTH)
        elif self.url.startswith(b"/weight_info"):  # a router that asks gets vLLM 0.32's answer: answers stamped
            self.transport.write(WEIGHT_INFO)
        elif self.url.startswith(b"/seen"):
            self.transport.write(text(b"\n".join(sorted(SEEN))))
        elif b'"stream":true' in body.replace(b" ", b""):
            self.transport.write(SSE_HEAD % date())
            for _ in range(EVENTS):
                self.transport.write(chunk(EVENT))
            self.transport.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        else:
            body = next(ANSWERS)
            self.transport.write(JSON_HEAD % (date(), len(body)) + body)


async def main(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Replica, host, port, backlog=1024)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1], int(sys.argv[2])))

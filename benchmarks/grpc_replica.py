"""A gRPC replica fast enough not to be the limit: vLLM's ``VllmEngine`` as raw HTTP/2 frames, on uvloop.

What ``raw_replica.py`` is for HTTP, for gRPC (benchmarks/grpc_cost.py): no gRPC library runs, the frames
are written by hand and every answer is built once at start. ``Generate`` answers a stream of ``--messages``
``GenerateResponse`` messages (``chunk`` messages, one token each, then a ``complete`` with the prompt and
cached token counts a router may read), one every ``--interval-ms`` milliseconds from the call's arrival, as
a decode emits tokens (0: all at once, in one write). A call's ``x-bench-interval-ms`` metadata overrides the
interval for that call, so one replica serves both of the benchmark's loads. ``HealthCheck`` answers
healthy (a router's gRPC probes), ``GetLoads`` an idle engine; any other method UNIMPLEMENTED.

Request header blocks are decoded with ``hpack`` (the peer's dynamic table: every client and proxy encodes
differently), flow control is kept on both sides, and the session ids seen (``x-session-id`` metadata) are
recorded. The same port answers HTTP/1.1 ``GET /health`` and ``GET /seen`` (the session ids, one a line),
so a benchmark checks that every arm forwarded and kept each session on one replica, as with raw_replica.py.

    python benchmarks/grpc_replica.py HOST PORT [--messages 16] [--interval-ms 10]
"""
from __future__ import annotations

import argparse
import asyncio
import collections

import hpack
import uvloop

from rollout_router.proxy.grpc import h2

GENERATE = b"/vllm.grpc.engine.VllmEngine/Generate"
HEALTH = b"/vllm.grpc.engine.VllmEngine/HealthCheck"
LOADS = b"/vllm.grpc.engine.VllmEngine/GetLoads"
SESSION = b"x-session-id"
INTERVAL = b"x-bench-interval-ms"
PROMPT_TOKENS, CACHED_TOKENS = 512, 480
WINDOW = 1 << 30  # what we let a client send: requests are small, never worth a WINDOW_UPDATE per call
SEEN: set[bytes] = set()
HEAD = h2.encode([(b":status", b"200"), (b"content-type", b"application/grpc")])
TRAILERS = h2.encode([(b"grpc-status", b"0")])
UNIMPLEMENTED = h2.encode(h2.status_headers(h2.UNIMPLEMENTED, "the benchmark replica serves Generate only"))


def message(body: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed)."""
    return b"\x00" + len(body).to_bytes(4, "big") + body


def answers(count: int) -> tuple[list[bytes], bytes, bytes]:
    """``Generate``'s ``count`` messages, ``HealthCheck``'s and ``GetLoads``'s, as vLLM's protos encode them."""
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb
    chunks = [pb.GenerateResponse(chunk=pb.GenerateStreamChunk(
        token_ids=[100 + i], prompt_tokens=PROMPT_TOKENS, completion_tokens=i + 1, cached_tokens=CACHED_TOKENS))
        for i in range(count - 1)]
    complete = pb.GenerateResponse(complete=pb.GenerateComplete(
        output_ids=[100 + i for i in range(count)], finish_reason="length", prompt_tokens=PROMPT_TOKENS,
        completion_tokens=count, cached_tokens=CACHED_TOKENS))
    generate = [message(m.SerializeToString()) for m in (*chunks, complete)]
    return (generate, message(pb.HealthCheckResponse(healthy=True, message="Health").SerializeToString()),
            message(pb.GetLoadsResponse(version="bench", dp_rank_count=1).SerializeToString()))


class Replica(asyncio.Protocol):
    messages: list[bytes] = []
    health = loads = b""
    interval = 0.01

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.buffer = bytearray()
        self.started = False
        self.decoder = hpack.Decoder()
        self.block: tuple[int, int, bytearray] | None = None  # a header block waiting for CONTINUATION
        self.calls: dict[int, list] = {}  # stream id -> [path, interval, messages sent, timer]
        self.window = h2.DEFAULT_WINDOW  # the peer's connection window
        self.initial = h2.DEFAULT_WINDOW  # the peer's initial stream window
        self.windows: dict[int, int] = {}
        self.waiting: collections.deque[tuple[int, bytes, int]] = collections.deque()  # (stream, frame, size)
        self.out: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.started:
            if self.buffer.startswith(b"GET "):
                return self.http1()
            if len(self.buffer) < len(h2.PREFACE):
                return
            if not self.buffer.startswith(h2.PREFACE):
                return self.transport.close()
            del self.buffer[:len(h2.PREFACE)]
            self.started = True
            self.out.append(h2.settings_frame({h2.MAX_CONCURRENT_STREAMS: 10_000, h2.INITIAL_WINDOW_SIZE: WINDOW})
                            + h2.window_update(0, WINDOW - h2.DEFAULT_WINDOW))
        frames, used, _ = h2.split_frames(self.buffer, 1 << 30)
        del self.buffer[:used]
        for kind, flags, stream_id, payload in frames:
            if kind == h2.HEADERS or kind == h2.CONTINUATION:
                self.head(kind, flags, stream_id, payload)
            elif kind == h2.DATA and flags & h2.END_STREAM:
                self.call(stream_id)
            elif kind == h2.SETTINGS and not flags & h2.ACK:
                self.settings(payload)
            elif kind == h2.WINDOW_UPDATE:
                increment = int.from_bytes(payload, "big") & h2.MAX_WINDOW
                if stream_id:
                    self.windows[stream_id] = self.windows.get(stream_id, self.initial) + increment
                else:
                    self.window += increment
                self.drain()
            elif kind == h2.PING and not flags & h2.ACK:
                self.out.append(h2.frame(h2.PING, h2.ACK, 0, payload))
            elif kind == h2.RST_STREAM:
                self.end(stream_id)
            elif kind == h2.GOAWAY or kind == -1:
                self.transport.close()
        self.flush()

    def http1(self) -> None:
        """``GET /seen`` (the session ids answered, one a line) or ``GET /health``, then close."""
        if b"\r\n\r\n" not in self.buffer:
            return
        body = b"\n".join(sorted(SEEN)) if self.buffer.startswith(b"GET /seen") else b"ok"
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        self.transport.close()

    def settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload), 6):
            if int.from_bytes(payload[offset:offset + 2], "big") == h2.INITIAL_WINDOW_SIZE:
                value = int.from_bytes(payload[offset + 2:offset + 6], "big")
                for stream_id in self.windows:
                    self.windows[stream_id] += value - self.initial
                self.initial = value
        self.out.append(h2.frame(h2.SETTINGS, h2.ACK, 0))

    def head(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == h2.HEADERS:
            payload = h2.unpad(flags, payload) or b""
            if flags & h2.PRIORITY_FLAG:
                payload = payload[5:]
            self.block = (stream_id, flags, bytearray(payload))
        elif self.block is not None:
            self.block[2].extend(payload)
        if not flags & h2.END_HEADERS or self.block is None:
            return
        stream_id, first, block = self.block
        self.block = None
        headers = self.decoder.decode(bytes(block), raw=True)
        if stream_id in self.calls:  # the client's trailers: nothing to do
            return
        fields = dict(headers)
        if fields.get(SESSION):
            SEEN.add(fields[SESSION])
        interval = int(fields[INTERVAL]) / 1000 if INTERVAL in fields else self.interval
        self.calls[stream_id] = [fields.get(b":path", b""), interval, 0, None]
        self.windows[stream_id] = self.initial
        if first & h2.END_STREAM:
            self.call(stream_id)

    def call(self, stream_id: int) -> None:
        """The request is whole: answer it."""
        state = self.calls.get(stream_id)
        if state is None:
            return
        path = state[0]
        if path == GENERATE:
            self.send(stream_id, h2.frame(h2.HEADERS, h2.END_HEADERS, stream_id, HEAD))
            if state[1] > 0:
                state[3] = asyncio.get_running_loop().call_later(state[1], self.tick, stream_id)
            else:
                for body in self.messages:
                    self.send(stream_id, h2.frame(h2.DATA, 0, stream_id, body), len(body))
                self.close(stream_id)
        elif path == HEALTH or path == LOADS:
            body = self.health if path == HEALTH else self.loads
            self.send(stream_id, h2.frame(h2.HEADERS, h2.END_HEADERS, stream_id, HEAD)
                      + h2.frame(h2.DATA, 0, stream_id, body), len(body))
            self.close(stream_id)
        else:
            self.send(stream_id, h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream_id, UNIMPLEMENTED))
            self.end(stream_id)

    def tick(self, stream_id: int) -> None:
        """A paced call's next message (its last one followed by the trailers)."""
        state = self.calls.get(stream_id)
        if state is None or self.transport.is_closing():
            return
        body = self.messages[state[2]]
        state[2] += 1
        self.send(stream_id, h2.frame(h2.DATA, 0, stream_id, body), len(body))
        if state[2] == len(self.messages):
            self.close(stream_id)
        else:
            state[3] = asyncio.get_running_loop().call_later(state[1], self.tick, stream_id)
        self.flush()

    def close(self, stream_id: int) -> None:
        self.send(stream_id, h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream_id, TRAILERS))
        self.end(stream_id)

    def end(self, stream_id: int) -> None:
        state = self.calls.pop(stream_id, None)
        self.windows.pop(stream_id, None)  # (a frame still waiting is held to the initial window)
        if state is not None and state[3] is not None:
            state[3].cancel()

    def send(self, stream_id: int, frame: bytes, size: int = 0) -> None:
        """A frame out, within the peer's windows (what does not fit waits, in order)."""
        if self.waiting or size > min(self.window, self.windows.get(stream_id, self.initial)):
            self.waiting.append((stream_id, frame, size))
            return
        self.spend(stream_id, size)
        self.out.append(frame)

    def spend(self, stream_id: int, size: int) -> None:
        self.window -= size
        if stream_id in self.windows:
            self.windows[stream_id] -= size

    def drain(self) -> None:
        while self.waiting:
            stream_id, frame, size = self.waiting[0]
            if size > min(self.window, self.windows.get(stream_id, self.initial)):
                return
            self.waiting.popleft()
            self.spend(stream_id, size)
            self.out.append(frame)

    def flush(self) -> None:
        if self.out:
            self.transport.write(b"".join(self.out))
            self.out.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        for stream_id in list(self.calls):
            self.end(stream_id)


async def main(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Replica, host, port, backlog=1024)
    await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--messages", type=int, default=16, help="messages per Generate call (default 16)")
    parser.add_argument("--interval-ms", type=float, default=10.0, help="between a call's messages (default 10)")
    args = parser.parse_args()
    Replica.messages, Replica.health, Replica.loads = answers(args.messages)
    Replica.interval = args.interval_ms / 1000
    uvloop.run(main(args.host, args.port))

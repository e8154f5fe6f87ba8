"""The prefill a vLLM replica reports at the end of a gRPC ``Generate`` call (turns.py for the HTTP side).

vLLM's ``Generate`` ends with a ``complete`` message carrying ``prompt_tokens`` and ``cached_tokens`` (a
streaming call's chunks carry them too). ``LastMessage`` follows the response's length-prefixed messages
from the bytes the call relays anyway and keeps only the newest one, so a measured call holds at most one
message (up to ``MESSAGE_LIMIT``), never the stream.
"""
from __future__ import annotations

import functools
from typing import Any, Final

from ..turns import tokens

MESSAGE_LIMIT: Final = 1 << 20  # a larger (or compressed) last message is not measured


def generate_path() -> bytes | None:
    """The path of vLLM's ``Generate``, from its protos (None without them: no call is measured)."""
    try:
        from smg_grpc_proto.generated import vllm_engine_pb2
    except ImportError:
        return None
    service = vllm_engine_pb2.DESCRIPTOR.services_by_name["VllmEngine"]
    return f"/{service.full_name}/Generate".encode()


@functools.cache
def _protos() -> tuple[Any, type[Exception]]:
    """vLLM's ``GenerateResponse`` and protobuf's ``DecodeError``, imported once (not on every measured call)."""
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
    from smg_grpc_proto.generated import vllm_engine_pb2
    return vllm_engine_pb2.GenerateResponse, DecodeError


class LastMessage:
    """The newest complete message of a gRPC response, from its DATA bytes as they pass."""

    __slots__ = ("_prefix", "_body", "_left", "_keep", "last")

    def __init__(self) -> None:
        self._prefix, self._left, self._keep = b"", 0, False
        self._body: list[bytes] = []
        self.last: bytes | None = None

    def feed(self, data: bytes) -> None:
        index, size = 0, len(data)
        if not self._left and not self._prefix and size >= 5 and int.from_bytes(data[1:5], "big") == size - 5:
            # one whole message, as a replica sends a message a frame: what the loop below leaves, without it
            self._keep = keep = data[0] == 0 and size - 5 <= MESSAGE_LIMIT
            self._body = [data[5:]] if keep and size > 5 else []
            self.last = data[5:] if keep else None
            return
        while index < size:
            if self._left:
                step = min(self._left, size - index)
                if self._keep:
                    self._body.append(data[index:index + step])
                self._left -= step
                index += step
                if not self._left:
                    self._end()
                continue
            need = 5 - len(self._prefix)
            self._prefix += data[index:index + need]
            index += need
            if len(self._prefix) == 5:
                length = int.from_bytes(self._prefix[1:], "big")
                self._keep = self._prefix[0] == 0 and length <= MESSAGE_LIMIT
                self._prefix, self._body, self._left = b"", [], length
                if not length:
                    self._end()

    def _end(self) -> None:
        self.last = b"".join(self._body) if self._keep else None

    def prefill(self) -> int | None:
        """``prompt_tokens - cached_tokens`` of the newest message, read as a ``GenerateResponse``."""
        if self.last is None:
            return None
        response_type, decode_error = _protos()
        try:
            response = response_type.FromString(self.last)
        except decode_error:  # not a GenerateResponse after all: not measured
            return None
        which = response.WhichOneof("response")
        if which is None:
            return None
        part = getattr(response, which)
        return tokens(part.prompt_tokens, part.cached_tokens)

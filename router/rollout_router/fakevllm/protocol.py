"""The OpenAI-compatible wire format, shaped like vLLM's: request models, errors, responses.

Unknown request fields (temperature, top_p, ...) are accepted and ignored, as
vLLM accepts sampling parameters this fake has no use for.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ApiError(Exception):
    """An error answered as vLLM does: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, type: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.type, self.message, self.param = status, type, message, param

    @classmethod
    def bad_request(cls, message: str, param: str | None = None) -> ApiError:
        return cls(400, "BadRequestError", message, param)

    @classmethod
    def from_validation(cls, exc: ValidationError) -> ApiError:
        errors = exc.errors()
        message = "; ".join(
            f"{'.'.join(map(str, error['loc']))}: {error['msg']}" if error["loc"] else error["msg"]
            for error in errors)
        first = errors[0]["loc"]
        return cls.bad_request(message, str(first[0]) if first else None)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Body):
    include_usage: bool | None = True


class TextPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        """The message's text; non-text parts (images, audio) are ignored."""
        if isinstance(self.content, list):
            return "\n".join(part.text or "" for part in self.content if part.type == "text")
        return self.content or ""


class _Generation(_Body):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=1)  # one choice per request is all this fake produces
    stream: bool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="after")
    def _options_need_stream(self) -> _Generation:
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    add_generation_prompt: bool = True

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Generation):
    prompt: str | list[int]  # text, or token ids as vLLM also accepts

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of prompt or messages is required")
        return self


@dataclasses.dataclass(frozen=True, slots=True)
class Kind:
    """What differs between /v1/chat/completions and /v1/completions responses."""

    id_prefix: str
    object: str
    chunk_object: str

    @property
    def chat(self) -> bool:
        return self.object == "chat.completion"

    def choice(self, text: str, finish_reason: str) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": []}
            return {"index": 0, "message": message, "logprobs": None,
                    "finish_reason": finish_reason, "stop_reason": None}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                "stop_reason": None, "prompt_logprobs": None}

    def delta(self, text: str, finish_reason: str | None, role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta = {"role": "assistant", "content": text} if role else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                "stop_reason": None}


CHAT = Kind("chatcmpl", "chat.completion", "chat.completion.chunk")
TEXT = Kind("cmpl", "text_completion", "text_completion")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """vLLM's usage block, with ``cached_tokens`` as under ``--enable-prompt-tokens-details``."""
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}

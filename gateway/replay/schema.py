"""Wire formats of the replay upstream: the parts of OpenAI's chat request it acts on, the
control API's request body, and OpenAI-shaped error bodies.

The request model accepts the full OpenAI schema (unknown fields are kept and ignored), so any
client that talks to OpenAI can talk to the replay upstream unchanged.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.replay.faults import ANY_MODEL

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class ChatRequest(BaseModel):
    """POST /v1/chat/completions body (the fields the replay upstream looks at)."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    @property
    def token_limit(self) -> int | None:
        # max_completion_tokens supersedes the deprecated max_tokens, as in OpenAI's API.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class FaultRequest(BaseModel):
    """POST /_replay/faults body."""

    model_config = ConfigDict(extra="forbid")

    model: str = ANY_MODEL
    fault: str
    count: int = Field(default=1, ge=1, le=100_000)


def error_type(status: int) -> str:
    if status >= 500:
        return "server_error"
    return _ERROR_TYPES.get(status, "invalid_request_error")


def error_body(
    message: str, status: int, *, code: str | None = None, param: str | None = None
) -> bytes:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return orjson.dumps(
        {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}
    )


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """(message, param) for the first validation error, in OpenAI's terse style."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    return (f"{loc}: {first['msg']}" if loc else first["msg"]), (loc or None)

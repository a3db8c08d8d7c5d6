"""What the API translations over the chat service share (``gateway.responses``,
``gateway.messages``): validating a request body into its model with the error naming the
field, the headers of a chat answer worth keeping, and reading the chat service's SSE
stream as chunks."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from gateway.errors import bad_request

__all__ = ["BODY_HEADERS", "chat_chunks", "parse_body"]

M = TypeVar("M", bound=BaseModel)

# Headers of the chat answer that describe its body, not the request: a translated answer
# has a body of its own.
BODY_HEADERS = frozenset({"content-length", "content-type"})


def parse_body(kind: type[M], data: Any) -> M:
    """``data`` (a decoded JSON body) as ``kind``, or a 400 naming the first bad field."""
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = field_path(err["loc"])
        raise bad_request(f"{param}: {err['msg']}" if param else err["msg"], param=param) from None


def field_path(loc: tuple[int | str, ...] | list[int | str]) -> str | None:
    """A validation error's location as the API names fields: ``input[0].content``."""
    out: str | None = None
    for p in loc:
        if isinstance(p, int) or str(p).isdigit():
            out = f"{out}[{p}]"
        else:
            out = str(p) if out is None else f"{out}.{p}"
    return out


async def chat_chunks(
    chat_sse: AsyncIterable[str | bytes | memoryview],
) -> AsyncGenerator[dict[str, Any], None]:
    """The chat service's SSE stream as its chunks (``[DONE]`` left out), however the bytes
    were split. Closing this iterator (a client that went away) closes the chat stream with
    it, so that its bookkeeping (the ledger row, status 499) runs at once."""
    try:
        buffer = b""
        async for raw in chat_sse:
            buffer += raw.encode() if isinstance(raw, str) else bytes(raw)
            # One SSE event ends with a blank line; a read may hold several, or part of one.
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                for line in event.split(b"\n"):
                    if line.startswith(b"data: ") and line != b"data: [DONE]":
                        yield orjson.loads(line[6:])
    finally:
        aclose = getattr(chat_sse, "aclose", None)
        if aclose is not None:
            await aclose()

"""The chat service's SSE stream, built chunk by chunk, for the API translations' tests."""

from __future__ import annotations

from typing import Any

import orjson


def sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def delta(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"model": "m1", "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def call_delta(
    index: int, *, id: str | None = None, name: str | None = None, args: str = ""
) -> dict[str, Any]:
    """A piece of a streamed tool call (its id and name come with the first piece)."""
    fn: dict[str, Any] = {"arguments": args}
    if name is not None:
        fn["name"] = name
    tc: dict[str, Any] = {"index": index, "function": fn}
    if id is not None:
        tc.update(id=id, type="function")
    return delta({"tool_calls": [tc]})

"""Encoding a Completion as OpenAI wire bytes: a ``chat.completion`` body or the SSE events of
a ``chat.completion.chunk`` stream.

This is the replay upstream's hot path (it is the upstream in throughput benchmarks), so the
fields shared by every chunk of a stream are encoded once into a byte prefix and each event
only encodes its own ``choices``.
"""

from __future__ import annotations

import itertools
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.replay.synth import Completion

SYSTEM_FINGERPRINT = "fp_replay"
DONE_EVENT = b"data: [DONE]\n\n"
# A stream piece is up to this many words (with their surrounding whitespace).
_PIECE_RE = re.compile(r"(?:\s*\S+){1,4}\s*")
_ARGUMENT_PIECE_CHARS = 24


def split_pieces(text: str) -> list[str]:
    """Split text into small stream deltas of a few words; ``"".join`` gives ``text`` back."""
    pieces = _PIECE_RE.findall(text)
    return pieces if pieces else ([text] if text else [])


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """What every response and chunk of one request shares."""

    id: str
    created: int
    model: str


class IdFactory:
    """Response ids: a random per-server prefix plus a counter (unique across servers and
    restarts, and ~10x cheaper than a uuid4 per request)."""

    def __init__(self) -> None:
        self._prefix = f"chatcmpl-replay-{secrets.token_hex(6)}"
        self._counter = itertools.count(1)

    def meta(self, model: str) -> ResponseMeta:
        return ResponseMeta(f"{self._prefix}{next(self._counter):010x}", int(time.time()), model)


def _usage(c: Completion, n: int) -> dict[str, int]:
    completion = c.completion_tokens * n
    return {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": c.prompt_tokens + completion,
    }


def completion_body(c: Completion, n: int, meta: ResponseMeta, *, usage: bool = True) -> bytes:
    """The ``chat.completion`` body; ``usage=False`` leaves the usage object out."""
    message: dict[str, Any] = {"role": "assistant", "content": c.content, "refusal": None}
    if c.tool_calls is not None:
        message["tool_calls"] = c.tool_calls
    body: dict[str, Any] = {
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {"index": i, "message": message, "logprobs": None, "finish_reason": c.finish_reason}
            for i in range(n)
        ],
    }
    if usage:
        body["usage"] = _usage(c, n)
    return orjson.dumps(body)


class ChunkEncoder:
    """Encodes the SSE events of one stream; the shared fields are serialized once."""

    def __init__(self, meta: ResponseMeta, include_usage: bool) -> None:
        head = orjson.dumps(
            {
                "id": meta.id,
                "object": "chat.completion.chunk",
                "created": meta.created,
                "model": meta.model,
                "system_fingerprint": SYSTEM_FINGERPRINT,
            }
        )
        self._prefix = b"data: " + head[:-1] + b',"choices":'
        # With include_usage, OpenAI sends "usage": null on every chunk but the last.
        self._suffix = b',"usage":null}\n\n' if include_usage else b"}\n\n"

    def delta(self, index: int, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self._prefix + orjson.dumps([choice]) + self._suffix

    def content(self, index: int, piece: str) -> bytes:
        """Same bytes as ``delta(index, {"content": piece})``, without building the dicts:
        content deltas are nearly all of a stream's events."""
        return b"".join(
            (
                self._prefix,
                b'[{"index":%d,"delta":{"content":' % index,
                orjson.dumps(piece),
                b'},"logprobs":null,"finish_reason":null}]',
                self._suffix,
            )
        )

    def usage(self, usage: dict[str, int]) -> bytes:
        return self._prefix + b'[],"usage":' + orjson.dumps(usage) + b"}\n\n"


# Event kinds: a content delta (text or tool arguments), a preamble event (role, tool-call
# header), an ending event (finish_reason, [DONE]) and the usage chunk (which ends a stream
# too, told apart for the bad-usage fault).
CONTENT, PREAMBLE, ENDING, USAGE = 0, 1, 2, 3


def stream_events(
    c: Completion, n: int, meta: ResponseMeta, include_usage: bool
) -> Iterator[tuple[bytes, int]]:
    """The events of a stream, in order, as (event bytes, kind); ``[DONE]`` last.

    The kind lets a ``cut-stream=<n>`` fault count content events and never let an ending
    event through. Choices are streamed one after another; clients merge by ``index``."""
    enc = ChunkEncoder(meta, include_usage)
    for i in range(n):
        if c.tool_calls is not None:
            yield enc.delta(i, {"role": "assistant", "content": None}), PREAMBLE
            for t, call in enumerate(c.tool_calls):
                fn = call["function"]
                header = {
                    "index": t,
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": ""},
                }
                yield enc.delta(i, {"tool_calls": [header]}), PREAMBLE
                args: str = fn["arguments"]
                for start in range(0, len(args), _ARGUMENT_PIECE_CHARS):
                    piece = args[start : start + _ARGUMENT_PIECE_CHARS]
                    part = {"index": t, "function": {"arguments": piece}}
                    yield enc.delta(i, {"tool_calls": [part]}), CONTENT
        else:
            yield enc.delta(i, {"role": "assistant", "content": ""}), PREAMBLE
            for piece in split_pieces(c.content or ""):
                yield enc.content(i, piece), CONTENT
        yield enc.delta(i, {}, c.finish_reason), ENDING
    if include_usage:
        yield enc.usage(_usage(c, n)), USAGE
    yield DONE_EVENT, ENDING

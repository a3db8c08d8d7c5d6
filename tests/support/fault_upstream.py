"""An OpenAI-compatible upstream on loopback, in the test's own event loop, whose every
answer the test scripts byte for byte — for the failures the replay upstream cannot inject:
a ``retry-after`` that is not a number, a stream that ends before its first event, SSE
comments and nothing else, one event of megabytes.

    async with fault_upstream() as up:
        up.script(Reply(status=429, headers={"retry-after": "nan"}), Reply.chunks(["hi"]))
        ... a pool model with api_base=up.base_url ...

Each request takes the next scripted reply; once they are used up, a short streamed or
JSON answer (whichever the request asked for).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def chunk(
    content: str | None = None,
    finish_reason: str | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion.chunk``: a content delta, a finish, or (no choices) usage."""
    out: dict[str, Any] = {
        "id": "chatcmpl-fault",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [],
    }
    if usage is not None:
        out["usage"] = usage
    else:
        delta = {"content": content} if content is not None else {}
        out["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    return out


def event(data: dict[str, Any] | bytes) -> bytes:
    """One SSE data event."""
    return b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n\n"


@dataclass
class Reply:
    """What the upstream does with one request. A ``status`` of 400 or more answers with an
    OpenAI error body; otherwise ``events`` (raw bytes, sent one write each, ``gap_s``
    apart) make an SSE stream, or ``body`` a JSON answer."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    events: Sequence[bytes] | None = None
    gap_s: float = 0.0
    drop: bool = False  # close the connection without answering

    @classmethod
    def chunks(cls, pieces: Sequence[str], *, done: bool = True) -> Reply:
        """A well-formed stream of ``pieces``, its finish and usage, and ``[DONE]`` unless
        ``done`` is False (a stream that just stops)."""
        events = [event(chunk(p)) for p in pieces]
        if done:
            events += [event(chunk(None, "stop")), event(chunk(usage=USAGE)), b"data: [DONE]\n\n"]
        return cls(events=events)


def _answer(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": USAGE,
    }


class FaultUpstream:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url  # what a pool model's api_base takes
        self.calls = 0
        self._replies: deque[Reply] = deque()

    def script(self, *replies: Reply) -> None:
        """Queue the replies to the next requests, in order."""
        self._replies.extend(replies)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        body = orjson.loads(await request.read())
        reply = self._replies.popleft() if self._replies else None
        if reply is None:
            reply = Reply.chunks(["Hello", " there."]) if body.get("stream") else Reply()
        if reply.drop:
            if request.transport is not None:
                request.transport.close()
            return web.Response()  # never sent: the connection is gone
        if reply.status >= 400:
            error = {"error": {"message": "scripted failure", "type": "fault"}}
            return web.json_response(error, status=reply.status, headers=reply.headers)
        if reply.events is None:
            return web.json_response(reply.body or _answer("Hello there."), headers=reply.headers)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **reply.headers})
        await resp.prepare(request)
        for i, data in enumerate(reply.events):
            if i and reply.gap_s:
                await asyncio.sleep(reply.gap_s)
            await resp.write(data)
        return resp


@asynccontextmanager
async def fault_upstream() -> AsyncIterator[FaultUpstream]:
    holder: list[FaultUpstream] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        return await holder[0].handle(request)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    holder.append(FaultUpstream(f"http://127.0.0.1:{port}/v1"))
    try:
        yield holder[0]
    finally:
        await runner.cleanup()

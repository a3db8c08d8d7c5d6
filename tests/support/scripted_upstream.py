"""A scripted pool upstream: a real OpenAI-compatible HTTP server whose answers a test sets
per prompt, streamed chunk by chunk as the test writes them — for what the replay upstream
never sends (refusals, a tool call whose id comes in a later chunk, a call cut off by the
output limit). Each of a request's ``n`` choices is the answer set. Like OpenAI's API, it
refuses ``tool_choice`` and ``parallel_tool_calls`` in a request without tools.

    python -m tests.support.scripted_upstream --port-file F
    POST /_answers   {"<prompt>": {"message": {...}, "finish_reason": "stop",
                                   "deltas": [<delta>, ...]}}   (deltas: the stream's; by
                     default the message's text, refusal and tool calls, one delta each)
    GET  /_requests  every request body received, oldest first
    GET  /_headers   the headers of each of those requests (names lower-cased)

The prompt is the last user message's text; a prompt without an answer is answered
"Hello there.". ``ScriptedUpstream`` drives a running one; ``scripted_upstream`` starts one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiohttp import web

from tests.support.port_file_server import serve, start

USAGE = {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}
DEFAULT = {"message": {"role": "assistant", "content": "Hello there."}, "finish_reason": "stop"}


@dataclass
class ScriptedUpstream:
    base_url: str  # what a pool entry's api_base takes: http://127.0.0.1:<port>/v1
    control: httpx.Client

    def answer(
        self,
        prompt: str,
        message: dict[str, Any],
        finish_reason: str = "stop",
        deltas: list[dict[str, Any]] | None = None,
    ) -> None:
        """Answer ``prompt`` with ``message`` (JSON) or ``deltas`` (streamed)."""
        answer: dict[str, Any] = {
            "message": {"role": "assistant", **message},
            "finish_reason": finish_reason,
        }
        if deltas is not None:
            answer["deltas"] = deltas
        self.control.post("/_answers", json={prompt: answer}).raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        return list(self.control.get("/_requests").json())

    def headers(self) -> list[dict[str, str]]:
        return list(self.control.get("/_headers").json())


@contextmanager
def scripted_upstream(tmp: Path) -> Iterator[ScriptedUpstream]:
    proc, root = start("tests.support.scripted_upstream", tmp / "scripted-upstream.port")
    try:
        with httpx.Client(base_url=root, timeout=10) as control:
            yield ScriptedUpstream(f"{root}/v1", control)
    finally:
        proc.terminate()
        proc.wait(5)


# The server.


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _prompt(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, str):
                return content
            return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
    return ""


def _deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "assistant"}]
    for field in ("content", "refusal"):
        if message.get(field):
            out.append({field: message[field]})
    for i, call in enumerate(message.get("tool_calls") or []):
        out.append({"tool_calls": [{**call, "index": i}]})
    return out


async def set_answers(request: web.Request) -> web.Response:
    request.app["answers"].update(orjson.loads(await request.read()))
    return _json({"answers": len(request.app["answers"])})


async def get_requests(request: web.Request) -> web.Response:
    return _json(request.app["requests"])


async def get_headers(request: web.Request) -> web.Response:
    return _json(request.app["headers"])


async def chat(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    request.app["requests"].append(body)
    request.app["headers"].append({k.lower(): v for k, v in request.headers.items()})
    for field in ("tool_choice", "parallel_tool_calls"):
        if field in body and not body.get("tools"):
            message = f"Invalid value for '{field}': only allowed when 'tools' are specified."
            error = {"message": message, "type": "invalid_request_error", "param": field}
            return _json({"error": {**error, "code": None}}, 400)
    answer = request.app["answers"].get(_prompt(body.get("messages") or []), DEFAULT)
    base = {"id": "chatcmpl-scripted", "created": int(time.time()), "model": body.get("model")}
    n = body.get("n") or 1  # every choice the same answer
    if not body.get("stream"):
        message, finish = answer["message"], answer["finish_reason"]
        every = [{"index": k, "message": message, "finish_reason": finish} for k in range(n)]
        return _json({**base, "object": "chat.completion", "choices": every, "usage": USAGE})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    base["object"] = "chat.completion.chunk"
    deltas = answer.get("deltas") or _deltas(answer["message"])
    # A chunk per choice, the choices' deltas interleaved, as OpenAI streams several.
    choices = [[{"index": k, "delta": d, "finish_reason": None}] for d in deltas for k in range(n)]
    finish = answer["finish_reason"]
    choices += [[{"index": k, "delta": {}, "finish_reason": finish}] for k in range(n)]
    for c in choices:
        await response.write(b"data: " + orjson.dumps({**base, "choices": c}) + b"\n\n")
    if (body.get("stream_options") or {}).get("include_usage"):
        final = {**base, "choices": [], "usage": USAGE}
        await response.write(b"data: " + orjson.dumps(final) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def create_app() -> web.Application:
    app = web.Application()
    app["answers"] = {}
    app["requests"] = []
    app["headers"] = []
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/_answers", set_answers)
    app.router.add_get("/_requests", get_requests)
    app.router.add_get("/_headers", get_headers)
    return app


if __name__ == "__main__":
    serve(create_app)

"""A scripted router model: a real OpenAI-compatible HTTP server that answers each chat
completion with the next assistant message of a script, the way vLLM's tool parser emits
tool calls (``tool_calls`` with JSON-string ``arguments``, finish_reason ``tool_calls``).

    python -m tests.support.scripted_router --port-file F
    POST /_script   {"turns": [<assistant message>, ...], "usage": {"prompt_tokens": .., "completion_tokens": ..}}
                    ("usage": false: report no usage, as some servers do). A turn may also
                    carry "finish_reason" (sent instead of the one its content implies),
                    "delay_s" (answer that much later), "raw_choices" (the response's
                    choices, sent as given: malformed ones a real model may emit) or, with
                    "error_status", "retry_after" (sent as its retry-after header)
    GET  /_requests  every request body received since the last /_script
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import orjson
from aiohttp import web

from tests.support.port_file_server import serve


class Script:
    def __init__(self) -> None:
        self.turns: list[dict[str, Any]] = []
        self.usage: dict[str, int] | None = {"prompt_tokens": 100, "completion_tokens": 20}
        self.requests: list[dict[str, Any]] = []
        self.ids = itertools.count()


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def set_script(request: web.Request) -> web.Response:
    s: Script = request.app["script"]
    body = orjson.loads(await request.read())
    s.turns = list(body["turns"])
    usage = body.get("usage")
    s.usage = None if usage is False else usage or {"prompt_tokens": 100, "completion_tokens": 20}
    s.requests = []
    return _json({"turns": len(s.turns)})


async def get_requests(request: web.Request) -> web.Response:
    return _json(request.app["script"].requests)


async def chat(request: web.Request) -> web.Response:
    s: Script = request.app["script"]
    body = orjson.loads(await request.read())
    s.requests.append(body)
    if not s.turns:
        return _json(
            {
                "error": {
                    "message": "script exhausted",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            },
            500,
        )
    msg = dict(s.turns.pop(0))
    delay = msg.pop("delay_s", None)
    if delay:
        await asyncio.sleep(float(delay))
    finish_override = msg.pop("finish_reason", None)
    raw_choices = msg.pop("raw_choices", None)
    if msg.get("error_status"):
        failure = _json(
            {
                "error": {
                    "message": "scripted failure",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            },
            int(msg["error_status"]),
        )
        if "retry_after" in msg:
            failure.headers["retry-after"] = str(msg["retry_after"])
        return failure
    msg.setdefault("role", "assistant")
    msg.setdefault("content", None)
    finish = "stop"
    if msg.get("tool_calls"):
        finish = "tool_calls"
        msg["tool_calls"] = [
            {
                "id": tc.get("id") or f"chatcmpl-tool-{next(s.ids)}",
                "type": "function",
                "function": {
                    "name": tc["name"],
                    "arguments": tc["arguments"]
                    if isinstance(tc["arguments"], str)
                    else orjson.dumps(tc["arguments"]).decode(),
                },
            }
            for tc in msg["tool_calls"]
        ]
    u = s.usage
    out: dict[str, Any] = {
        "id": f"chatcmpl-script-{next(s.ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model"),
        "choices": [{"index": 0, "message": msg, "finish_reason": finish_override or finish}],
    }
    if raw_choices is not None:
        out["choices"] = raw_choices
    if u is not None:
        out["usage"] = {**u, "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}
    return _json(out)


def create_app() -> web.Application:
    app = web.Application()
    app["script"] = Script()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/_script", set_script)
    app.router.add_get("/_requests", get_requests)
    return app


if __name__ == "__main__":
    serve(create_app)

"""What the Responses API and the Messages API add to a request's CPU time: translating the
request into a chat request, and the chat answer back into a ``response`` / ``message``
object or its stream of events (``gateway.responses``, ``gateway.messages``). Everything
else a ``POST /v1/responses`` or ``/v1/messages`` does is the chat path's, measured by
``bench/gateway/run.sh`` (and the three paths side by side by ``bench/gateway/api_paths.sh``).

Runs the translation code on one thread, on a demo prompt's real recorded answer: the
request (parse + translate), the non-streamed answer, and the streamed answer as the chat
service sends it (one SSE chunk per 8 words, as the gateway re-streams a selected answer, or
per upstream chunk). Prints µs per request, p50 / p99.

Usage::

    .venv/bin/python bench/api_translation.py [--n 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a plain script from a checkout

from gateway import messages, responses  # noqa: E402
from gateway.messages.output import EventStream as MessageEvents  # noqa: E402
from gateway.messages.output import from_chat_completion as to_message  # noqa: E402
from gateway.responses.output import EventStream as ResponseEvents  # noqa: E402
from gateway.responses.output import from_chat_completion as to_response  # noqa: E402
from router.outcomes import load_outcome_table  # noqa: E402

log = logging.getLogger("api_translation")
DEMO = REPO_ROOT / "router" / "assets" / "demo_outcomes.jsonl"
MODEL = "mistral-small-24b-instruct-2501-bf16"


def chat_body(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-0123456789abcdef0123456789abcdef",
        "object": "chat.completion",
        "created": 1_795_000_000,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": 444,
            "completion_tokens": 134,
            "total_tokens": 578,
            "cost": 8.5e-05,
        },
        "xrouter": {"request_id": "0123456789abcdef0123456789abcdef", "policy": "compact"},
    }


def chat_chunks(text: str) -> list[bytes]:
    """The chat service's SSE for ``text``: role, 8-word deltas, finish, usage, [DONE]."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        c = {
            "id": "chatcmpl-x",
            "object": "chat.completion.chunk",
            "created": 1_795_000_000,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + orjson.dumps(c) + b"\n\n"

    words = text.split(" ")
    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": " ".join(words[i : i + 8]) + " "}) for i in range(0, len(words), 8)]
    out.append(chunk({}, "stop"))
    final = chat_body(text)
    final.update(object="chat.completion.chunk", choices=[])
    out.append(b"data: " + orjson.dumps(final) + b"\n\ndata: [DONE]\n\n")
    return out


def timed(fn: Callable[[], object], n: int) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(0.99 * (len(samples) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="requests per measurement")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rec = next(r for r in load_outcome_table(DEMO) if MODEL in r.outcomes)
    answer = rec.outcomes[MODEL].response or ""
    r_body = orjson.dumps(
        {
            "model": "xrouter",
            "instructions": "Answer briefly.",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": rec.text}]}],
            "max_output_tokens": 512,
        }
    )
    m_body = orjson.dumps(
        {
            "model": "xrouter",
            "system": "Answer briefly.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": rec.text}]}],
            "max_tokens": 512,
        }
    )
    r_req = responses.parse_request(orjson.loads(r_body))
    m_req = messages.parse_request(orjson.loads(m_body))
    chat = orjson.dumps(chat_body(answer))
    chunks = chat_chunks(answer)

    async def source() -> AsyncIterator[bytes]:
        for c in chunks:
            yield c

    async def drain(events: Any) -> int:
        return sum([len(b) async for b in events.translate(source())])

    loop = asyncio.new_event_loop()
    cases: list[tuple[str, Callable[[], object]]] = [
        (
            "responses: request -> chat request",
            lambda: orjson.dumps(responses.to_chat(responses.parse_request(orjson.loads(r_body)))),
        ),
        (
            "responses: chat completion -> response",
            lambda: orjson.dumps(to_response(r_req, orjson.loads(chat))),
        ),
        (
            f"responses: chat stream ({len(chunks)} chunks)",
            lambda: loop.run_until_complete(drain(ResponseEvents(r_req, "r", 0))),
        ),
        (
            "messages: request -> chat request",
            lambda: orjson.dumps(messages.to_chat(messages.parse_request(orjson.loads(m_body)))),
        ),
        (
            "messages: chat completion -> message",
            lambda: orjson.dumps(to_message(m_req, orjson.loads(chat))),
        ),
        (
            f"messages: chat stream ({len(chunks)} chunks)",
            lambda: loop.run_until_complete(drain(MessageEvents(m_req, "r"))),
        ),
    ]
    try:
        for name, fn in cases:
            timed(fn, min(200, args.n))  # warm-up
            p50, p99 = timed(fn, args.n)
            log.info("%-44s %8.1f µs p50 %8.1f µs p99", name, p50, p99)
    finally:
        loop.close()
    log.info("answer: %d characters; %d requests per figure", len(answer), args.n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

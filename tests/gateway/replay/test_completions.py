"""Chat completions against the real replay subprocess, through the official openai client."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import aiohttp
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from router.outcomes import OutcomeRecord
from tests.gateway.replay.conftest import ReplayServer

WEATHER_TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a place",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1},
                    "hourly": {"type": "boolean"},
                },
                "required": ["location", "unit", "days", "hourly"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert",
            "parameters": {
                "type": "object",
                "properties": {"amount": {"type": "number"}, "to": {"enum": ["EUR", "USD"]}},
                "required": ["amount", "to"],
            },
        },
    },
]


def _pick(records: list[OutcomeRecord], min_tokens: int = 0) -> tuple[OutcomeRecord, str]:
    """A record and a model whose recorded response has at least ``min_tokens`` tokens."""
    for rec in records:
        for model, out in rec.outcomes.items():
            if out.response and (out.completion_tokens or 0) >= max(min_tokens, 1):
                return rec, model
    raise AssertionError("no suitable record in the demo table")


def test_known_prompts_replay_recorded_answers(
    client: openai.OpenAI, demo_records: list[OutcomeRecord]
) -> None:
    for rec in demo_records[::97]:
        for model, out in list(rec.outcomes.items())[::3]:
            resp = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": rec.text}]
            )
            assert resp.id.startswith("chatcmpl-replay-")
            assert resp.model == model and resp.object == "chat.completion"
            assert resp.system_fingerprint
            assert resp.choices[0].message.content == out.response
            assert resp.choices[0].finish_reason == "stop"
            assert resp.usage is not None
            assert resp.usage.prompt_tokens == out.prompt_tokens
            assert resp.usage.completion_tokens == out.completion_tokens


def test_prompt_lookup_ignores_whitespace_parts_and_history(
    client: openai.OpenAI, demo_records: list[OutcomeRecord]
) -> None:
    rec, model = _pick(demo_records[10:])
    messages: list[Any] = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "an earlier question"},
        {"role": "assistant", "content": "an earlier answer"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "  " + rec.text.replace(" ", "\n ")}],
        },
    ]
    resp = client.chat.completions.create(model=model, messages=messages)
    assert resp.choices[0].message.content == rec.outcomes[model].response


def test_unknown_prompt_is_deterministic_per_model(client: openai.OpenAI) -> None:
    models = [m.id for m in client.models.list()]
    assert len(models) == 8

    def ask(model: str, text: str) -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}]
        )

    a1, a2 = ask(models[0], "a prompt nobody recorded"), ask(models[0], "a prompt nobody recorded")
    b = ask(models[1], "a prompt nobody recorded")
    c = ask(models[0], "another prompt nobody recorded")
    content = a1.choices[0].message.content
    assert content and content == a2.choices[0].message.content
    assert content != b.choices[0].message.content
    assert content != c.choices[0].message.content
    assert a1.id != a2.id
    assert a1.usage is not None  # synthesized content: the documented ceil(chars / 4) estimate
    assert a1.usage.completion_tokens == math.ceil(len(content) / 4)
    assert a1.usage.prompt_tokens == math.ceil(len("a prompt nobody recorded") / 4)


def test_streaming_chunk_order_and_usage(
    client: openai.OpenAI, demo_records: list[OutcomeRecord]
) -> None:
    rec, model = _pick(demo_records, min_tokens=50)
    out = rec.outcomes[model]
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": rec.text}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-replay-")
    assert all(c.model == model and c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    content_chunks = [c for c in chunks[1:-2] if c.choices[0].delta.content]
    assert len(content_chunks) == len(chunks) - 3 > 3  # several small deltas, nothing else
    assert "".join(c.choices[0].delta.content or "" for c in content_chunks) == out.response
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == out.prompt_tokens
    assert chunks[-1].usage.completion_tokens == out.completion_tokens


async def test_raw_stream_ends_with_done_and_no_usage_unless_asked(replay: ReplayServer) -> None:
    body = {
        "model": "gemma-2-9b-it",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{replay.base_url}/chat/completions", json=body) as r,
    ):
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: ") :])
    assert last["choices"][0]["finish_reason"] == "stop" and "usage" not in last


def test_max_tokens_truncates(client: openai.OpenAI, demo_records: list[OutcomeRecord]) -> None:
    rec, model = _pick(demo_records, min_tokens=40)
    out = rec.outcomes[model]
    assert out.response and out.completion_tokens
    messages: Any = [{"role": "user", "content": rec.text}]
    resp = client.chat.completions.create(model=model, messages=messages, max_tokens=10)
    text = resp.choices[0].message.content or ""
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 10
    assert out.response.startswith(text)
    assert abs(len(text) - len(out.response) * 10 / out.completion_tokens) <= 1
    # max_completion_tokens wins over max_tokens; a limit above the length changes nothing.
    resp = client.chat.completions.create(
        model=model, messages=messages, max_tokens=5, max_completion_tokens=out.completion_tokens
    )
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.content == out.response
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=10, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_choices(client: openai.OpenAI, demo_records: list[OutcomeRecord]) -> None:
    rec, model = _pick(demo_records)
    out = rec.outcomes[model]
    resp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": rec.text}], n=2
    )
    assert [c.index for c in resp.choices] == [0, 1]
    assert all(c.message.content == out.response for c in resp.choices)
    assert resp.usage is not None and resp.usage.completion_tokens == 2 * (
        out.completion_tokens or 0
    )
    assert resp.usage.prompt_tokens == out.prompt_tokens


def test_tools_round_trip(client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    resp = client.chat.completions.create(
        model="gemma-2-9b-it", messages=messages, tools=WEATHER_TOOLS
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1 and calls[0].type == "function"
    call = calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER_TOOLS[0]["function"]["parameters"])
    assert args["unit"] == "celsius"

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "21 degrees and sunny"},
    ]
    final = client.chat.completions.create(
        model="gemma-2-9b-it", messages=messages, tools=WEATHER_TOOLS
    )
    assert final.choices[0].finish_reason == "stop"
    assert "21 degrees and sunny" in (final.choices[0].message.content or "")

    forced = client.chat.completions.create(
        model="gemma-2-9b-it",
        messages=messages[:1],
        tools=WEATHER_TOOLS,
        tool_choice={"type": "function", "function": {"name": "convert"}},
    )
    forced_calls = forced.choices[0].message.tool_calls
    assert forced_calls is not None and forced_calls[0].type == "function"
    forced_fn = forced_calls[0].function
    assert forced_fn.name == "convert"
    jsonschema.validate(json.loads(forced_fn.arguments), WEATHER_TOOLS[1]["function"]["parameters"])
    plain = client.chat.completions.create(
        model="gemma-2-9b-it", messages=messages[:1], tools=WEATHER_TOOLS, tool_choice="none"
    )
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content

    # The streamed tool call assembles to the same call.
    stream = client.chat.completions.create(
        model="gemma-2-9b-it", messages=messages[:1], tools=WEATHER_TOOLS, stream=True
    )
    chunks = list(stream)
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert (
        deltas[0].id == call.id and deltas[0].function and deltas[0].function.name == "get_weather"
    )
    assert (
        "".join((d.function.arguments or "") for d in deltas if d.function)
        == call.function.arguments
    )
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


class Step(BaseModel):
    explanation: str
    output: int


class MathAnswer(BaseModel):
    steps: list[Step]
    final_answer: str
    confident: bool


def test_json_object_and_json_schema(
    client: openai.OpenAI, demo_records: list[OutcomeRecord]
) -> None:
    rec, model = _pick(demo_records)
    messages: Any = [{"role": "user", "content": rec.text}]
    resp = client.chat.completions.create(
        model=model, messages=messages, response_format={"type": "json_object"}
    )
    assert json.loads(resp.choices[0].message.content or "") == {
        "answer": rec.outcomes[model].response
    }

    schema: Any = {
        "type": "object",
        "properties": {
            "answer": {"type": "string"},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "labels": {"type": "array", "items": {"enum": ["a", "b"]}},
        },
        "required": ["answer", "confidence", "labels"],
    }
    resp = client.chat.completions.create(
        model=model,
        messages=messages,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    jsonschema.validate(json.loads(resp.choices[0].message.content or ""), schema)

    parsed = client.chat.completions.parse(
        model=model, messages=messages, response_format=MathAnswer
    )
    answer = parsed.choices[0].message.parsed
    assert isinstance(answer, MathAnswer) and answer.steps and isinstance(answer.steps[0], Step)


def test_errors_are_openai_shaped(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(
            model="gpt-nonexistent", messages=[{"role": "user", "content": "x"}]
        )
    assert exc.value.status_code == 404
    assert isinstance(exc.value.body, dict) and exc.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gemma-2-9b-it", messages=[])


@pytest.mark.parametrize(
    ("payload", "param"),
    [(b"{not json", None), (b'{"model": "gemma-2-9b-it"}', "messages"), (b"[1, 2]", None)],
)
async def test_malformed_requests_get_400(
    replay: ReplayServer, payload: bytes, param: str | None
) -> None:
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{replay.base_url}/chat/completions", data=payload, headers=headers
        ) as r:
            assert r.status == 400
            error = (await r.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param


async def test_async_client_concurrent_and_streaming(
    aclient: openai.AsyncOpenAI, demo_records: list[OutcomeRecord]
) -> None:
    jobs = [(rec, model) for rec in demo_records[::60] for model in list(rec.outcomes)[:2]]
    results = await asyncio.gather(
        *(
            aclient.chat.completions.create(model=m, messages=[{"role": "user", "content": r.text}])
            for r, m in jobs
        )
    )
    for (rec, model), resp in zip(jobs, results, strict=True):
        assert resp.choices[0].message.content == rec.outcomes[model].response
    rec, model = jobs[0]
    stream = await aclient.chat.completions.create(
        model=model, messages=[{"role": "user", "content": rec.text}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == rec.outcomes[model].response


def test_models_health_and_stats(client: openai.OpenAI, replay: ReplayServer) -> None:
    assert replay.http.get("/health").json() == {"status": "ok"}
    models = [m.id for m in client.models.list()]
    msg: Any = [{"role": "user", "content": "count me"}]
    for model in (models[0], models[0], models[0], models[1]):
        client.chat.completions.create(model=model, messages=msg)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=msg)
    stats = replay.http.get("/_replay/stats").json()
    assert stats["requests"] == {models[0]: 3, models[1]: 1}
    assert stats["total"] == 5 and stats["faults"] == {}
    assert replay.http.post("/_replay/reset").json()["total"] == 0
    assert replay.http.get("/_replay/stats").json() == {
        "total": 0,
        "requests": {},
        "faults": {},
        "streams_abandoned": 0,
    }

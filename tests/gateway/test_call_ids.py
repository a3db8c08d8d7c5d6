"""Tool calls a model gave without an id, on the Chat Completions API (``gateway.call_ids``):
the real OpenAI SDK against the gateway under uvicorn and a scripted upstream that sends
calls with no id, streamed and not — each gets ``call_<request id>_<index>``, and the next
turn, which sends the calls and their results back, is accepted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import openai
import pytest
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessage,
    ChatCompletionMessageParam,
    ChatCompletionToolUnionParam,
)

from tests.support.gateway import Gateway, gateway_config, start_gateway
from tests.support.scripted_upstream import ScriptedUpstream, scripted_upstream
from tests.support.sdk import WEATHER_TOOL, extra

MODEL = "mistral-small-24b-instruct-2501-bf16"
TOOLS: list[ChatCompletionToolUnionParam] = [WEATHER_TOOL]
CITIES = ["Paris", "Rome", "Oslo", "Lima"]
# The ways an upstream leaves a call without a usable id, and one that has its own.
GIVEN: list[dict[str, Any]] = [{}, {"id": "call_up"}, {"id": None}, {"id": ""}]
CALLS = [
    {**given, "type": "function",
     "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}
    for given, city in zip(GIVEN, CITIES, strict=True)
]  # fmt: skip
# Streamed: each call's name first (with its id, if any), then its arguments in two pieces.
DELTAS: list[dict[str, Any]] = [{"role": "assistant", "content": None}] + [
    {"tool_calls": [d]}
    for i, (given, city) in enumerate(zip(GIVEN, CITIES, strict=True))
    for d in (
        {**given, "index": i, "type": "function",
         "function": {"name": "get_weather", "arguments": ""}},
        {"index": i, "function": {"arguments": '{"city": '}},
        {"index": i, "function": {"arguments": f'"{city}"}}'}},
    )
]  # fmt: skip
# An id that comes in a later delta than the call's first, and a call with its own id in
# its first delta and again in a later one.
LATE: list[dict[str, Any]] = [
    {"role": "assistant", "content": None},
    {"tool_calls": [{"index": 0, "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": '}}]},
    {"tool_calls": [{"index": 0, "id": "call_late", "function": {"arguments": '"Paris"}'}}]},
    {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": '}}]},
    {"tool_calls": [{"index": 1, "id": "call_b", "function": {"arguments": '"Rome"}'}}]},
]  # fmt: skip
PROMPTS = ("plain", "streamed", "several", "cached", "late")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedUpstream]:
    tmp = tmp_path_factory.mktemp("call-ids-upstream")
    with scripted_upstream(tmp) as upstream:
        for prompt in PROMPTS:
            deltas = LATE if prompt == "late" else DELTAS
            upstream.answer(prompt, {"content": None, "tool_calls": CALLS}, "tool_calls", deltas)
        yield upstream


@pytest.fixture(scope="module")
def gw(up: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp: Path = tmp_path_factory.mktemp("call-ids")
    gateway = start_gateway(tmp, gateway_config(tmp, up.base_url, cache={"enabled": True}))
    yield gateway
    gateway.stop()


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


def ids(message: ChatCompletionMessage) -> list[str]:
    return [c.id for c in message.tool_calls or []]


def expected(request_id: str, choice: int = 0) -> list[str]:
    ours = f"call_{request_id}_" if choice == 0 else f"call_{request_id}_{choice}_"
    return [f"{ours}0", "call_up", f"{ours}2", f"{ours}3"]


def request_id(answer: ChatCompletion) -> str:
    return answer.id.removeprefix("chatcmpl-")


def follow_up(
    gw: Gateway, up: ScriptedUpstream, prompt: str, message: ChatCompletionMessage
) -> list[dict[str, Any]]:
    """Send the assistant's message (as the SDK gave it) and a result for each of its calls
    back, as the next turn; the messages the upstream was sent."""
    turn: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": prompt},
        cast(ChatCompletionAssistantMessageParam, message.model_dump(exclude_none=True)),
    ]
    turn += [{"role": "tool", "tool_call_id": i, "content": "20C"} for i in ids(message)]
    raw = client(gw).chat.completions.with_raw_response.create(
        model=MODEL, messages=turn, tools=TOOLS
    )
    assert raw.status_code == 200
    return list(up.requests()[-1]["messages"])


def test_a_plain_answer_names_each_call_and_the_next_turn_is_accepted(
    gw: Gateway, up: ScriptedUpstream
) -> None:
    """The calls went to the client without ids; sent back, the chat service's own checks
    refused the turn (a call needs its id, a tool result names a call)."""
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "plain"}]
    answer = client(gw).chat.completions.create(model=MODEL, messages=ask, tools=TOOLS)
    message = answer.choices[0].message
    assert ids(message) == expected(request_id(answer))
    sent = follow_up(gw, up, "plain", message)
    assert [c["id"] for c in sent[1]["tool_calls"]] == ids(message)
    assert [m["tool_call_id"] for m in sent[2:]] == ids(message)


def test_a_stream_names_each_call_once_and_the_next_turn_is_accepted(
    gw: Gateway, up: ScriptedUpstream
) -> None:
    """The id comes on a call's first delta only: the SDK concatenates a call's id pieces."""
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "streamed"}]
    with client(gw).chat.completions.stream(model=MODEL, messages=ask, tools=TOOLS) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk" and e.chunk.choices]
        final = stream.get_final_completion()
    rid = request_id(final)
    message = final.choices[0].message
    assert ids(message) == expected(rid)
    said = [(tc.index, tc.id) for ch in chunks for tc in ch.choices[0].delta.tool_calls or []]
    assert [(i, x) for i, x in said if x is not None] == list(enumerate(expected(rid)))
    follow_up(gw, up, "streamed", message)


def test_several_choices_name_their_calls_apart(gw: Gateway) -> None:
    """Each choice's calls are indexed from 0: a later choice's ids have its index too."""
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "several"}]
    plain = client(gw).chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, n=2)
    with client(gw).chat.completions.stream(model=MODEL, messages=ask, tools=TOOLS, n=2) as stream:
        streamed = stream.get_final_completion()
    for answer in (plain, streamed):
        rid = request_id(answer)
        assert [ids(c.message) for c in answer.choices] == [expected(rid), expected(rid, 1)]


def test_an_answer_from_the_cache_names_its_calls_by_the_request_that_served_it(
    gw: Gateway,
) -> None:
    """The cache keeps the model's answer: each hit, plain or streamed, names the calls by
    its own request id, as an answer routed afresh would."""
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "cached"}]
    first = client(gw).chat.completions.create(model=MODEL, messages=ask, tools=TOOLS)
    assert ids(first.choices[0].message) == expected(request_id(first))
    deadline = time.monotonic() + 5
    while True:  # stored in the background
        raw = client(gw).chat.completions.with_raw_response.create(
            model=MODEL, messages=ask, tools=TOOLS
        )
        if raw.headers["x-xrouter-cache"] == "hit" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert raw.headers["x-xrouter-cache"] == "hit"
    hit = raw.parse()
    assert ids(hit.choices[0].message) == expected(request_id(hit))
    with client(gw).chat.completions.stream(model=MODEL, messages=ask, tools=TOOLS) as stream:
        last = [e.chunk for e in stream if e.type == "chunk"][-1]
        streamed = stream.get_final_completion()
    assert extra(last)["xrouter"]["cache"]["hit"]
    assert ids(streamed.choices[0].message) == expected(request_id(streamed))
    assert request_id(streamed) != request_id(hit) != request_id(first)


def test_an_id_that_comes_after_the_call_s_first_delta_is_not_relayed(gw: Gateway) -> None:
    """The call was given an id on its first delta: the upstream's later one, relayed, was
    appended to it by the SDK. A call with its id from the start is relayed as it came, but
    for the same id sent again in a later delta, which the SDK joined into ``call_bcall_b``."""
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "late"}]
    with client(gw).chat.completions.stream(model=MODEL, messages=ask, tools=TOOLS) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk" and e.chunk.choices]
        final = stream.get_final_completion()
    rid = request_id(final)
    assert ids(final.choices[0].message) == [f"call_{rid}_0", "call_b"]
    said = [tc.id for ch in chunks for tc in ch.choices[0].delta.tool_calls or []]
    assert [x for x in said if x is not None] == [f"call_{rid}_0", "call_b"]

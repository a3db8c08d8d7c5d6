"""The Responses API (`POST /v1/responses`) end to end: the real OpenAI SDK's
`client.responses` against the gateway under uvicorn and the replay upstream — answers,
streams, function tools, structured output, truncation, errors, feedback and the ledger."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import (
    FunctionToolParam,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
)
from openai.types.responses.response_input_param import ResponseInputParam
from pydantic import BaseModel

from pricing import TokenUsage, load_default_catalog
from router.outcomes import OutcomeRecord
from tests.gateway.conftest import Upstream, hang_up_at, ledger_rows, longest_answer
from tests.support.gateway import Gateway, gateway_config, start_gateway
from tests.support.scripted_upstream import ScriptedUpstream, scripted_upstream
from tests.support.sdk import extra

MODEL = "mistral-small-24b-instruct-2501-bf16"
WEATHER: FunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": False,
}


class Prime(BaseModel):
    answer: str


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


def test_a_response_carries_the_routed_answer_its_cost_and_its_id(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    rec = next(r for r in demo_table if MODEL in r.outcomes)
    raw = client(gateway).responses.with_raw_response.create(model=MODEL, input=rec.text)
    resp = raw.parse()
    out = rec.outcomes[MODEL]
    assert resp.object == "response" and resp.status == "completed" and resp.model == MODEL
    assert resp.output_text == out.response
    [item] = resp.output
    assert isinstance(item, ResponseOutputMessage) and item.role == "assistant"
    assert resp.usage is not None
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (
        out.prompt_tokens,
        out.completion_tokens,
    )
    meta = extra(resp)["xrouter"]
    price = load_default_catalog().require(MODEL)
    assert out.prompt_tokens is not None and out.completion_tokens is not None
    cost = price.cost_micros(TokenUsage(out.prompt_tokens, out.completion_tokens)) / 1e6
    assert extra(resp.usage)["cost"] == pytest.approx(meta["cost_usd"]) == pytest.approx(cost)
    # One id for the response, the ledger and feedback.
    rid = raw.headers["x-xrouter-request-id"]
    assert resp.id == f"resp_{rid}" == f"resp_{meta['request_id']}"
    fb = httpx.post(f"{gateway.base_url}/feedback", json={"request_id": resp.id, "score": 1})
    assert fb.status_code == 200 and fb.json()["request_id"] == rid
    (status, stream, total), [call] = ledger_rows(gateway, rid)
    assert (status, stream) == (200, 0) and call[0] == MODEL and total > 0


def test_routed_by_the_router_with_instructions_and_routing_controls(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    rec = demo_table[3]
    allowed = sorted(rec.outcomes)[:2]
    resp = client(gateway).responses.create(
        model="xrouter",
        instructions="Answer briefly.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": rec.text}]}],
        extra_body={"xrouter": {"cost_weight": 1.0, "models": allowed}},
    )
    d = extra(resp)["xrouter"]["decision"]
    assert d["policy"] == "compact" and set(d["distribution"]) <= set(allowed)
    assert resp.model in allowed and resp.output_text == rec.outcomes[resp.model].response


def test_streams_typed_events_that_add_up_to_the_answer(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    rec = longest_answer(demo_table, MODEL)
    with client(gateway).responses.stream(model=MODEL, input=rec.text) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created = events[0]
    assert created.type == "response.created" and created.response.status == "in_progress"
    assert created.response.output == []
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == rec.outcomes[MODEL].response
    assert final.output_text == rec.outcomes[MODEL].response and final.status == "completed"
    assert final.usage is not None and extra(final.usage)["cost"] > 0
    rid = final.id.removeprefix("resp_")
    (status, stream_flag, _), _ = ledger_rows(gateway, rid)
    assert (status, stream_flag) == (200, 1)


def test_a_streamed_answer_the_router_selected(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    # The agreement cascade buys two answers and returns one: the chat service streams the
    # selected text (not an upstream stream), and the events carry it the same way.
    rec = demo_table[5]
    with client(gateway).responses.stream(model="xrouter/cascade", input=rec.text) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.status == "completed" and deltas == final.output_text
    # The answering model is known when the stream starts, and said from the first event.
    assert events[0].type == "response.created" and events[0].response.model == final.model
    assert final.model != "xrouter/cascade"
    assert final.output_text == rec.outcomes[final.model].response
    calls = extra(final)["xrouter"]["calls"]
    assert len(calls) >= 2 and final.model in {c["model"] for c in calls}


def test_function_tools_round_trip(gateway: Gateway) -> None:
    c = client(gateway)
    first = c.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])
    [call] = first.output
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "get_weather"
    assert "city" in json.loads(call.arguments) and call.call_id
    history: ResponseInputParam = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"},
    ]
    second = c.responses.create(model=MODEL, input=history, tools=[WEATHER])
    assert "sunny, 21C" in second.output_text


def test_namespaced_tools_come_back_namespaced_and_hosted_tools_are_left_out(
    gateway: Gateway,
) -> None:
    """As Codex sends them: its sub-agent tools in a namespace, and OpenAI's web search."""
    tools: list[Any] = [
        {"type": "web_search", "external_web_access": False},
        {"type": "namespace", "name": "weather", "description": "Weather tools",
         "tools": [{**WEATHER, "name": "current"}]},
    ]  # fmt: skip
    c = client(gateway)
    resp = c.responses.create(model=MODEL, input="Weather in Paris?", tools=tools)
    [call] = resp.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert (call.namespace, call.name) == ("weather", "current")
    assert extra(resp)["xrouter"]["ignored_tools"] == ["web_search"]
    with c.responses.stream(model=MODEL, input="Weather in Paris?", tools=tools) as stream:
        events = list(stream)
    added = [e for e in events if e.type == "response.output_item.added"]
    assert isinstance(added[0].item, ResponseFunctionToolCall)
    assert (added[0].item.namespace, added[0].item.name) == ("weather", "current")


def test_a_streamed_function_call_comes_as_argument_events(gateway: Gateway) -> None:
    with client(gateway).responses.stream(
        model=MODEL,
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    [call] = final.output
    assert isinstance(call, ResponseFunctionToolCall) and call.status == "completed"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args == call.arguments == done[0].arguments and "city" in json.loads(args)


def test_structured_output_and_truncation(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    c = client(gateway)
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    resp = c.responses.create(
        model=MODEL,
        input="Name a prime number.",
        text={"format": {"type": "json_schema", "name": "prime", "schema": schema, "strict": True}},
    )
    assert set(json.loads(resp.output_text)) == {"answer"}
    # The SDK's structured-output helper: a pydantic model in, a parsed instance out.
    parsed = c.responses.parse(model=MODEL, input="Name a prime number.", text_format=Prime)
    assert isinstance(parsed.output_parsed, Prime) and parsed.output_parsed.answer
    rec = longest_answer(demo_table, MODEL)
    cut = c.responses.create(model=MODEL, input=rec.text, max_output_tokens=16)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage is not None and cut.usage.output_tokens == 16
    assert (rec.outcomes[MODEL].response or "").startswith(cut.output_text)


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"model": MODEL, "input": "x", "previous_response_id": "resp_1"}, 400,
         "previous_response_id", "unsupported_parameter"),
        ({"model": MODEL, "input": "x", "tool_choice": {"type": "web_search"}}, 400,
         "tool_choice", "unsupported_parameter"),
        ({"model": MODEL, "input": [{"type": "item_reference", "id": "msg_1"}]}, 400,
         "input[0].type", "unsupported_parameter"),
        ({"model": MODEL, "input": [{"role": "robot", "content": "x"}]}, 400,
         "input[0].role", None),
        ({"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_file"}]}]}, 400,
         "input[0].content[0].type", "unsupported_parameter"),
        ({"model": MODEL}, 400, "input", None),
        ({"model": MODEL, "input": 7}, 400, "input", None),
        ({"model": MODEL, "input": "x", "max_output_tokens": 0}, 400, "max_output_tokens", None),
        ({"model": MODEL, "input": "x", "text": {"format": {"type": "yaml"}}}, 400,
         "text.format.type", None),
        # A schema format's name, checked by the chat service: named where the client put it
        # (text.format holds the chat json_schema object's fields), not as text.format.
        ({"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema",
          "schema": {"type": "object"}}}}, 400, "text.format.name", None),
        ({"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema",
          "name": "a prime", "schema": {"type": "object"}}}}, 400, "text.format.name", None),
        ({"model": "no-such-model", "input": "x"}, 404, "model", "model_not_found"),
        # A message without content: the chat check's 400, naming the input item, whose
        # index is not the chat message's (instructions first, a turn's call merged).
        ({"model": MODEL, "input": [{"role": "user", "content": []}]}, 400,
         "input[0].content", None),
        ({"model": MODEL, "instructions": "Be brief.", "input": [
            {"role": "user", "content": "hi"}, {"role": "user", "content": []}]}, 400,
         "input[1].content", None),
        ({"model": MODEL, "tools": [WEATHER], "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"role": "developer", "content": []}]}, 400, "input[4].content", None),
        ({"model": MODEL, "input": "x", "xrouter": {"cost_weight": -1}}, 400,
         "xrouter.cost_weight", None),
        # Malformed where the translation reads it (a 500 once), not where pydantic does.
        ({"model": MODEL, "input": "x", "tools": [{"type": "namespace", "name": "ns",
          "tools": [1]}]}, 400, "tools[0].tools[0]", None),
        ({"model": MODEL, "input": "x", "tools": [{"type": "namespace", "name": "ns",
          "tools": "abc"}]}, 400, "tools[0].tools", None),
        ({"model": MODEL, "input": [{"role": ["user"], "content": "x"}]}, 400,
         "input[0].role", None),
        ({"model": MODEL, "input": [{"type": "message", "role": {"a": 1}, "content": "x"}]},
         400, "input[0].role", None),
        # Forcing a call with no function to call (chat would refuse it: a 502 once).
        ({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}],
          "tool_choice": "required"}, 400, "tool_choice", None),
        ({"model": MODEL, "input": "x", "tools": [WEATHER],
          "tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice.name", None),
        # A function output's file part, named by its index.
        ({"model": MODEL, "input": [
            {"role": "user", "content": "x"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_text", "text": "see"}, {"type": "input_file", "file_id": "f"}]},
         ], "tools": [WEATHER]}, 400, "input[2].output[1].type", "unsupported_parameter"),
        # The chat service's validation, naming the field the client sent.
        ({"model": MODEL, "input": "x", "tools": [{"type": "function", "name": "f",
          "parameters": "x"}]}, 400, "tools[0].parameters", None),
        ({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}, {
          "type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f",
          "description": 5}]}]}, 400, "tools[1].tools[0].description", None),
        # A namespaced function's chat name is <namespace>__<name>: too long for chat, named
        # and explained as the client wrote it (not as a length its name does not have).
        ({"model": MODEL, "input": "x", "tools": [{"type": "namespace", "name": "n" * 40,
          "tools": [{"type": "function", "name": "f" * 30}]}]}, 400, "tools[0].tools[0].name",
         None),
    ],
)  # fmt: skip
def test_bad_requests_get_an_openai_error(
    gateway: Gateway, body: dict, status: int, param: str, code: str | None
) -> None:
    r = httpx.post(f"{gateway.base_url}/responses", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]
    if status == 400:
        assert err["message"].startswith(f"{param}: ")
    if code is not None:
        assert err["code"] == code
    assert r.headers["x-xrouter-request-id"]


def test_a_request_refused_in_translation_is_accounted_as_a_chat_request_is(
    gateway: Gateway,
) -> None:
    """Refused before it became a chat request, it still gets a request id, a ledger row
    and its count in the request metrics, as the same mistake on chat completions does."""

    def refused_responses() -> float:
        metrics = httpx.get(f"{gateway.url}/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("xrouter_requests_total{")
            and 'api="responses"' in line
            and 'status_class="4xx"' in line
        )

    before = refused_responses()
    r = httpx.post(
        f"{gateway.base_url}/responses",
        json={"model": MODEL, "input": [{"role": "robot", "content": "x"}]},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].role"
    rid = r.headers["x-xrouter-request-id"]
    (status, stream_flag, total), calls = ledger_rows(gateway, rid)
    assert (status, stream_flag, total, calls) == (400, 0, 0, [])
    with sqlite3.connect(gateway.config_path.parent / "ledger.db") as conn:
        row = conn.execute(
            "SELECT api, error_type FROM requests WHERE request_id = ?", (rid,)
        ).fetchone()
    assert row == ("responses", "invalid_request_error")
    assert refused_responses() == before + 1


@pytest.fixture(scope="module")
def scripted(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Gateway, ScriptedUpstream]]:
    """A gateway whose pool is the scripted upstream: answers the replay upstream never
    gives (late tool-call ids, calls cut off), and chat's refusal of tool_choice without
    tools."""
    tmp = tmp_path_factory.mktemp("scripted")
    with scripted_upstream(tmp) as up:
        gw = start_gateway(tmp, gateway_config(tmp, up.base_url))
        try:
            yield gw, up
        finally:
            gw.stop()


def test_tool_settings_are_not_forwarded_without_a_function_to_call(
    scripted: tuple[Gateway, ScriptedUpstream],
) -> None:
    gw, up = scripted
    c = client(gw)
    web: list[Any] = [{"type": "web_search"}]
    for kw in (
        {"tools": web, "tool_choice": "auto", "parallel_tool_calls": True},
        {"tools": web, "tool_choice": "none"},
        {"parallel_tool_calls": False},
    ):
        resp = c.responses.create(model=MODEL, input="Say hello.", **kw)
        assert resp.status == "completed" and resp.output_text == "Hello there."
    sent = up.requests()[-3:]
    assert not any({"tools", "tool_choice", "parallel_tool_calls"} & r.keys() for r in sent)
    # With a function to call, they go with it.
    c.responses.create(
        model=MODEL, input="Say hello.", tools=[WEATHER], tool_choice="auto",
        parallel_tool_calls=False,
    )  # fmt: skip
    last = up.requests()[-1]
    assert (last["tool_choice"], last["parallel_tool_calls"]) == ("auto", False)


PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
    "DwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def test_a_function_output_with_images(scripted: tuple[Gateway, ScriptedUpstream]) -> None:
    """As the Agents SDK sends a tool's image output: parts, text and images. The text is
    the chat tool message; the images follow the turn's outputs as a user message."""
    gw, up = scripted
    history: ResponseInputParam = [
        {"role": "user", "content": "Chart the weather."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "chart: "},
            {"type": "input_image", "image_url": PIXEL, "detail": "low"},
            {"type": "input_text", "text": "Paris"},
        ]},
        {"type": "function_call_output", "call_id": "c2", "output": "no chart"},
        {"role": "user", "content": "Thanks."},
    ]  # fmt: skip
    resp = client(gw).responses.create(model=MODEL, input=history, tools=[WEATHER])
    assert resp.status == "completed"
    messages = up.requests()[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "user", "user"]
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "chart: Paris"}
    assert messages[4] == {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": PIXEL, "detail": "low"}}],
    }


def test_an_image_detail_openai_refuses_is_400(
    scripted: tuple[Gateway, ScriptedUpstream],
) -> None:
    """An ``input_image``'s ``detail`` is checked as OpenAI checks it (it was dropped), and
    the 400 names the client's part, not the chat message's; nothing is forwarded."""
    gw, up = scripted
    sent = len(up.requests())
    image = {"type": "input_image", "image_url": PIXEL, "detail": "max"}
    history: Any = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}, image]}]
    with pytest.raises(openai.BadRequestError) as ei:
        client(gw).responses.create(model=MODEL, instructions="Be brief.", input=history)
    err = ei.value.body
    assert isinstance(err, dict) and err["param"] == "input[0].content[1].detail"
    assert err["message"].startswith("input[0].content[1].detail")
    assert "'auto', 'low' or 'high'" in err["message"]
    assert len(up.requests()) == sent


def test_a_call_whose_id_comes_after_other_output_keeps_its_identity(
    scripted: tuple[Gateway, ScriptedUpstream],
) -> None:
    """Text and another call come between a call's first piece and its id: the call is held
    until its id comes (it was announced without one, and the SDK refused the stream when
    the id changed), and the stream's items are the JSON answer's, ids and order."""
    gw, up = scripted
    paris = {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    rome = {
        "id": "call_b",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
    }
    up.answer("id after text", {"content": "Checking.", "tool_calls": [paris, rome]},
              "tool_calls", deltas=[
        {"role": "assistant"},
        {"tool_calls": [{"index": 0, "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": '}}]},
        {"content": "Checking."},
        {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"tool_calls": [{"index": 0, "id": "call_a", "function": {"arguments": '"Paris"}'}}]},
    ])  # fmt: skip
    c = client(gw)
    with c.responses.stream(model=MODEL, input="id after text", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    plain = c.responses.create(model=MODEL, input="id after text", tools=[WEATHER])

    for resp in (final, plain):
        message, *called = resp.output
        assert isinstance(message, ResponseOutputMessage) and len(called) == 2
        assert [(o.id, o.call_id) for o in called if isinstance(o, ResponseFunctionToolCall)] == [
            ("fc_call_a", "call_a"),
            ("fc_call_b", "call_b"),
        ]
    # Every event names each item as the final response does, under the same output index.
    ids = [f"msg_{final.id.removeprefix('resp_')}", "fc_call_a", "fc_call_b"]
    for kind in ("response.output_item.added", "response.output_item.done"):
        said = [e for e in events if e.type == kind]
        assert [(e.output_index, e.item.id) for e in said] == list(enumerate(ids))
    pieces = [e for e in events if e.type == "response.function_call_arguments.delta"]
    for index, item in enumerate(final.output[1:], start=1):
        assert isinstance(item, ResponseFunctionToolCall)
        mine = [e for e in pieces if e.item_id == item.id]
        assert {e.output_index for e in mine} == {index}
        assert "".join(e.delta for e in mine) == item.arguments
    assert {e.item_id for e in pieces} == {"fc_call_a", "fc_call_b"}
    assert final.output_text == plain.output_text == "Checking."


def test_calls_that_never_carry_an_id_each_get_one_of_their_own(
    scripted: tuple[Gateway, ScriptedUpstream],
) -> None:
    """Some OpenAI-compatible servers stream tool calls without ``id``: two calls were both
    ``fc_`` with ``call_id`` "" (the SDK refused the stream: conflicting output identities),
    and their outputs could not be told apart. Each gets ``call_<request id>_<index>``: in
    every event, in response.completed and in the JSON answer, and it goes back as the
    chat turn's call ids."""
    gw, up = scripted
    calls = [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
    ]
    up.answer("no ids", {"content": None, "tool_calls": calls}, "tool_calls", deltas=[
        {"role": "assistant"},
        {"tool_calls": [{"index": 0, "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 1, "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
    ])  # fmt: skip
    c = client(gw)
    with c.responses.stream(model=MODEL, input="no ids", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    plain = c.responses.create(model=MODEL, input="no ids", tools=[WEATHER])

    for resp in (final, plain):
        rid = resp.id.removeprefix("resp_")
        called = [o for o in resp.output if isinstance(o, ResponseFunctionToolCall)]
        assert [(o.id, o.call_id, o.arguments) for o in called] == [
            (f"fc_call_{rid}_0", f"call_{rid}_0", '{"city": "Paris"}'),
            (f"fc_call_{rid}_1", f"call_{rid}_1", '{"city": "Rome"}'),
        ]
    called = [o for o in final.output if isinstance(o, ResponseFunctionToolCall)]
    ids = [o.id for o in called]
    assert len(called) == len(final.output)
    for kind in ("response.output_item.added", "response.output_item.done"):
        assert [getattr(e.item, "id", None) for e in events if e.type == kind] == ids
    pieces = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert {e.item_id for e in pieces} == set(ids)

    # Sent back with their outputs, the calls are one assistant turn whose ids the tool
    # messages name.
    turn: ResponseInputParam = [{"role": "user", "content": "no ids"}]
    for o in called:
        turn.append(
            {"type": "function_call", "call_id": o.call_id, "name": o.name,
             "arguments": o.arguments}
        )  # fmt: skip
    for o in called:
        turn.append({"type": "function_call_output", "call_id": o.call_id, "output": "20C"})
    c.responses.create(model=MODEL, input=turn, tools=[WEATHER])
    sent = up.requests()[-1]["messages"]
    said = [tc["id"] for tc in sent[1]["tool_calls"]]
    assert said == [o.call_id for o in called] and len(set(said)) == 2
    assert [m["tool_call_id"] for m in sent[2:]] == said


def test_a_call_whose_id_comes_late_and_a_call_cut_off(
    scripted: tuple[Gateway, ScriptedUpstream],
) -> None:
    gw, up = scripted
    call = {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    up.answer("late id", {"content": None, "tool_calls": [call]}, "tool_calls", deltas=[
        {"role": "assistant"},
        {"tool_calls": [{"index": 0, "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "id": "call_a", "function": {"arguments": '"Paris"}'}}]},
    ])  # fmt: skip
    c = client(gw)
    with c.responses.stream(model=MODEL, input="late id", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    [item] = final.output
    assert isinstance(item, ResponseFunctionToolCall)
    assert (item.call_id, item.id, item.arguments) == ("call_a", "fc_call_a", '{"city": "Paris"}')
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [(i.id, getattr(i, "call_id", None)) for i in added] == [("fc_call_a", "call_a")]
    pieces = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert {e.item_id for e in pieces} == {"fc_call_a"}
    assert "".join(e.delta for e in pieces) == item.arguments
    # Cut off by the output limit: incomplete, streamed or not.
    cut = {**call, "function": {"name": "get_weather", "arguments": '{"city": "Pa'}}
    up.answer("cut call", {"content": None, "tool_calls": [cut]}, "length")
    plain = c.responses.create(model=MODEL, input="cut call", tools=[WEATHER])
    with c.responses.stream(model=MODEL, input="cut call", tools=[WEATHER]) as stream:
        last = list(stream)[-1]
    assert last.type == "response.incomplete"
    streamed = last.response
    for resp in (plain, streamed):
        [cut_call] = resp.output
        assert isinstance(cut_call, ResponseFunctionToolCall)
        assert resp.status == "incomplete" and cut_call.status == "incomplete"


def test_a_call_s_name_is_the_one_it_was_added_with(
    scripted: tuple[Gateway, ScriptedUpstream],
) -> None:
    """A call whose arguments begin before its name comes is added once the name has come;
    a name piece after a call was added (the SDK's snapshot has the name added) is dropped:
    every event and the completed response name each call alike."""
    gw, up = scripted
    calls = [
        {"id": f"call_{c}", "type": "function",
         "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}
        for c, city in (("a", "Paris"), ("b", "Rome"))
    ]  # fmt: skip
    up.answer("late names", {"content": None, "tool_calls": calls}, "tool_calls", deltas=[
        {"role": "assistant"},
        {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                         "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"name": "get_weather",
                                                  "arguments": '"Paris"}'}}]},
        {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 1, "function": {"name": "_v2", "arguments": '"Rome"}'}}]},
    ])  # fmt: skip
    with client(gw).responses.stream(model=MODEL, input="late names", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    called = [o for o in final.output if isinstance(o, ResponseFunctionToolCall)]
    assert [(o.call_id, o.name, o.arguments) for o in called] == [
        ("call_a", "get_weather", '{"city": "Paris"}'),
        ("call_b", "get_weather", '{"city": "Rome"}'),
    ]
    for kind in ("response.output_item.added", "response.output_item.done"):
        said = [e.item for e in events if e.type == kind]
        assert [(i.call_id, i.name) for i in said if isinstance(i, ResponseFunctionToolCall)] == [
            ("call_a", "get_weather"),
            ("call_b", "get_weather"),
        ]


def test_a_text_and_a_call_stream_in_order_and_go_back_as_one_assistant_turn(
    tmp_path: Path,
) -> None:
    """An answer with text and a call, streamed from the cache (the chat service streams
    the whole answer itself), comes in the JSON answer's order: the message, then the
    call. Sent back as input, as the Agents SDK sends its last output, the message and the
    call are one assistant turn that the tool message follows, as strict chat servers
    require (OpenAI's is a 400 otherwise)."""
    call = {
        "id": "call_w",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    text = "Let me check the weather."
    with scripted_upstream(tmp_path) as up:
        up.answer("Weather in Paris?", {"content": text, "tool_calls": [call]}, "tool_calls")
        gw = start_gateway(tmp_path, gateway_config(tmp_path, up.base_url, cache={"enabled": True}))
        try:
            c = client(gw)
            ask: dict[str, Any] = {"model": MODEL, "input": "Weather in Paris?", "tools": [WEATHER]}
            plain = c.responses.create(**ask)
            deadline = time.monotonic() + 5
            while True:  # the answer is stored in the background
                with c.responses.stream(**ask) as stream:
                    streamed = stream.get_final_response()
                if extra(streamed)["xrouter"]["cache"]["hit"] or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert extra(streamed)["xrouter"]["cache"]["hit"]
            for resp in (plain, streamed):
                assert [i.type for i in resp.output] == ["message", "function_call"]
            history: Any = [
                {"role": "user", "content": "Weather in Paris?"},
                *(item.model_dump(exclude_none=True) for item in streamed.output),
                {"type": "function_call_output", "call_id": "call_w", "output": "sunny, 21C"},
            ]
            c.responses.create(model=MODEL, input=history, tools=[WEATHER])
            messages = up.requests()[-1]["messages"]
        finally:
            gw.stop()
    assert messages[1:] == [
        {"role": "assistant", "content": text, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_w", "content": "sunny, 21C"},
    ]


def test_a_call_sent_back_before_its_text_is_one_assistant_turn(
    scripted: tuple[Gateway, ScriptedUpstream],
) -> None:
    """A turn's output items in the order a model that streams its call first gives them:
    the upstream gets one assistant message with the text and the call, then the tool
    message, not a second assistant message between them (a 400 on OpenAI's, DeepSeek's
    and other strict chat servers)."""
    gw, up = scripted
    history: ResponseInputParam = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21C"},
    ]  # fmt: skip
    resp = client(gw).responses.create(model=MODEL, input=history, tools=[WEATHER])
    assert resp.status == "completed"
    call = {
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    assert up.requests()[-1]["messages"][1:] == [
        {"role": "assistant", "content": "Let me check.", "tool_calls": [{"id": "c1", **call}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21C"},
    ]


def test_every_error_carries_a_request_id(gateway: Gateway, secured: Gateway) -> None:
    """OpenAI's SDKs read `x-request-id` into an error's `request_id`: a request refused
    before it had one (a bad key, a body too large, a call on a stored response) gets one
    too, as a request refused by the translation or the chat service has."""
    bad_key = openai.OpenAI(base_url=secured.base_url, api_key="xr-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        bad_key.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.APIStatusError) as too_large:  # max_body_bytes is 64 KiB
        client(gateway).responses.create(model=MODEL, input="x" * 70_000)
    assert too_large.value.status_code == 413
    with pytest.raises(openai.NotFoundError) as stored:
        client(gateway).responses.retrieve("resp_abc")
    with pytest.raises(openai.BadRequestError) as refused:
        client(gateway).responses.create(model=MODEL, input=[{"role": "user", "content": []}])
    for err in (auth, too_large, stored, refused):
        headers = err.value.response.headers
        assert err.value.request_id and headers["x-xrouter-request-id"] == err.value.request_id
    # Ids of their own, not one shared.
    assert len({err.value.request_id for err in (auth, too_large, stored, refused)}) == 4


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", ""), ("DELETE", ""), ("POST", "/cancel"), ("GET", "/input_items")],
)
def test_stored_response_calls_say_nothing_is_stored(
    gateway: Gateway, method: str, path: str
) -> None:
    r = httpx.request(method, f"{gateway.base_url}/responses/resp_abc{path}")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "response_not_found" and "stores no responses" in err["message"]
    with pytest.raises(openai.NotFoundError):
        client(gateway).responses.retrieve("resp_abc")


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/input_tokens"), ("POST", "/compact"), ("POST", "/resp_abc"),
     ("PUT", "/resp_abc")],
)  # fmt: skip
def test_other_calls_under_responses_are_not_served(
    gateway: Gateway, method: str, path: str
) -> None:
    # OpenAI's other endpoints under /v1/responses/ are not calls on a stored response.
    r = httpx.request(method, f"{gateway.base_url}/responses{path}", json={})
    assert r.status_code in (404, 405), r.text
    err = r.json()["error"]
    assert err["code"] != "response_not_found"
    if r.status_code == 404:
        assert err["type"] == "not_found_error" and f"/v1/responses{path}" in err["message"]


def test_malformed_json_is_a_400(gateway: Gateway) -> None:
    r = httpx.post(
        f"{gateway.base_url}/responses",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_an_upstream_failure_mid_stream_ends_with_response_failed(
    gateway: Gateway, upstream: Upstream, demo_table: list[OutcomeRecord]
) -> None:
    rec = longest_answer(demo_table, MODEL)
    upstream.fault(MODEL, "cut-stream=5", count=5)
    with client(gateway).responses.create(model=MODEL, input=rec.text, stream=True) as stream:
        events = list(stream)
    assert events[-1].type == "response.failed"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error is not None and failed.error.message
    rid = failed.id.removeprefix("resp_")
    (status, _, _), _ = ledger_rows(gateway, rid)
    assert status >= 500


def test_a_client_that_hangs_up_mid_stream_is_logged_as_499(
    gateway: Gateway, upstream: Upstream, demo_table: list[OutcomeRecord]
) -> None:
    rec = longest_answer(demo_table, MODEL)
    body = {"model": MODEL, "input": rec.text, "stream": True}
    rid = hang_up_at(gateway.base_url, "/responses", body, "response.output_text.delta")
    assert upstream.abandoned_streams()["streams_abandoned"] == 1
    (status, stream_flag, total), _ = ledger_rows(gateway, rid)
    assert (status, stream_flag) == (499, 1) and total > 0

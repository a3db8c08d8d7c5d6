"""The Anthropic Messages API (`POST /v1/messages`) end to end: the real Anthropic SDK
against the gateway under uvicorn and the replay upstream — answers, streams, tool use,
truncation, errors in Anthropic's shape, `x-api-key` auth, token counts, feedback and the
ledger."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import MessageParam, TextBlock, ToolParam, ToolResultBlockParam, ToolUseBlock
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import FunctionToolParam
from pydantic import BaseModel

from router.outcomes import OutcomeRecord
from tests.gateway.conftest import Upstream, hang_up_at, ledger_rows, longest_answer
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway
from tests.support.scripted_upstream import scripted_upstream
from tests.support.sdk import extra

MODEL = "mistral-small-24b-instruct-2501-bf16"
WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


PDF = {
    "type": "document",
    "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"},
}
# Bodies refused whatever the endpoint (messages or count_tokens), and the field named.
REFUSED: list[tuple[dict[str, Any], str]] = [
    # A document inside a tool result (it went upstream as an image once).
    ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [PDF]}]}]},
     "messages[0].content[0].content[0].type"),
    # A structured-output format other than a JSON schema (dropped, the model answered
    # freely where the client parses the format).
    ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
      "output_config": {"format": {"type": "regex", "pattern": "a+"}}},
     "output_config.format.type"),
    ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
      "output_format": {"type": "json_schema"}}, "output_format.schema"),
    # Refused by the chat service's validation, named as the client sent it.
    ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
      "stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"},
                {**WEATHER, "name": "w" * 65}]}, "tools[1].name"),
]  # fmt: skip


def client(gw: Gateway, key: str = "unused") -> anthropic.Anthropic:
    # The SDK appends /v1/messages to the base URL, as Anthropic's own is https://api.anthropic.com.
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)


def text_of(message: anthropic.types.Message) -> str:
    return "".join(b.text for b in message.content if isinstance(b, TextBlock))


def api_of(gw: Gateway, request_id: str) -> str:
    ledger_rows(gw, request_id)  # waits for the row
    with sqlite3.connect(gw.config_path.parent / "ledger.db") as conn:
        (api,) = conn.execute(
            "SELECT api FROM requests WHERE request_id = ?", (request_id,)
        ).fetchone()
    return str(api)


def test_a_message_carries_the_routed_answer_its_usage_and_its_id(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    rec = next(r for r in demo_table if MODEL in r.outcomes and r.outcomes[MODEL].response)
    out = rec.outcomes[MODEL]
    raw = client(gateway).messages.with_raw_response.create(
        model=MODEL, max_tokens=1024, messages=[{"role": "user", "content": rec.text}]
    )
    msg = raw.parse()
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL
    assert text_of(msg) == out.response and msg.stop_reason == "end_turn"
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (
        out.prompt_tokens,
        out.completion_tokens,
    )
    meta = extra(msg)["xrouter"]
    assert extra(msg.usage)["cost"] == pytest.approx(meta["cost_usd"]) and meta["cost_usd"] > 0
    rid = raw.headers["x-xrouter-request-id"]
    assert msg.id == f"msg_{rid}" == f"msg_{meta['request_id']}"
    # One id for the message, the ledger and feedback; the ledger knows the API shape.
    fb = httpx.post(f"{gateway.base_url}/feedback", json={"request_id": msg.id, "score": 1})
    assert fb.status_code == 200 and fb.json()["request_id"] == rid
    assert api_of(gateway, rid) == "messages"


def test_routed_by_the_router_with_a_system_prompt_and_routing_controls(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    rec = demo_table[3]
    msg = client(gateway).messages.create(
        model="xrouter",
        max_tokens=1024,
        system=[{"type": "text", "text": "Answer briefly."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": rec.text}]}],
        extra_body={"xrouter": {"models": [MODEL, "qwen2.5-7b-instruct"]}},
    )
    assert msg.model in (MODEL, "qwen2.5-7b-instruct")
    assert text_of(msg) == rec.outcomes[msg.model].response
    assert extra(msg)["xrouter"]["policy"] == "compact"


def test_streams_events_that_add_up_to_the_answer(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    rec = longest_answer(demo_table, MODEL)
    with client(gateway).messages.stream(
        model=MODEL, max_tokens=4096, messages=[{"role": "user", "content": rec.text}]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    ]
    assert len(deltas) > 1 and "".join(deltas) == rec.outcomes[MODEL].response
    assert text_of(final) == rec.outcomes[MODEL].response and final.stop_reason == "end_turn"
    out = rec.outcomes[MODEL]
    assert (final.usage.input_tokens, final.usage.output_tokens) == (
        out.prompt_tokens,
        out.completion_tokens,
    )
    rid = final.id.removeprefix("msg_")
    (status, stream_flag, total), _ = ledger_rows(gateway, rid)
    assert (status, stream_flag) == (200, 1) and total > 0


def test_the_sdk_reads_the_request_id_from_messages_streams_and_errors(
    gateway: Gateway, upstream: Upstream
) -> None:
    """Anthropic's API names each request in `request-id`, which the SDK reads into a
    message's `_request_id`, a stream's `request_id` and an error's `request_id`: here it is
    the gateway's request id, the one feedback and generation stats take — refusals by the
    translation, by the chat service and by the upstream included."""
    c = client(gateway)
    hi: list[MessageParam] = [{"role": "user", "content": "Say hi"}]
    msg = c.messages.create(model=MODEL, max_tokens=64, messages=hi)
    assert msg._request_id and msg.id == f"msg_{msg._request_id}"
    with c.messages.stream(model=MODEL, max_tokens=64, messages=hi) as stream:
        final = stream.get_final_message()
        assert stream.request_id and final.id == f"msg_{stream.request_id}"
    robot: Any = [{"role": "robot", "content": "x"}]
    upstream.fault(MODEL, "status=400", count=5)
    for model, messages, kind in [
        (MODEL, robot, anthropic.BadRequestError),  # refused in translation
        ("no-such-model", hi, anthropic.NotFoundError),  # refused by the chat service
        (MODEL, hi, anthropic.BadRequestError),  # refused upstream as invalid
    ]:
        with pytest.raises(kind) as err:
            c.messages.create(model=model, max_tokens=64, messages=messages)
        headers = err.value.response.headers
        assert err.value.request_id and err.value.request_id == headers["x-xrouter-request-id"]
        assert headers["x-request-id"] == err.value.request_id
    # Refused before it had a request id (a body over max_bytes, 64 KiB here): one of its own.
    big: list[MessageParam] = [{"role": "user", "content": "x" * 70_000}]
    with pytest.raises(anthropic.APIStatusError) as too_large:
        c.messages.create(model=MODEL, max_tokens=64, messages=big)
    assert too_large.value.status_code == 413 and too_large.value.request_id
    assert too_large.value.response.headers["x-request-id"] == too_large.value.request_id
    # Token counts too, counted or refused.
    counted = c.messages.count_tokens(model=MODEL, messages=hi)
    with pytest.raises(anthropic.NotFoundError) as not_counted:
        c.messages.count_tokens(model="no-such-model", messages=hi)
    assert counted._request_id and not_counted.value.request_id
    ids = {msg._request_id, too_large.value.request_id, counted._request_id}
    assert len(ids | {not_counted.value.request_id}) == 4


def test_tool_use_round_trip_and_a_streamed_tool_call(gateway: Gateway) -> None:
    c = client(gateway)
    question: MessageParam = {"role": "user", "content": "Weather in Paris?"}
    first = c.messages.create(model=MODEL, max_tokens=256, tools=[WEATHER], messages=[question])
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if isinstance(b, ToolUseBlock)]
    assert use.name == "get_weather" and isinstance(use.input, dict) and "city" in use.input
    second = c.messages.create(
        model=MODEL,
        max_tokens=256,
        tools=[WEATHER],
        messages=[
            question,
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21C"}
                ],
            },
        ],
    )
    assert "sunny, 21C" in text_of(second) and second.stop_reason == "end_turn"

    # Streamed: the call's arguments arrive as input_json_delta, which the SDK assembles.
    with c.messages.stream(
        model=MODEL, max_tokens=256, tools=[WEATHER], messages=[question]
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "content_block_start" in kinds and final.stop_reason == "tool_use"
    [streamed] = [b for b in final.content if isinstance(b, ToolUseBlock)]
    assert (streamed.name, streamed.input) == (use.name, use.input)


def test_tools_anthropic_runs_itself_are_left_out_and_named(gateway: Gateway) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
    }
    r = httpx.post(f"{gateway.base_url}/messages", json=body, timeout=30)
    assert r.status_code == 200, r.text
    msg = r.json()
    assert msg["stop_reason"] == "end_turn"  # nothing the model could call was offered
    assert msg["xrouter"]["ignored_tools"] == ["web_search"]


def test_max_tokens_truncates_with_stop_reason_max_tokens(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    rec = longest_answer(demo_table, MODEL)
    msg = client(gateway).messages.create(
        model=MODEL, max_tokens=16, messages=[{"role": "user", "content": rec.text}]
    )
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 16
    assert (rec.outcomes[MODEL].response or "").startswith(text_of(msg))


@pytest.mark.parametrize(
    ("body", "status", "kind", "param"),
    [
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, 400,
         "invalid_request_error", "max_tokens"),
        ({"model": MODEL, "max_tokens": 8, "messages": []}, 400, "invalid_request_error",
         "messages"),
        ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "robot", "content": "x"}]},
         400, "invalid_request_error", "messages[0].role"),
        ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "base64", "data": "x"}}]}]}, 400,
         "invalid_request_error", "messages[0].content[0].type"),
        ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
          "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, 400,
         "invalid_request_error", "tool_choice.name"),
        ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
          "temperature": 1.5}, 400, "invalid_request_error", "temperature"),
        ({"model": "no-such-model", "max_tokens": 8,
          "messages": [{"role": "user", "content": "x"}]}, 404, "not_found_error", "model"),
        ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
          "xrouter": {"cost_weight": -1}}, 400, "invalid_request_error", "xrouter.cost_weight"),
        *[(body, 400, "invalid_request_error", param) for body, param in REFUSED],
    ],
)  # fmt: skip
def test_bad_requests_get_an_anthropic_error(
    gateway: Gateway, body: dict[str, Any], status: int, kind: str, param: str
) -> None:
    r = httpx.post(f"{gateway.base_url}/messages", json=body)
    assert r.status_code == status, r.text
    got = r.json()
    assert got["type"] == "error" and got["error"]["type"] == kind
    assert got["error"]["message"] and got["error"]["param"] == param
    if status == 400:
        assert got["error"]["message"].startswith(f"{param}: ")
    assert r.headers["x-xrouter-request-id"]


@pytest.mark.parametrize(("body", "param"), REFUSED)
def test_count_tokens_refuses_what_messages_refuses(
    gateway: Gateway, body: dict[str, Any], param: str
) -> None:
    r = httpx.post(f"{gateway.base_url}/messages/count_tokens", json=body)
    assert r.status_code == 400, r.text
    got = r.json()
    assert got["type"] == "error" and got["error"]["param"] == param


# Bodies the chat service refuses before routing them: count_tokens refuses them as well,
# without routing them, calling a model or writing a ledger row.
ASK: list[MessageParam] = [{"role": "user", "content": "Weather in Paris?"}]
REFUSED_BEFORE_ROUTING: list[tuple[dict[str, Any], int, str, str]] = [
    ({"model": "no-such-model", "messages": ASK}, 404, "not_found_error", "model"),
    ({"model": "xrouter/no-such-policy", "messages": ASK}, 404, "not_found_error", "model"),
    ({"model": "xrouter", "messages": ASK, "xrouter": {"models": ["no-such-model"]}}, 400,
     "invalid_request_error", "xrouter.models"),
    ({"model": MODEL, "messages": ASK, "xrouter": {"tags": [""]}}, 400,
     "invalid_request_error", "xrouter.tags"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "kind", "param"), REFUSED_BEFORE_ROUTING)
def test_count_tokens_refuses_what_the_chat_service_refuses_without_routing_it(
    gateway: Gateway, upstream: Upstream, body: dict[str, Any], status: int, kind: str, param: str
) -> None:
    counted = httpx.post(f"{gateway.base_url}/messages/count_tokens", json=body)
    assert counted.status_code == status, counted.text
    assert upstream.stats()["total"] == 0  # no model was asked, the router included
    sent = httpx.post(f"{gateway.base_url}/messages", json={"max_tokens": 8, **body})
    assert sent.status_code == status, sent.text
    # The same error, in Anthropic's shape, as POST /v1/messages answers.
    assert counted.json() == sent.json()
    assert counted.json()["error"]["type"] == kind and counted.json()["error"]["param"] == param
    # POST /v1/messages keeps a ledger row for its refusal; a count keeps none.
    ledger_rows(gateway, sent.headers["request-id"])
    with sqlite3.connect(gateway.config_path.parent / "ledger.db") as conn:
        rows = conn.execute(
            "SELECT COUNT(*) FROM requests WHERE request_id = ?", (counted.headers["request-id"],)
        ).fetchone()
    assert rows == (0,)


def test_a_request_refused_in_translation_is_accounted_as_a_chat_request_is(
    gateway: Gateway,
) -> None:
    """Refused before it became a chat request, it still gets a request id, a ledger row
    and its count in the request metrics, as the same mistake on chat completions does;
    the error stays Anthropic's."""

    def refused_messages() -> float:
        metrics = httpx.get(f"{gateway.url}/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("xrouter_requests_total{")
            and 'api="messages"' in line
            and 'status_class="4xx"' in line
        )

    before = refused_messages()
    robot: Any = [{"role": "robot", "content": "x"}]
    with pytest.raises(anthropic.BadRequestError) as err:
        client(gateway).messages.create(model=MODEL, max_tokens=8, messages=robot)
    assert isinstance(err.value.body, dict) and err.value.body["error"]["param"] == (
        "messages[0].role"
    )
    rid = err.value.response.headers["x-xrouter-request-id"]
    (status, stream_flag, total), calls = ledger_rows(gateway, rid)
    assert (status, stream_flag, total, calls) == (400, 0, 0, [])
    assert api_of(gateway, rid) == "messages"
    assert refused_messages() == before + 1


def test_malformed_json_and_the_sdk_s_exceptions(gateway: Gateway) -> None:
    r = httpx.post(
        f"{gateway.base_url}/messages",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    with pytest.raises(anthropic.NotFoundError) as err:
        client(gateway).messages.create(
            model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    assert "no-such-model" in str(err.value)


def test_paths_and_methods_the_gateway_does_not_serve_answer_in_anthropic_s_shape(
    gateway: Gateway,
) -> None:
    """Message Batches are not served: the SDK gets Anthropic's not_found_error (with the
    request id it reads), and a wrong method Anthropic's shape with ``Allow``."""
    with pytest.raises(anthropic.NotFoundError) as err:
        client(gateway).messages.batches.list()
    body = err.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert err.value.request_id
    r = httpx.get(f"{gateway.base_url}/messages", timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    # Elsewhere, OpenAI's shape as before.
    r = httpx.get(f"{gateway.base_url}/chat/completions", timeout=10)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    assert "type" not in r.json()


def test_an_upstream_failure_mid_stream_ends_with_an_error_event(
    gateway: Gateway, upstream: Upstream, demo_table: list[OutcomeRecord]
) -> None:
    rec = longest_answer(demo_table, MODEL)
    upstream.fault(MODEL, "cut-stream=5", count=5)
    body = {
        "model": MODEL,
        "max_tokens": 4096,
        "stream": True,
        "messages": [{"role": "user", "content": rec.text}],
    }
    with httpx.stream("POST", f"{gateway.base_url}/messages", json=body, timeout=30) as r:
        assert r.status_code == 200
        rid = r.headers["x-xrouter-request-id"]
        lines = list(r.iter_lines())
    events = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "error"
    assert "message_stop" not in events
    # The SDK raises on the error event.
    with pytest.raises(anthropic.APIStatusError):
        upstream.fault(MODEL, "cut-stream=5", count=5)
        with client(gateway).messages.stream(
            model=MODEL, max_tokens=4096, messages=[{"role": "user", "content": rec.text}]
        ) as stream:
            list(stream)
    (status, _, _), _ = ledger_rows(gateway, rid)
    assert status >= 500


def test_models_in_anthropic_s_shape_for_anthropic_s_clients(gateway: Gateway) -> None:
    c = client(gateway)
    page = c.models.list()
    ids = [m.id for m in page.data]
    assert ids[0] == "xrouter" and MODEL in ids and not page.has_more
    assert all(m.type == "model" and m.display_name == m.id for m in page.data)
    model = c.models.retrieve("xrouter/cascade")
    assert model.id == "xrouter/cascade" and model.created_at.tzinfo is not None
    assert extra(model)["xrouter"]["kind"] == "router"
    with pytest.raises(anthropic.NotFoundError):
        c.models.retrieve("no-such-model")
    # OpenAI's clients (no anthropic-version header) still get OpenAI's shape.
    openai_shape = httpx.get(f"{gateway.base_url}/models").json()
    assert openai_shape["object"] == "list" and openai_shape["data"][0]["object"] == "model"


def test_anthropic_s_model_list_pages(gateway: Gateway) -> None:
    c = client(gateway)
    every = [m.id for m in c.models.list(limit=1000).data]
    assert len(every) > 3
    first = c.models.list(limit=2)
    assert [m.id for m in first.data] == every[:2] and first.has_more
    assert first.first_id == every[0] and first.last_id == every[1]
    after = c.models.list(limit=2, after_id=every[1])
    assert [m.id for m in after.data] == every[2:4]
    before = c.models.list(limit=2, before_id=every[3])
    assert [m.id for m in before.data] == every[1:3] and before.has_more
    # The SDK's auto-pagination walks every page and sees each model once.
    assert [m.id for m in c.models.list(limit=2)] == every
    for bad in ({"limit": 0}, {"after_id": "no-such-model"}):
        with pytest.raises(anthropic.BadRequestError) as err:
            c.models.list(**bad)
        assert err.value.request_id  # every answer carries an id


def test_count_tokens(gateway: Gateway) -> None:
    c = client(gateway)
    short = c.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    long = c.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "hello " * 300}], tools=[WEATHER]
    )
    # The budget-hold estimate: high on purpose (3 characters a token).
    assert 0 < short.input_tokens < long.input_tokens and long.input_tokens >= 1800 / 3
    r = httpx.post(f"{gateway.base_url}/messages/count_tokens", json={"model": MODEL})
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_the_key_as_anthropic_s_clients_send_it(upstream: Upstream, tmp_path: Path) -> None:
    cfg = gateway_config(tmp_path, upstream.base_url, auth={"enabled": True})
    gw = start_gateway(tmp_path, cfg)
    try:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        key = httpx.post(
            f"{gw.url}/admin/keys",
            json={"alias": "claude-code", "allowed_models": [MODEL]},
            headers=admin,
        ).json()["key"]
        ask: list[MessageParam] = [{"role": "user", "content": "Weather in Paris?"}]
        # The SDK sends x-api-key.
        assert client(gw, key).messages.create(model=MODEL, max_tokens=32, messages=ask).content
        with pytest.raises(anthropic.AuthenticationError) as err:
            client(gw, "xr-wrong").messages.create(model=MODEL, max_tokens=32, messages=ask)
        body = err.value.body
        assert isinstance(body, dict) and body["error"]["type"] == "authentication_error"
        assert err.value.status_code == 401
        # Refused before it was a request the ledger keeps, it has a request id all the same.
        assert err.value.request_id
        assert err.value.response.headers["x-request-id"] == err.value.request_id
        with pytest.raises(anthropic.PermissionDeniedError):
            client(gw, key).messages.create(
                model="qwen2.5-7b-instruct", max_tokens=32, messages=ask
            )
        # The model list answers the same key, listing what it may use.
        listed = [m.id for m in client(gw, key).models.list().data]
        assert "xrouter" in listed and MODEL in listed and "qwen2.5-7b-instruct" not in listed
        with pytest.raises(anthropic.AuthenticationError):
            client(gw, "xr-wrong").models.list()
        # count_tokens takes the key too, and refuses a model the key may not use, as
        # POST /v1/messages does.
        r = httpx.post(
            f"{gw.base_url}/messages/count_tokens", json={"model": MODEL, "messages": ask}
        )
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert r.headers["request-id"]
        assert client(gw, key).messages.count_tokens(model=MODEL, messages=ask).input_tokens > 0
        with pytest.raises(anthropic.PermissionDeniedError) as denied:
            client(gw, key).messages.count_tokens(model="qwen2.5-7b-instruct", messages=ask)
        assert isinstance(denied.value.body, dict)
        assert denied.value.body["error"]["code"] == "model_not_allowed"
    finally:
        gw.stop()


def test_a_claude_code_shaped_request(gateway: Gateway) -> None:
    """The shape Claude Code 2.1 sends (recorded by hand): system blocks with cache_control,
    a mid-conversation system message, thinking and other fields chat has no use for,
    `?beta=true`, streamed."""
    body = {
        "model": "xrouter",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197;"},
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>today</system-reminder>"}]},
            {"role": "system", "content": "Available agent types: none."},
            {"role": "user", "content": [{"type": "text", "text": "What files are here?", "cache_control": {"type": "ephemeral"}}]},
        ],
        "tools": [WEATHER, {"name": "Bash", "description": "Run a command", "input_schema": {
            "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}],
        "metadata": {"user_id": '{"device_id":"d","session_id":"s"}'},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }  # fmt: skip
    headers = {"x-api-key": "unused", "anthropic-version": "2023-06-01", "anthropic-beta": "x"}
    with httpx.stream(
        "POST", f"{gateway.base_url}/messages?beta=true", json=body, headers=headers, timeout=30
    ) as r:
        assert r.status_code == 200
        lines = list(r.iter_lines())
    events = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events


def test_a_client_that_hangs_up_mid_stream_is_logged_as_499(
    gateway: Gateway, upstream: Upstream, demo_table: list[OutcomeRecord]
) -> None:
    rec = longest_answer(demo_table, MODEL)
    body = {
        "model": MODEL,
        "max_tokens": 4096,
        "stream": True,
        "messages": [{"role": "user", "content": rec.text}],
    }
    rid = hang_up_at(gateway.base_url, "/messages", body, "content_block_delta")
    assert upstream.abandoned_streams()["streams_abandoned"] == 1
    (status, stream_flag, total), _ = ledger_rows(gateway, rid)
    assert (status, stream_flag) == (499, 1) and total > 0


def test_a_tool_call_whose_id_comes_late(tmp_path: Path) -> None:
    """Some servers send a call's id in a chunk after its name: the tool_use block (whose id
    is in its content_block_start) waits for it."""
    call = {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    late: list[dict[str, Any]] = [
        {"role": "assistant", "content": ""},
        {"content": "Checking."},
        {"tool_calls": [{"index": 0, "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "id": "call_a", "function": {"arguments": '"Paris"}'}}]},
        {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    ]  # fmt: skip
    with scripted_upstream(tmp_path) as up:
        second = {**call, "id": "call_b"}
        up.answer("late id", {"content": "Checking.", "tool_calls": [call, second]},
                  "tool_calls", deltas=late)  # fmt: skip
        gw = start_gateway(tmp_path, gateway_config(tmp_path, up.base_url))
        try:
            ask: list[MessageParam] = [{"role": "user", "content": "late id"}]
            with client(gw).messages.stream(
                model=MODEL, max_tokens=64, messages=ask, tools=[WEATHER]
            ) as stream:
                events = list(stream)
                final = stream.get_final_message()
        finally:
            gw.stop()
    started = [e.content_block for e in events if e.type == "content_block_start"]
    assert [getattr(b, "id", None) for b in started] == [None, "call_a", "call_b"]
    calls = [b for b in final.content if isinstance(b, ToolUseBlock)]
    assert [(b.id, b.input) for b in calls] == [
        ("call_a", {"city": "Paris"}),
        ("call_b", {"city": "Rome"}),
    ]
    assert text_of(final) == "Checking." and final.stop_reason == "tool_use"


def test_a_tool_call_whose_name_comes_after_its_arguments(tmp_path: Path) -> None:
    """A block's name is in its content_block_start, which the SDK's message keeps: the
    tool_use block waits for the name (it started as the tool "")."""
    call = {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    late: list[dict[str, Any]] = [
        {"role": "assistant", "content": ""},
        {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                         "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"name": "get_weather",
                                                  "arguments": '"Paris"}'}}]},
    ]  # fmt: skip
    with scripted_upstream(tmp_path) as up:
        up.answer("late name", {"content": None, "tool_calls": [call]}, "tool_calls", deltas=late)
        gw = start_gateway(tmp_path, gateway_config(tmp_path, up.base_url))
        try:
            ask: list[MessageParam] = [{"role": "user", "content": "late name"}]
            with client(gw).messages.stream(
                model=MODEL, max_tokens=64, messages=ask, tools=[WEATHER]
            ) as stream:
                final = stream.get_final_message()
        finally:
            gw.stop()
    [use] = final.content
    assert isinstance(use, ToolUseBlock)
    assert (use.id, use.name, use.input) == ("call_a", "get_weather", {"city": "Paris"})


def test_tool_calls_that_never_carry_an_id_each_get_one_of_their_own(tmp_path: Path) -> None:
    """Some servers send tool calls without ``id``: two tool_use blocks had the id "", so
    their results could not be told apart. Each is ``call_<request id>_<index>``, streamed
    or not, and the tool results that name them go back as the chat turn's call ids."""
    calls = [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
    ]
    deltas = [{"role": "assistant"}] + [
        {"tool_calls": [{**c, "index": i}]} for i, c in enumerate(calls)
    ]
    with scripted_upstream(tmp_path) as up:
        up.answer("no ids", {"content": None, "tool_calls": calls}, "tool_calls", deltas=deltas)
        gw = start_gateway(tmp_path, gateway_config(tmp_path, up.base_url))
        try:
            ask: list[MessageParam] = [{"role": "user", "content": "no ids"}]
            kw: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "tools": [WEATHER]}
            with client(gw).messages.stream(messages=ask, **kw) as stream:
                streamed = stream.get_final_message()
            plain = client(gw).messages.create(messages=ask, **kw)
            used = [b for b in streamed.content if isinstance(b, ToolUseBlock)]
            results: list[ToolResultBlockParam] = [
                {"type": "tool_result", "tool_use_id": b.id, "content": "20C"} for b in used
            ]
            turn: list[MessageParam] = [
                *ask,
                {"role": "assistant", "content": streamed.content},
                {"role": "user", "content": results},
            ]
            client(gw).messages.create(messages=turn, **kw)
            sent = up.requests()[-1]["messages"]
        finally:
            gw.stop()
    for msg in (streamed, plain):
        rid = msg.id.removeprefix("msg_")
        assert [(b.id, b.input) for b in msg.content if isinstance(b, ToolUseBlock)] == [
            (f"call_{rid}_0", {"city": "Paris"}),
            (f"call_{rid}_1", {"city": "Rome"}),
        ]
    said = [tc["id"] for tc in sent[1]["tool_calls"]]
    assert said == [b.id for b in used] and len(set(said)) == 2
    assert [m["tool_call_id"] for m in sent[2:]] == said


def test_tool_calls_that_finished_with_stop_are_a_tool_use_stop(tmp_path: Path) -> None:
    """A forced tool choice (``tool_choice`` ``any`` or ``tool``, translated to chat's
    ``required`` or a named function) finishes with "stop" on OpenAI and vLLM: the answer
    said ``end_turn``, and agent loops, which run tools on ``tool_use`` only, stopped."""
    call = {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    with scripted_upstream(tmp_path) as up:
        up.answer("forced", {"content": None, "tool_calls": [call]}, "stop")
        up.answer("plain", {"content": "Sunny."}, "stop")
        gw = start_gateway(tmp_path, gateway_config(tmp_path, up.base_url))
        try:
            c = client(gw)
            forced: list[MessageParam] = [{"role": "user", "content": "forced"}]
            msg = c.messages.create(
                model=MODEL,
                max_tokens=64,
                messages=forced,
                tools=[WEATHER],
                tool_choice={"type": "tool", "name": "get_weather"},
            )
            with c.messages.stream(
                model=MODEL,
                max_tokens=64,
                messages=forced,
                tools=[WEATHER],
                tool_choice={"type": "any"},
            ) as stream:
                streamed = stream.get_final_message()
            plain: list[MessageParam] = [{"role": "user", "content": "plain"}]
            text = c.messages.create(model=MODEL, max_tokens=64, messages=plain, tools=[WEATHER])
        finally:
            gw.stop()
    for answer in (msg, streamed):
        calls = [b for b in answer.content if isinstance(b, ToolUseBlock)]
        assert [(b.id, b.input) for b in calls] == [("call_a", {"city": "Paris"})]
        assert answer.stop_reason == "tool_use"
    assert text.stop_reason == "end_turn"  # no call: the turn ended


class Forecast(BaseModel):
    city: str
    celsius: int


def test_structured_output_reaches_the_model_as_a_json_schema_response_format(
    tmp_path: Path,
) -> None:
    """Structured outputs (the SDK's ``messages.parse(output_format=...)``, or
    ``output_config.format`` by hand) go upstream as chat's strict json_schema
    ``response_format``; they were dropped, and the model answered freely. ``effort``
    beside the format is not forwarded."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    with scripted_upstream(tmp_path) as up:
        up.answer("Forecast for Paris?", {"content": '{"city": "Paris", "celsius": 21}'})
        gw = start_gateway(tmp_path, gateway_config(tmp_path, up.base_url))
        try:
            c = client(gw)
            ask: list[MessageParam] = [{"role": "user", "content": "Forecast for Paris?"}]
            parsed = c.messages.parse(
                model=MODEL, max_tokens=64, messages=ask, output_format=Forecast
            )
            c.messages.create(
                model=MODEL,
                max_tokens=64,
                messages=ask,
                output_config={
                    "effort": "low",
                    "format": {"type": "json_schema", "schema": schema},
                },
            )
            by_sdk, by_hand = up.requests()[-2:]
        finally:
            gw.stop()
    assert parsed.parsed_output == Forecast(city="Paris", celsius=21)
    sdk_format = by_sdk["response_format"]
    assert (sdk_format["type"], sdk_format["json_schema"]["strict"]) == ("json_schema", True)
    assert set(sdk_format["json_schema"]["schema"]["required"]) == {"city", "celsius"}
    assert by_hand["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }
    assert "effort" not in by_hand and "output_config" not in by_hand


def test_an_answer_of_content_parts_is_text_on_every_api(tmp_path: Path) -> None:
    """Some servers answer with a list of content parts (Mistral's reasoning models). The
    Messages API's text block and the Responses API's output_text carried the list, and the
    SDKs broke on it (``output_text`` raised TypeError); the chat API relayed the list,
    which its SDK types as a string, and the answer cache replayed it as an empty stream.
    Every API now has the text parts' text, and the chat API the thinking as
    ``reasoning_content``, as the same answer streamed has them."""
    parts = [
        {"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]},
        {"type": "text", "text": "Sunny, "},
        {"type": "text", "text": "21C."},
    ]
    with scripted_upstream(tmp_path) as up:
        up.answer("Weather?", {"content": parts})
        cfg = gateway_config(tmp_path, up.base_url, cache={"enabled": True})
        gw = start_gateway(tmp_path, cfg)
        try:
            ask: list[MessageParam] = [{"role": "user", "content": "Weather?"}]
            msg = client(gw).messages.create(model=MODEL, max_tokens=64, messages=ask)
            oc = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
            response = oc.responses.create(model=MODEL, input="Weather?")
            asked: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Weather?"}]
            chat = oc.chat.completions.create(model=MODEL, messages=asked)
            replayed = list(oc.chat.completions.create(model=MODEL, messages=asked, stream=True))
        finally:
            gw.stop()
    assert [(b.type, getattr(b, "text", None)) for b in msg.content] == [("text", "Sunny, 21C.")]
    assert response.output_text == "Sunny, 21C."
    assert chat.choices[0].message.content == "Sunny, 21C."
    assert extra(chat.choices[0].message).get("reasoning_content") == "hmm"
    assert extra(replayed[-1])["xrouter"]["cache"]["hit"] is True
    assert "".join(c.choices[0].delta.content or "" for c in replayed if c.choices) == "Sunny, 21C."


def test_a_stream_of_content_parts_is_text_in_all_three_apis(tmp_path: Path) -> None:
    """Mistral's reasoning models stream ``delta.content`` as parts, and some servers
    stream text parts: the call was a 502 on every API (a delta's content had to be a
    string). The text parts stream as text, the thinking as the chat API's
    ``reasoning_content``, which the other APIs leave out as they leave out the answer's."""
    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]}
    deltas: list[dict[str, Any]] = [
        {"role": "assistant", "content": [thinking]},
        {"content": [{"type": "text", "text": "Sunny, "}]},
        {"content": "21"},
        {"content": [{"type": "text", "text": "C."}]},
    ]
    with scripted_upstream(tmp_path) as up:
        up.answer("Weather?", {"content": "Sunny, 21C."}, deltas=deltas)
        gw = start_gateway(tmp_path, gateway_config(tmp_path, up.base_url))
        try:
            oc = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
            chunks = list(
                oc.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "Weather?"}], stream=True
                )
            )
            with oc.responses.stream(model=MODEL, input="Weather?") as stream:
                response = stream.get_final_response()
            ask: list[MessageParam] = [{"role": "user", "content": "Weather?"}]
            with client(gw).messages.stream(model=MODEL, max_tokens=64, messages=ask) as ms:
                msg = ms.get_final_message()
        finally:
            gw.stop()
    said = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in said) == "Sunny, 21C."
    assert [extra(d).get("reasoning_content") for d in said] == ["hmm", None, None, None, None]
    assert response.output_text == "Sunny, 21C."
    assert [(b.type, getattr(b, "text", None)) for b in msg.content] == [("text", "Sunny, 21C.")]


# How servers stream a tool call's name: OpenAI whole in the first delta; others in pieces,
# or "" first; others whole in every delta.
NAME_PIECES = {
    "in pieces": [{"name": "get_"}, {"name": "weather"}],
    "empty first": [{"name": ""}, {"name": "get_weather"}],
    "repeated": [{"name": "get_weather"}, {"name": "get_weather"}],
}


def test_a_tool_call_name_streamed_in_pieces_is_the_whole_name(tmp_path: Path) -> None:
    """The Responses and Messages streams took a call's name from its first delta: a name
    some servers split (``get_`` + ``weather``), or send ``""`` first, was cut to its first
    piece. It is accumulated as the OpenAI SDK accumulates it on the chat API, and a name
    repeated in every delta is still the name (where that SDK doubles it)."""
    responses: dict[str, list[tuple[str, str]]] = {}
    messages: dict[str, list[tuple[str, str]]] = {}
    chat: dict[str, str | None] = {}
    with scripted_upstream(tmp_path) as up:
        for case, pieces in NAME_PIECES.items():
            first, second = pieces
            up.answer(case, {"content": None}, "tool_calls", deltas=[
                {"role": "assistant"},
                {"tool_calls": [{"index": 0, "id": "call_w", "type": "function",
                                 "function": {**first, "arguments": ""}}]},
                {"tool_calls": [{"index": 0, "function": {**second, "arguments": ""}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
            ])  # fmt: skip
        gw = start_gateway(tmp_path, gateway_config(tmp_path, up.base_url))
        try:
            oc = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
            weather: FunctionToolParam = {
                "type": "function",
                "name": "get_weather",
                "parameters": dict(WEATHER["input_schema"]),
                "strict": False,
            }
            for case in NAME_PIECES:
                with oc.responses.stream(model=MODEL, input=case, tools=[weather]) as rs:
                    events = list(rs)
                    final = rs.get_final_response()
                responses[case] = [
                    (e.type, getattr(e.item, "name", "")) for e in events
                    if e.type in ("response.output_item.added", "response.output_item.done")
                ] + [("completed", getattr(o, "name", "")) for o in final.output]  # fmt: skip
                ask: list[MessageParam] = [{"role": "user", "content": case}]
                with client(gw).messages.stream(
                    model=MODEL, max_tokens=64, messages=ask, tools=[WEATHER]
                ) as ms:
                    said = [e for e in ms if e.type == "content_block_start"]
                    msg = ms.get_final_message()
                messages[case] = [("start", getattr(e.content_block, "name", "")) for e in said]
                messages[case] += [("final", getattr(b, "name", "")) for b in msg.content]
                with oc.chat.completions.stream(
                    model=MODEL,
                    messages=[{"role": "user", "content": case}],
                    tools=[{"type": "function", "function": {"name": "get_weather"}}],
                ) as cs:
                    calls = cs.get_final_completion().choices[0].message.tool_calls or []
                chat[case] = calls[0].function.name if calls else None
        finally:
            gw.stop()
    for case in NAME_PIECES:
        kinds = ["response.output_item.added", "response.output_item.done", "completed"]
        assert responses[case] == [(k, "get_weather") for k in kinds], case
        assert messages[case] == [("start", "get_weather"), ("final", "get_weather")], case
    # The OpenAI SDK, reading the chat API's relay, accumulates the name the same way where
    # a server sends it once; it doubles a name a server repeats.
    assert chat == {
        "in pieces": "get_weather",
        "empty first": "get_weather",
        "repeated": "get_weatherget_weather",
    }

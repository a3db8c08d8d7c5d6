"""The OpenAI-compatible API end to end: real gateway and upstream processes, driven by the
official openai client."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolUnionParam,
)

from pricing import TokenUsage, estimate_tokens, load_default_catalog
from router.outcomes import OutcomeRecord
from tests.conftest import ScriptedRouter
from tests.gateway.conftest import Upstream, abandon_stream, ledger_rows, longest_answer
from tests.support.gateway import Gateway, gateway_config, start_gateway
from tests.support.replay import start_replay_upstream, stop_replay_upstream
from tests.support.sdk import WEATHER_TOOL, extra

MODEL = "mistral-small-24b-instruct-2501-bf16"


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


def recorded(table: list[OutcomeRecord], model: str, index: int = 3) -> tuple[str, dict]:
    rec = [
        r for r in table if model in r.outcomes and (r.outcomes[model].completion_tokens or 0) > 5
    ][index]
    return rec.text, rec.outcomes[model].model_dump()


def expected_cost_usd(model: str, prompt: int, completion: int) -> float:
    return load_default_catalog().require(model).cost_micros(TokenUsage(prompt, completion)) / 1e6


def test_pass_through_returns_recorded_answer_with_cost(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    prompt, out = recorded(demo_table, MODEL)
    raw = client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}]
    )
    resp = raw.parse()
    assert resp.choices[0].message.content == out["response"]
    assert resp.model == MODEL
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (
        out["prompt_tokens"],
        out["completion_tokens"],
    )
    cost = expected_cost_usd(MODEL, out["prompt_tokens"], out["completion_tokens"])
    assert extra(resp.usage)["cost"] == pytest.approx(cost)
    meta = extra(resp)["xrouter"]
    assert meta["policy"] == "passthrough" and meta["calls"][0]["model"] == MODEL
    h = raw.headers
    assert h["x-xrouter-model"] == MODEL and h["x-xrouter-policy"] == "passthrough"
    assert Decimal(h["x-xrouter-cost-usd"]) == Decimal(str(cost)).quantize(Decimal("0.000001"))
    assert h["x-xrouter-request-id"] == meta["request_id"]
    assert float(h["x-xrouter-overhead-ms"]) >= 0


def test_the_sdk_reads_the_request_id_from_answers_streams_and_errors(gateway: Gateway) -> None:
    """OpenAI's API names each request in `x-request-id`, which the SDK reads into
    `_request_id` (and an error's `request_id`): here it is the gateway's request id, the
    one feedback and generation stats take."""
    c = client(gateway)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hi"}]
    resp = c.chat.completions.create(model=MODEL, messages=messages)
    assert resp._request_id == extra(resp)["xrouter"]["request_id"]
    with c.chat.completions.create(model=MODEL, messages=messages, stream=True) as stream:
        chunks = list(stream)
        assert stream.response.headers["x-request-id"] == extra(chunks[-1])["xrouter"]["request_id"]
    with pytest.raises(openai.NotFoundError) as ei:
        c.chat.completions.create(model="gpt-17", messages=messages)
    assert ei.value.request_id == ei.value.response.headers["x-xrouter-request-id"]
    assert ei.value.request_id


def test_feedback_names_a_request_by_its_completion_id_or_its_request_id(
    gateway: Gateway,
) -> None:
    """Right after the answer (its ledger row is written behind the response), by the id an
    OpenAI client shows (`chatcmpl-...`) or by `xrouter.request_id`."""
    c = client(gateway)
    for use_completion_id in (True, False):
        resp = c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Name a prime number."}]
        )
        rid = extra(resp)["xrouter"]["request_id"]
        assert resp.id == f"chatcmpl-{rid}"
        r = httpx.post(
            f"{gateway.base_url}/feedback",
            json={"request_id": resp.id if use_completion_id else rid, "score": 0.75},
        )
        assert r.status_code == 200, r.text
        assert r.json()["request_id"] == rid
    # A stream's ledger row is submitted after its last chunk: feedback sent at once waits
    # for it rather than missing it.
    for _ in range(5):
        stream = c.chat.completions.create(
            model=MODEL,
            stream=True,
            messages=[{"role": "user", "content": "Name another prime number."}],
        )
        ids = {chunk.id for chunk in stream}
        assert len(ids) == 1
        r = httpx.post(f"{gateway.base_url}/feedback", json={"request_id": ids.pop(), "score": 1})
        assert r.status_code == 200, r.text
    # An unknown id is named as it was sent: "no request 'nope'" named an id the client
    # never sent (the ledger's, without the prefix).
    for sent in ("chatcmpl-nope", "resp_nope", "msg_nope", "nope"):
        r = httpx.post(f"{gateway.base_url}/feedback", json={"request_id": sent, "score": 1})
        assert r.status_code == 404 and r.json()["error"]["code"] == "request_not_found"
        assert r.json()["error"]["message"] == f"no request {sent!r} in the ledger", r.text
        assert r.json()["error"]["param"] == "request_id"
    # Bad bodies are refused as every JSON endpoint refuses them; a score is a number.
    r = httpx.post(
        f"{gateway.base_url}/feedback",
        content=b"{bad",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    for score in ("1", True):
        r = httpx.post(f"{gateway.base_url}/feedback", json={"request_id": rid, "score": score})
        assert r.status_code == 400 and r.json()["error"]["param"] == "score", r.text


def _feedback_rows(gw: Gateway, request_id: str) -> list[tuple[float, ...]]:
    with sqlite3.connect(gw.config_path.parent / "ledger.db") as conn:
        return conn.execute(
            "SELECT score, reward, cost_usd, cost_weight, normalized_cost, penalty "
            "FROM feedback WHERE request_id = ? ORDER BY id",
            (request_id,),
        ).fetchall()


def _metric(gw: Gateway, name: str, policy: str) -> float:
    for line in httpx.get(f"{gw.url}/metrics").text.splitlines():
        if line.startswith(f'{name}{{policy="{policy}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_feedback_logs_the_reward_of_its_score_with_every_term(gateway: Gateway) -> None:
    """DESIGN: the reward is one definition used in training, evaluation and the gateway's
    logged reward, every term logged. The gated form with the trainer's defaults (K = 1,
    c_max = 1, cost scale $0.001), at the request's whole cost and its cost weight."""
    count_before = _metric(gateway, "xrouter_feedback_reward_count", "passthrough")
    resp = client(gateway).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a prime number."}],
        extra_body={"xrouter": {"cost_weight": 20.0}},
    )
    rid = extra(resp)["xrouter"]["request_id"]
    cost = extra(resp.usage)["cost"]
    r = httpx.post(f"{gateway.base_url}/feedback", json={"request_id": rid, "score": 0.75})
    assert r.status_code == 200, r.text
    normalized = cost / 0.001
    penalty = min(20.0 * normalized, 1.0)
    terms = r.json()["reward"]
    assert terms == pytest.approx(
        {
            "reward": 0.75 * (1.0 - penalty),
            "score": 0.75,
            "cost_usd": cost,
            "cost_weight": 20.0,
            "normalized_cost": normalized,
            "penalty": penalty,
        }
    )
    assert 0 < penalty < 1, "the case should exercise the penalty, not its cap"
    # In the ledger, every term in its column (the export carries them with the score).
    deadline = time.monotonic() + 5
    while not (rows := _feedback_rows(gateway, rid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rows == [
        pytest.approx(
            (0.75, terms["reward"], cost, 20.0, terms["normalized_cost"], terms["penalty"])
        )
    ]
    # And for operators, per policy, as it comes in.
    assert _metric(gateway, "xrouter_feedback_reward_count", "passthrough") == count_before + 1
    assert _metric(gateway, "xrouter_feedback_score_sum", "passthrough") >= 0.75


def test_streaming_relays_chunks_in_order_and_ends_with_usage_and_cost(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    prompt, out = recorded(demo_table, MODEL, 5)
    stream = client(gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], stream=True
    )
    chunks = list(stream)
    assert len(chunks) > 3
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == out["response"]
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["stop"]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == out["completion_tokens"]
    assert extra(last.usage)["cost"] == pytest.approx(
        expected_cost_usd(MODEL, out["prompt_tokens"], out["completion_tokens"])
    )
    assert all(c.model == MODEL for c in chunks)
    assert len({c.id for c in chunks}) == 1


@pytest.mark.parametrize("model", ["xrouter/cheapest", "xrouter/cascade", "xrouter"])
def test_router_models_answer_and_report_the_answering_model(
    gateway: Gateway, demo_table: list[OutcomeRecord], model: str
) -> None:
    prompt, _ = recorded(demo_table, MODEL, 7)
    resp = client(gateway).chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}]
    )
    meta = extra(resp)["xrouter"]
    assert resp.model in {c["model"] for c in meta["calls"]}
    assert meta["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in meta["calls"]))
    assert extra(resp.usage)["cost"] == pytest.approx(meta["cost_usd"])
    assert meta["decision"]["actions"]


def test_router_streams_too(gateway: Gateway, demo_table: list[OutcomeRecord]) -> None:
    prompt, _ = recorded(demo_table, MODEL, 8)
    chunks = list(
        client(gateway).chat.completions.create(
            model="xrouter/cascade", messages=[{"role": "user", "content": prompt}], stream=True
        )
    )
    assert chunks[-1].usage is not None and extra(chunks[-1].usage)["cost"] > 0
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_tools_round_trip(gateway: Gateway) -> None:
    tools: list[ChatCompletionToolUnionParam] = [WEATHER_TOOL]
    c = client(gateway)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Weather in Paris?"}]
    first = c.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    tool_calls = first.choices[0].message.tool_calls
    assert tool_calls is not None
    call = tool_calls[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert "city" in json.loads(call.function.arguments)
    messages += [
        # The assistant's message as it came, sent back as the next request's history.
        cast(
            ChatCompletionAssistantMessageParam,
            first.choices[0].message.model_dump(exclude_none=True),
        ),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ]
    second = c.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    assert "sunny, 21C" in (second.choices[0].message.content or "")


def test_json_mode(gateway: Gateway) -> None:
    resp = client(gateway).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give me JSON"}],
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(resp.choices[0].message.content or ""), dict)


def test_n_greater_than_one(gateway: Gateway) -> None:
    resp = client(gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], n=3
    )
    assert [c.index for c in resp.choices] == [0, 1, 2]


def test_n_greater_than_one_streams_every_choice_of_a_selected_answer(gateway: Gateway) -> None:
    """The cascade's cheap models agree on a tool call and it selects one's answer, which is
    complete before it is streamed (not relayed): every one of its `n` choices is streamed,
    as the plain request gets them all."""
    tools: list[ChatCompletionToolUnionParam] = [WEATHER_TOOL]
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "What's the weather in Lyon?"}
    ]
    c = client(gateway)
    plain = c.chat.completions.create(model="xrouter/cascade", messages=messages, tools=tools, n=2)
    assert len(plain.choices) == 2
    with c.chat.completions.stream(
        model="xrouter/cascade", messages=messages, tools=tools, n=2
    ) as stream:
        last = [e.chunk for e in stream if e.type == "chunk"][-1]
        streamed = stream.get_final_completion()
    # Routed the same way: a selection, not a relayed stream.
    assert [ca["turn"] for ca in extra(last)["xrouter"]["calls"]] == [0, 0]
    assert [ch.index for ch in streamed.choices] == [0, 1]
    for got, want in zip(streamed.choices, plain.choices, strict=True):
        assert got.finish_reason == want.finish_reason == "tool_calls"
        assert got.message.tool_calls is not None and want.message.tool_calls is not None
        assert [(t.id, t.function.name, t.function.arguments) for t in got.message.tool_calls] == [
            (t.id, t.function.name, t.function.arguments)
            for t in want.message.tool_calls
            if isinstance(t, ChatCompletionMessageFunctionToolCall)
        ]


def test_null_n_and_stream_are_their_defaults_as_the_sdk_sends_them(gateway: Gateway) -> None:
    """OpenAI's reference gives both as "or null, defaults to ..."; the SDK sends ``null``
    for an argument passed as None, on chat and on the Responses API."""
    c = client(gateway)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hi"}]
    answer = c.chat.completions.create(model=MODEL, messages=messages, n=None, stream=None)
    assert [ch.index for ch in answer.choices] == [0] and answer.object == "chat.completion"
    response = c.responses.create(model=MODEL, input="Say hi", stream=None)
    assert response.object == "response" and response.output_text
    # Only null: a wrong type is still the client's mistake.
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": MODEL, "messages": messages, "n": "2"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_unknown_fields_are_tolerated(gateway: Gateway) -> None:
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "top_k": 3,
            "vendor_extension": {"a": 1},
        },
    )
    assert r.status_code == 200


def test_models_list_has_routers_and_priced_pool(gateway: Gateway) -> None:
    models = {m.id: m for m in client(gateway).models.list()}
    assert {"xrouter", "xrouter/cascade", MODEL} <= models.keys()
    assert extra(models[MODEL])["xrouter"]["price"]["input_per_mtok"] == "0.1"


def test_health_and_ready(gateway: Gateway) -> None:
    assert httpx.get(f"{gateway.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{gateway.url}/readyz").json()["status"] == "ready"
    # Uptime monitors probe with HEAD: the status, no body.
    for path in ("/healthz", "/readyz"):
        r = httpx.head(f"{gateway.url}{path}")
        assert r.status_code == 200 and r.content == b"", path


# ---------------------------------------------------------------- errors


def error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= body["error"].keys()
    return body["error"]


def test_malformed_json_is_400(gateway: Gateway) -> None:
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and error(r)["code"] == "invalid_json"


@pytest.mark.parametrize("where", ["tools", "unknown_field"])
def test_a_body_nested_too_deeply_to_forward_is_400(
    gateway: Gateway, upstream: Upstream, where: str
) -> None:
    """Valid JSON 300 levels deep (a JSON reader takes 1,024) is more than the gateway can
    write back to forward or log: a 400 before routing, not a 500 after it. A body of
    usual depth still goes through."""

    def body(depth: int) -> bytes:
        nested = "[" * depth + "]" * depth
        extra = (
            f'"tools": [{{"type": "function", "function": {{"name": "f", "parameters": '
            f'{{"type": "object", "x": {nested}}}}}}}]'
            if where == "tools"
            else f'"vendor_extension": {nested}'
        )
        return (
            f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "x"}}], {extra}}}'
        ).encode()

    def post(depth: int) -> httpx.Response:
        return httpx.post(
            f"{gateway.base_url}/chat/completions",
            content=body(depth),
            headers={"content-type": "application/json"},
        )

    r = post(300)
    assert r.status_code == 400, r.text
    assert error(r)["code"] == "invalid_json"
    assert not upstream.stats()["requests"]
    assert "Traceback" not in gateway.log()
    r = post(100)
    assert r.status_code == 200, r.text


ASKED = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "messages"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 7},
            "temperature",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "xrouter": {"cost_weight": -1},
            },
            "xrouter.cost_weight",
        ),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        # Fields of more than one type: the field, not the type pydantic tried first.
        ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": 5}, "stop"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tool_choice": 1},
            "tool_choice",
        ),
        # What each role's message needs: its content, a tool result its call's id.
        ({"model": MODEL, "messages": [{"role": "user"}]}, "messages[0].content"),
        ({"model": MODEL, "messages": [{"role": "user", "content": []}]}, "messages[0].content"),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}, {"role": "system", "content": None}],
            },
            "messages[1].content",
        ),
        (
            {"model": MODEL, "messages": [{"role": "tool", "content": "42"}]},
            "messages[0].tool_call_id",
        ),
        # A tool result answers a call an assistant message made before it.
        *(
            (
                {
                    "model": MODEL,
                    "messages": [
                        {"role": "user", "content": "x"},
                        {"role": "assistant", "content": None, "tool_calls": [ASKED]},
                        {"role": "tool", "tool_call_id": answers, "content": "42"},
                    ],
                },
                "messages[2].tool_call_id",
            )
            for answers in ("call_other", "")
        ),
        # The history's calls as OpenAI checks them: an id, the type, a name, string arguments.
        *(
            (
                {
                    "model": MODEL,
                    "messages": [
                        {"role": "user", "content": "x"},
                        {"role": "assistant", "content": None, "tool_calls": [call]},
                    ],
                },
                f"messages[1].tool_calls[0].{param}",
            )
            for call, param in (
                ({k: v for k, v in ASKED.items() if k != "id"}, "id"),
                ({**ASKED, "type": "banana"}, "type"),
                ({k: v for k, v in ASKED.items() if k != "function"}, "function"),
                ({**ASKED, "function": {"arguments": "{}"}}, "function.name"),
                ({**ASKED, "function": {"name": "f", "arguments": {"a": 1}}}, "function.arguments"),
            )
        ),
        # Tool names as OpenAI takes them, and no two alike.
        *(
            (
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "x"}],
                    "tools": [{"type": "function", "function": {"name": n}} for n in names],
                },
                param,
            )
            for names, param in (
                (["bad name!"], "tools[0].function.name"),
                (["a", "b", "a"], "tools"),
            )
        ),
        # Options of a stream that is not one: `stream` forgotten, as OpenAI and vLLM say.
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "stream_options": {"include_usage": True},
            },
            "stream_options",
        ),
        # A JSON schema format as OpenAI requires it: an object, with a name of its kind.
        *(
            (
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "x"}],
                    "response_format": f,
                },
                param,
            )
            for f, param in (
                ({"type": "json_schema"}, "response_format"),
                (
                    {"type": "json_schema", "json_schema": {"schema": {}}},
                    "response_format.json_schema.name",
                ),
                (
                    {"type": "json_schema", "json_schema": {"name": "a b"}},
                    "response_format.json_schema.name",
                ),
                (
                    {"type": "json_schema", "json_schema": {"name": "n", "schema": []}},
                    "response_format.json_schema.schema",
                ),
            )
        ),
    ],
)
def test_schema_violations_are_400_naming_the_param(
    gateway: Gateway, body: dict, param: str
) -> None:
    r = httpx.post(f"{gateway.base_url}/chat/completions", json=body)
    assert r.status_code == 400
    assert error(r)["param"] == param


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", "0.7"),
        ("max_tokens", "64"),
        ("n", 2.0),
        ("stream", "false"),
        ("logprobs", "yes"),
        ("seed", "42"),
        # Inside the request's parts too.
        ("stream_options", {"include_usage": "false"}),
        ("tools", [{"type": "function", "function": {"name": "f", "strict": "yes"}}]),
        ("xrouter", {"cost_weight": "0.5"}),
    ],
)
def test_values_of_the_wrong_type_are_400_not_forwarded(
    gateway: Gateway, upstream: Upstream, field: str, value: object
) -> None:
    """OpenAI refuses a string where a number goes: so does the gateway, rather than act on
    a coerced reading (`"stream": "false"` streamed) and forward the string to a provider,
    whose 400 would come back as a 502 the SDKs retry."""
    # stream_options is checked where it is allowed: in a stream.
    streaming = {"stream": True} if field == "stream_options" else {}
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            field: value,
            **streaming,
        },
    )
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    assert error(r)["param"].split(".")[0].split("[")[0] == field  # the field, or within it
    if streaming:
        assert "valid boolean" in error(r)["message"]  # the nested type, not the rule above
    assert not upstream.stats()["requests"]


@pytest.mark.parametrize(
    ("part", "param", "says"),
    [
        ({"text": "hi"}, "messages[0].content[0].type", "Field required"),
        ({"type": "text"}, "messages[0].content[0].text", "Field required"),
        ({"type": "text", "text": 3}, "messages[0].content[0].text", "valid string"),
        ({"type": "image_url"}, "messages[0].content[0].image_url", "Field required"),
        (
            {"type": "image_url", "image_url": "https://x/a.png"},
            "image_url",
            "Input should be a valid dictionary",  # not "... or instance of ImageURL"
        ),
        ({"type": "image_url", "image_url": {"detail": "low"}}, "image_url.url", "required"),
        (
            {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "max"}},
            "image_url.detail",
            "'auto', 'low' or 'high'",
        ),
        ({"type": "input_audio", "input_audio": {"data": "AAA="}}, "input_audio.format", ""),
        ({"type": "file", "file": {"filename": "a.pdf"}}, "[0]", "'file_data' or 'file_id'"),
    ],
)
def test_a_malformed_content_part_is_400_naming_it(
    gateway: Gateway, upstream: Upstream, part: dict, param: str, says: str
) -> None:
    """A part of a type OpenAI defines is checked for its payload, as OpenAI checks it: a
    provider's 400 for it would reach the client as a 502 after a routed call. The error
    names the part, not the ``str`` form of ``content`` that the list also failed to be."""
    # Malformed on purpose: the SDK's types would not let it be written.
    messages = cast(list[ChatCompletionMessageParam], [{"role": "user", "content": [part]}])
    with pytest.raises(openai.BadRequestError) as ei:
        client(gateway).chat.completions.create(model="xrouter", messages=messages)
    err = cast(dict, ei.value.body)
    assert err["param"].startswith("messages[0].content[0]") and err["param"].endswith(param)
    assert err["message"].startswith(err["param"]) and err["message"].endswith(says)
    assert not upstream.stats()["requests"]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("messages", [{"role": "user", "content": 5}], "a valid string or a valid list"),
        ("stop", 5, "a valid string or a valid list"),
    ],
)
def test_a_value_that_is_no_member_of_a_union_is_told_every_member(
    gateway: Gateway, field: str, value: object, says: str
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], field: value}
    r = httpx.post(f"{gateway.base_url}/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert error(r)["message"].endswith(f"Input should be {says}")


IMAGE_PART = {"type": "image_url", "image_url": {"url": "https://x/a.png"}}


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "system", "content": [IMAGE_PART]}, {"role": "user", "content": "x"}], 0),
        (
            [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "text", "text": "a"}, IMAGE_PART]},
                {"role": "user", "content": "y"},
            ],
            1,
        ),
        ([{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}], 0),
    ],
)
def test_a_part_its_role_cannot_hold_is_400(
    gateway: Gateway, upstream: Upstream, messages: list[dict], param: int
) -> None:
    """Only a user's message carries images, audio and files, and only an assistant's a
    refusal, as OpenAI's API has it: a provider's 400 for it would be a 502 here."""
    r = httpx.post(
        f"{gateway.base_url}/chat/completions", json={"model": MODEL, "messages": messages}
    )
    assert r.status_code == 400, r.text
    assert error(r)["param"].startswith(f"messages[{param}].content[")
    assert error(r)["param"].endswith("].type")
    assert not upstream.stats()["requests"]


@pytest.mark.parametrize(
    "part",
    [
        {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}},
        # Another API's spelling, with a field named as one of OpenAI's but shaped otherwise.
        {"type": "input_image", "image_url": "https://x/a.png"},
    ],
)
def test_a_content_part_of_another_type_is_forwarded(
    gateway: Gateway, upstream: Upstream, part: dict
) -> None:
    """Parts of types OpenAI does not define (``video_url``, ``document``: providers behind
    LiteLLM define their own) are the provider's to judge, and reach it as sent."""
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}],
        },
    )
    assert r.status_code == 200, r.text
    assert upstream.stats()["requests"] == {MODEL: 1}


def test_openai_client_sees_bad_request(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError):
        client(gateway).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=9
        )


@pytest.mark.parametrize(
    ("change", "param", "code"),
    [
        ({"model": None}, "model", "missing_required_parameter"),
        ({"messages": []}, "messages", "empty_array"),
        ({"messages": [{"role": "bogus", "content": "x"}]}, "messages[0].role", "invalid_value"),
        ({"temperature": "hot"}, "temperature", "invalid_type"),
        ({"top_p": 1.5}, "top_p", "decimal_above_max_value"),
        ({"xrouter": {"cost_weight": 1.0, "colour": "red"}}, "xrouter.colour", "unknown_parameter"),
        # A rule of the gateway's own, which OpenAI has no code for.
        ({"stream_options": {"include_usage": True}}, "stream_options", None),
    ],
)
def test_the_sdk_reads_openais_code_for_a_parameter_the_schema_refuses(
    gateway: Gateway, change: dict[str, Any], param: str, code: str | None
) -> None:
    """``exc.code`` is the code OpenAI gives the same body, for clients that branch on it
    (every schema error had ``code: null``)."""
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(openai.BadRequestError) as err:
        client(gateway).post("/chat/completions", body=body, cast_to=httpx.Response)
    assert (err.value.param, err.value.code) == (param, code)


def test_both_output_limits_at_once_are_openais_400(gateway: Gateway, upstream: Upstream) -> None:
    """OpenAI refuses max_tokens with max_completion_tokens; upstreams that take the pair
    differ in which one they honour. The gateway answers OpenAI's 400 itself (the pair was
    forwarded, to whichever upstream routing picked)."""
    before = upstream.stats()["requests"].get(MODEL, 0)
    for model in (MODEL, "xrouter"):
        with pytest.raises(openai.BadRequestError) as exc:
            client(gateway).chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "x"}],
                max_tokens=10,
                max_completion_tokens=20,
            )
        error = exc.value.response.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_parameter_combination", "max_tokens")
        assert "at the same time is not supported" in error["message"]
    assert upstream.stats()["requests"].get(MODEL, 0) == before
    # Either one alone is forwarded as before.
    messages: list[Any] = [{"role": "user", "content": "x"}]
    c = client(gateway)
    assert c.chat.completions.create(model=MODEL, messages=messages, max_tokens=10).choices
    assert c.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=10
    ).choices


@pytest.mark.parametrize("model", ["gpt-17", "xrouter/nonsense"])
def test_unknown_model_is_404(gateway: Gateway, model: str) -> None:
    with pytest.raises(openai.NotFoundError) as ei:
        client(gateway).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}]
        )
    body = ei.value.body
    assert isinstance(body, dict)
    assert body["code"] == "model_not_found"


def test_body_over_limit_is_413(gateway: Gateway) -> None:
    big = "x" * 70_000
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": big}]},
    )
    assert r.status_code == 413 and error(r)["code"] == "request_too_large"
    # Refused before it was a request the ledger keeps: named all the same, as every answer.
    assert r.headers["x-request-id"] == r.headers["x-xrouter-request-id"]


@pytest.mark.parametrize(
    ("fault", "status", "exc"),
    [
        ("status=500", 502, openai.InternalServerError),
        ("status=400", 400, openai.BadRequestError),
        ("status=422", 400, openai.BadRequestError),
        ("status=401", 502, openai.InternalServerError),
        ("status=503", 502, openai.InternalServerError),
        ("status=429", 503, openai.InternalServerError),
        ("timeout=30", 504, openai.InternalServerError),
        ("drop", 503, openai.InternalServerError),
    ],
)
def test_upstream_failures_map_to_status_codes_and_are_sanitized(
    gateway: Gateway, upstream: Upstream, fault: str, status: int, exc: type
) -> None:
    # Faults on every attempt (the pool entry retries once): the client sees the mapped error.
    upstream.fault(MODEL, fault, count=5)
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
        timeout=30,
    )
    assert r.status_code == status, r.text
    err = error(r)
    assert err["type"] == "upstream_error"
    for leak in ("sk-replay-SECRET", "10.1.2.3", "http://", "127.0.0.1"):
        assert leak not in r.text
    # A refusal — of the request itself (a 400 the client sees: its to fix), or of the
    # gateway's credentials (401: a 502, the gateway's to fix) — would be refused again: the
    # SDKs are told not to retry it (they retry every 5xx otherwise); what may pass is left
    # to them.
    refused = fault in ("status=400", "status=422", "status=401")
    assert r.headers.get("x-should-retry") == ("false" if refused else None)
    if status == 400:
        assert err["code"] == "upstream_bad_request"
    if refused:  # and the SDK raises what its status says (fast: nothing is retried)
        upstream.fault(MODEL, fault, count=5)
        with pytest.raises(exc):
            client(gateway).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}]
            )


def test_the_sdk_does_not_send_a_refused_request_again(
    gateway: Gateway, upstream: Upstream
) -> None:
    upstream.fault(MODEL, "status=401", count=10)  # the gateway's key refused: a 502
    sdk = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=2)
    with pytest.raises(openai.InternalServerError):
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert upstream.stats()["requests"][MODEL] == 1  # not 3: the SDK did not retry


# Bug: an upstream's retry-after was dropped, so the SDK retried at once into the limit.
def test_an_upstream_rate_limit_passes_its_wait_on(gateway: Gateway, upstream: Upstream) -> None:
    # 30 s is past the gateway's backoff cap: it does not wait itself, it says so.
    upstream.fault(MODEL, "rate-limit=30", count=1)
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 503 and error(r)["code"] == "upstream_rate_limited"
    assert (r.headers["retry-after"], r.headers["retry-after-ms"]) == ("30", "30000")
    assert "x-should-retry" not in r.headers
    assert upstream.stats()["requests"][MODEL] == 1


def test_the_sdk_waits_as_long_as_the_upstream_asked(gateway: Gateway, upstream: Upstream) -> None:
    # 1 s is within the cap: the gateway waits and tries once more, then gives up and
    # passes the wait on; the SDK waits that long (not its own ~0.5 s) before its retry.
    upstream.fault(MODEL, "rate-limit=1", count=2)
    sdk = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=1)
    started = time.monotonic()
    r = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert r.choices[0].message.content
    assert time.monotonic() - started >= 1.9  # its own backoff would be ~0.5 s: ~1.5 s in all
    assert upstream.stats()["requests"][MODEL] == 3


def test_retry_recovers_from_one_transient_failure(gateway: Gateway, upstream: Upstream) -> None:
    upstream.fault(MODEL, "status=503", count=1)
    resp = client(gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}]
    )
    assert resp.choices[0].message.content
    assert upstream.stats()["requests"][MODEL] == 2


def test_fifty_concurrent_requests_all_correct(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    pairs = [recorded(demo_table, MODEL, i) for i in range(50)]

    async def run() -> list[tuple[str, str | None]]:
        ac = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
        async with ac:
            rs = await asyncio.gather(
                *(
                    ac.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": p}]
                    )
                    for p, _ in pairs
                )
            )
        return [(r.choices[0].message.content or "", extra(r)["xrouter"]["request_id"]) for r in rs]

    got = asyncio.run(run())
    assert [g[0] for g in got] == [o["response"] for _, o in pairs]
    assert len({g[1] for g in got}) == 50


def test_client_disconnect_mid_stream_cancels_upstream(
    gateway: Gateway, upstream: Upstream, demo_table: list[OutcomeRecord]
) -> None:
    # A long recorded answer streamed slowly (3 ms per chunk) that the client abandons.
    rec = longest_answer(demo_table, MODEL)
    request_id = abandon_stream(gateway.base_url, MODEL, rec.text)
    stats = upstream.abandoned_streams()
    assert stats["streams_abandoned"] == 1, stats
    # The abandoned request is in the ledger: status 499 (client closed), and charged for
    # what it used before the hang-up (the usage chunk never came, so the prompt and the
    # relayed text are estimated) rather than for nothing.
    request, calls = ledger_rows(gateway, request_id)
    status, is_stream, total = request
    assert (status, is_stream) == (499, 1)
    [(model, cost, prompt_tokens, completion_tokens, error_type)] = calls
    assert (model, error_type) == (MODEL, "connection")
    assert prompt_tokens == estimate_tokens(rec.text)
    # Part of the answer: fewer estimated tokens than the whole answer would give (the
    # recorded count is a real tokenizer's, which the chars/4 estimate can exceed).
    assert 1 <= completion_tokens < estimate_tokens(rec.outcomes[MODEL].response or "")
    price = load_default_catalog().require(MODEL)
    assert cost == price.cost_micros(TokenUsage(prompt_tokens, completion_tokens)) > 0
    assert total == cost
    # The gateway still serves (no leaked concurrency slot) and logged no traceback.
    resp = client(gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "after"}]
    )
    assert resp.choices[0].message.content
    log = gateway.log()
    assert "Traceback" not in log, log[max(0, log.find("Traceback") - 300) :][:3000]
    # The relay closed the abandoned stream itself: its slot did not wait for the garbage
    # collector's safety net.
    assert "dropped without being closed" not in log, log


def test_upstream_without_usage_is_charged_an_estimate(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    # Some OpenAI-compatible servers report no usage (or ignore include_usage when
    # streaming). The answer still reaches the client whole, and the call is charged an
    # estimate from the prompt and the answer, never nothing.
    prompt, out = recorded(demo_table, MODEL, 7)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": f"[[replay:no-usage]]{prompt}"}
    ]
    resp = client(gateway).chat.completions.create(model=MODEL, messages=messages)
    assert resp.choices[0].message.content == out["response"]
    assert resp.usage is not None
    assert resp.usage.completion_tokens == estimate_tokens(out["response"])
    assert extra(resp.usage)["cost"] > 0
    chunks = list(
        client(gateway).chat.completions.create(model=MODEL, messages=messages, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == out["response"]
    last = chunks[-1]
    assert last.usage is not None and extra(last.usage)["cost"] > 0
    request, calls = ledger_rows(gateway, extra(last)["xrouter"]["request_id"])
    assert request[0] == 200 and calls[0][4] is None and calls[0][3] > 0


@pytest.fixture(scope="module")
def deadline_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway of short timeouts — requests may take at most 1 s, idle connections stay
    open 1 s — on an upstream that streams slowly (50 ms per chunk), so a long answer
    outlives the deadline mid-stream."""
    tmp = tmp_path_factory.mktemp("deadline")
    proc, base_url = start_replay_upstream(tmp, "--stream-chunk-delay-ms", "50")
    server = {"request_timeout_s": 1.0, "keep_alive_s": 1}
    gw = start_gateway(tmp, gateway_config(tmp, base_url, server=server))
    yield gw
    gw.stop()
    stop_replay_upstream(proc)


def test_request_deadline_cuts_a_slow_call_with_504(
    deadline_gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    prompt, _ = recorded(demo_table, MODEL)
    started = time.monotonic()
    r = httpx.post(
        f"{deadline_gateway.base_url}/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": f"[[replay:latency=5000]]{prompt}"}],
        },
        timeout=30,
    )
    assert time.monotonic() - started < 4
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_timeout"
    assert "did not finish within 1 s" in r.json()["error"]["message"]
    request, calls = ledger_rows(deadline_gateway, r.headers["x-xrouter-request-id"])
    assert request[0] == 504
    # The call the deadline cut is a timeout (the model did not answer in time), not a
    # client's hang-up, which an export for training leaves out.
    assert [(c[0], c[4]) for c in calls] == [(MODEL, "timeout")]
    # Its upstream had read the prompt: charged that, estimated, on the call and the row.
    ((_, cost, prompt_tokens, completion_tokens, _),) = calls
    assert cost > 0 and prompt_tokens > 0 and completion_tokens == 0
    assert request[2] == cost


def test_request_deadline_ends_a_long_stream_with_an_error_event(
    deadline_gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    rec = longest_answer(demo_table, MODEL)
    started = time.monotonic()
    with httpx.stream(
        "POST",
        f"{deadline_gateway.base_url}/chat/completions",
        json={"model": MODEL, "stream": True, "messages": [{"role": "user", "content": rec.text}]},
        timeout=30,
    ) as r:
        assert r.status_code == 200
        request_id = r.headers["x-xrouter-request-id"]
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    assert time.monotonic() - started < 4
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "upstream_timeout"
    content = [json.loads(e) for e in events[:-2]]
    assert content and all(c["choices"] for c in content)
    # Charged for what streamed before the cut (an estimate: no usage chunk came).
    request, calls = ledger_rows(deadline_gateway, request_id)
    assert request[0] == 504 and calls[0][1] > 0 and calls[0][3] >= 1


def _ttft_count(gw: Gateway, model: str) -> float:
    """The time-to-first-token histogram's observation count for ``model`` (0 if none)."""
    for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("xrouter_time_to_first_token_seconds_count") and (
            f'model="{model}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_streamed_calls_record_time_to_first_token(gateway: Gateway) -> None:
    # The module's gateway is shared (other tests stream, and fail, through it): count what
    # this one successful stream adds, which must be exactly one observation.
    before = _ttft_count(gateway, MODEL)
    chunks = list(
        client(gateway).chat.completions.create(
            model=MODEL, stream=True, messages=[{"role": "user", "content": "ttft"}]
        )
    )
    assert chunks and chunks[-1].usage is not None  # the stream completed
    # The call is accounted for as the stream closes: wait for it, not for a time.
    deadline = time.monotonic() + 5
    while _ttft_count(gateway, MODEL) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _ttft_count(gateway, MODEL) - before == 1


def _healthz_on(sock: socket.socket) -> bytes:
    """One keep-alive request on an open connection; its whole response ("" if closed)."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
                 .split(b":")[1])  # fmt: skip
    while len(body) < length:
        body += sock.recv(4096)
    return head


def test_idle_connections_outlive_the_clients_keep_alive(
    gateway: Gateway, deadline_gateway: Gateway
) -> None:
    # A server that drops idle connections as soon as clients (httpx: 5 s) or balancers
    # (60 s and more) may reuse them races them: a request sent as the server closes gets
    # a reset. The default keeps them 75 s; `server.keep_alive_s` sets it.
    def connect(gw: Gateway) -> socket.socket:
        host, port = gw.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=10)
        assert _healthz_on(sock).startswith(b"HTTP/1.1 200")
        return sock

    default, short = connect(gateway), connect(deadline_gateway)
    try:
        time.sleep(6.0)  # idle past httpx's expiry and uvicorn's own default (5 s)
        assert _healthz_on(default).startswith(b"HTTP/1.1 200")  # the same connection
        assert short.recv(1) == b""  # closed by the gateway after its 1 s
    finally:
        default.close()
        short.close()


# ---------------------------------------------------------------- what reaches the provider


@pytest.fixture(scope="module")
def recording_gateway(
    scripted_router: ScriptedRouter, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """A gateway whose one pool model is a scripted server that records every request body
    it receives: what the gateway forwards, as the provider sees it."""
    tmp = tmp_path_factory.mktemp("recording")
    pool = [
        {
            "name": "recorder",
            "model": "openai/recorder",
            "api_base": scripted_router.base_url,
            "price": {"input": 1, "output": 1},
            "max_retries": 0,
        }
    ]
    gw = start_gateway(tmp, gateway_config(tmp, scripted_router.base_url, pool=pool))
    yield gw
    gw.stop()


def test_tool_settings_without_tools_are_not_forwarded(
    recording_gateway: Gateway, scripted_router: ScriptedRouter
) -> None:
    """Chat APIs refuse `tool_choice`, `parallel_tool_calls` and an empty `tools` list when
    no tool is offered (OpenAI: a 400), and agents send them with their tools left out: the
    ones that only say "no tool call" are dropped; one that forces a call is a 400 here."""
    c = client(recording_gateway)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hi"}]
    scripted_router.script({"content": "hi"})
    resp = c.chat.completions.create(
        model="recorder",
        messages=messages,
        tools=[],
        tool_choice="auto",
        parallel_tool_calls=False,
        temperature=0.2,
    )
    assert resp.choices[0].message.content == "hi"
    [sent] = scripted_router.requests()
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & sent.keys()
    assert sent["temperature"] == 0.2  # the rest as sent
    scripted_router.script({"content": "unused"})
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="recorder", messages=messages, tool_choice="required")
    assert isinstance(ei.value.body, dict) and ei.value.body["param"] == "tool_choice"
    assert scripted_router.requests() == []


@pytest.mark.parametrize(
    ("taken", "refused"),
    [
        # OpenRouter's usage accounting asks for what every answer here carries (the cost
        # in `usage`); forwarded, OpenAI's API refused it as an unknown argument, and a
        # client moved from OpenRouter got that 400 from every model.
        ({"usage": {"include": True}}, [({"usage": {"include": "yes"}}, "usage.include")]),
        # `store: true` forwarded had OpenAI keep the client's conversation (and its
        # `metadata`) in the operator's account, while the Responses API answers `store:
        # false` and forwards neither. `metadata` is any object, as LiteLLM's proxy takes
        # it (its clients send lists in it), of which only `tags` is read: it files the
        # request as xrouter.tags does (tests/gateway/test_operators.py).
        (
            {"store": True, "metadata": {"tags": ["a"], "trace": {"id": 1}, "n": 2}},
            [
                ({"store": "yes"}, "store"),
                ({"metadata": ["feature"]}, "metadata"),
                ({"metadata": {"tags": "search"}}, "metadata.tags"),
                ({"metadata": {"tags": [""]}}, "metadata.tags"),
            ],
        ),
    ],
)
def test_fields_for_the_gateway_are_taken_and_not_forwarded(
    recording_gateway: Gateway,
    scripted_router: ScriptedRouter,
    taken: dict[str, Any],
    refused: list[tuple[dict[str, Any], str]],
) -> None:
    c = client(recording_gateway)
    scripted_router.script({"content": "hi"})
    resp = c.chat.completions.create(
        model="recorder",
        messages=[{"role": "user", "content": "Say hi"}],
        temperature=0.2,
        extra_body=taken,
    )
    assert extra(resp.usage)["cost"] > 0
    [sent] = scripted_router.requests()
    assert not set(taken) & set(sent) and sent["temperature"] == 0.2
    # Checked as the rest of the request is: a string is no boolean.
    scripted_router.script({"content": "unused"})
    for body, param in refused:
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(
                model="recorder", messages=[{"role": "user", "content": "Say hi"}], extra_body=body
            )
        assert err.value.param == param, (body, err.value)
    assert scripted_router.requests() == []


def test_overhead_excludes_the_time_spent_waiting_on_the_model(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    # `x-xrouter-overhead-ms` is what the gateway itself adds: the request's wall time less
    # its calls'. With an upstream 400 ms slow, the request takes that long, and the
    # overhead must stay far below it (counting the call's time in would make it exceed it).
    prompt, out = recorded(demo_table, MODEL)
    started = time.monotonic()
    raw = client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": f"[[replay:latency=400]]{prompt}"}]
    )
    elapsed_ms = (time.monotonic() - started) * 1000
    assert raw.parse().choices[0].message.content == out["response"]
    assert elapsed_ms >= 400
    assert 0 <= float(raw.headers["x-xrouter-overhead-ms"]) < 200


def test_a_body_that_is_not_utf8_is_said_to_be_so_on_every_json_endpoint(
    gateway: Gateway,
) -> None:
    body = '{"model": "é"}'.encode("latin-1")
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/feedback"):
        r = httpx.post(
            f"{gateway.url}{path}", content=body, headers={"content-type": "application/json"}
        )
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert error["code"] == "invalid_json"
        assert "not valid UTF-8 (at byte offset 11)" in error["message"], (path, error)

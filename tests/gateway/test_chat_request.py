"""Reading a chat request's body (``gateway.chat_request``): the JSON nesting bound.
The schema's and the per-message checks' answers over HTTP are in ``test_chat_api``."""

from __future__ import annotations

import orjson
import pytest

from gateway.chat_request import decode_json, validate_request
from gateway.errors import APIError

MODEL = "mistral-small-24b-instruct-2501-bf16"


@pytest.mark.parametrize("padding", [0, 400 * 1024])
@pytest.mark.parametrize("tools", [0, 3_000])  # 3,000 tools: past the walk's budget
def test_the_depth_check_is_the_same_whichever_way_it_is_made(padding: int, tools: int) -> None:
    """Small bodies are checked by writing them back, large ones (an image, a document) by
    walking them, and a large one with many arrays and objects by writing it back after
    all: each way refuses what is too deep to write back, and only that."""

    def body(depth: int) -> bytes:
        shallow = orjson.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x" * padding}],
                "tools": [
                    {"type": "function", "function": {"name": f"f{i}"}} for i in range(tools)
                ],
            }
        )
        # Written by hand: no JSON writer goes that deep.
        return shallow[:-1] + b',"deep":' + b"[" * depth + b"]" * depth + b"}"

    assert decode_json(body(200))["deep"] is not None
    for depth in (300, 250):
        with pytest.raises(APIError) as exc:
            decode_json(body(depth))
        assert exc.value.status == 400 and exc.value.code == "invalid_json"


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        ({"type": "function", "function": {"name": "time"}}, "tool_choice.function.name"),
        ({"type": "function", "function": {}}, "tool_choice.function.name"),
        ({"type": "function"}, "tool_choice.function.name"),
        # Only function tools are served: any other object was sent to every model in turn.
        ({"type": "bogus"}, "tool_choice"),
        ({}, "tool_choice"),
        ({"type": "custom", "custom": {"name": "weather"}}, "tool_choice"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, "tool_choice"),
    ],
)
def test_a_named_tool_choice_must_name_an_offered_tool(choice: dict, param: str) -> None:
    with pytest.raises(APIError) as exc:
        validate_request(
            {"model": "m", "messages": USER, "tools": [WEATHER], "tool_choice": choice}
        )
    assert exc.value.status == 400 and exc.value.param == param


def test_a_named_tool_choice_of_an_offered_tool_is_forwarded_as_sent() -> None:
    choice = {"type": "function", "function": {"name": "weather"}}
    data, _ = validate_request(
        {"model": "m", "messages": USER, "tools": [WEATHER], "tool_choice": choice}
    )
    assert data["tool_choice"] == choice


def test_a_value_that_is_no_member_of_a_union_names_every_member() -> None:
    with pytest.raises(APIError) as exc:
        validate_request({"model": "m", "messages": [{"role": "user", "content": 5}]})
    assert exc.value.param == "messages[0].content"
    assert exc.value.message.startswith("messages[0].content: Input should be a valid string or")


def test_a_body_that_is_not_utf8_is_said_to_be_so() -> None:
    for raw, at in (('{"a": "é"}'.encode("latin-1"), 7), ('{"a": 1}'.encode("utf-16"), 0)):
        with pytest.raises(APIError) as exc:
            decode_json(raw)
        assert exc.value.status == 400 and exc.value.code == "invalid_json"
        assert f"not valid UTF-8 (at byte offset {at})" in exc.value.message
    with pytest.raises(APIError) as exc:
        decode_json(b'{"a": }')
    assert "not valid JSON" in exc.value.message

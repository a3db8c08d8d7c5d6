"""Messages API requests as the chat requests the gateway routes: worked examples of each
block and field, and the refusals that name what they refuse."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from gateway.errors import APIError
from gateway.messages import CountTokensRequest, client_param, parse_request, to_chat

WEATHER = {
    "name": "get_weather",
    "description": "Current weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def chat(**body: Any) -> dict[str, Any]:
    return to_chat(parse_request({"model": "xrouter", "max_tokens": 100, **body}))


def test_a_conversation_with_tool_use_images_and_thinking() -> None:
    got = chat(
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
        messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this picture, and the weather there? "},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"}},
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "...", "signature": "s"},
                {"type": "text", "text": "Paris. Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True, "content": [
                    {"type": "text", "text": "no city"},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                ]},
                {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}},
            ]},
        ],
        tools=[WEATHER, {"type": "web_search_20250305", "name": "web_search"}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["\n\nHuman:"],
        temperature=0.2,
        top_k=5,
        metadata={"user_id": "u-1"},
        stream=True,
    )  # fmt: skip
    assert got == {
        "model": "xrouter",
        "max_tokens": 100,
        "stream": True,
        "messages": [
            {"role": "system", "content": "Be brief.\n\nUse tools."},
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this picture, and the weather there? "},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}},
            ]},
            {"role": "assistant", "content": "Paris. Checking.", "tool_calls": [
                {"id": "toolu_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                {"id": "toolu_2", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{}"}},
            ]},
            # Tool results first, as chat wants them right after the calls; the result's
            # image goes to the user message that follows.
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "[tool error] no city"},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                {"type": "text", "text": "Thanks"},
            ]},
        ],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "parameters": WEATHER["input_schema"],
            "description": "Current weather"}}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stop": ["\n\nHuman:"],
        "temperature": 0.2,
        "user": "u-1",
    }  # fmt: skip
    # The arguments are the JSON of the tool_use input.
    call = got["messages"][2]["tool_calls"][0]
    assert orjson.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_plain_text_and_tool_choices() -> None:
    assert chat(messages=[{"role": "user", "content": "hi"}])["messages"] == [
        {"role": "user", "content": "hi"}
    ]
    one = [{"role": "user", "content": "x"}]
    assert (
        chat(messages=one, tools=[WEATHER], tool_choice={"type": "auto"})["tool_choice"] == "auto"
    )
    assert (
        chat(messages=one, tools=[WEATHER], tool_choice={"type": "none"})["tool_choice"] == "none"
    )
    named = chat(messages=one, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    # Only server tools: nothing to call, so auto asks for nothing and offers no tools.
    server_only = chat(messages=one, tools=[{"type": "bash_20250124", "name": "bash"}],
                       tool_choice={"type": "auto"})  # fmt: skip
    assert "tools" not in server_only and "tool_choice" not in server_only
    assert parse_request({"model": "m", "max_tokens": 1, "messages": one,
                          "tools": [{"type": "bash_20250124", "name": "bash"}]}).ignored_tools == ["bash"]  # fmt: skip


def test_structured_output_is_a_strict_json_schema_response_format() -> None:
    """``output_config.format`` (and the older beta's ``output_format``): Anthropic
    constrains the answer to the schema, as chat's strict mode does. The rest of
    ``output_config`` (``effort``) has no chat counterpart and is not forwarded."""
    one = [{"role": "user", "content": "x"}]
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    expected = {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }
    fmt = {"type": "json_schema", "schema": schema}
    config = chat(messages=one, output_config={"effort": "high", "format": fmt})
    assert config["response_format"] == expected and "effort" not in config
    assert chat(messages=one, output_format=fmt)["response_format"] == expected
    # Effort alone (as Claude Code sends it), or no format: no response_format.
    for output_config in ({"effort": "high"}, {"format": None}):
        assert "response_format" not in chat(messages=one, output_config=output_config)


@pytest.mark.parametrize(
    ("schema", "strict"),
    [
        ({"type": "object", "properties": {"a": {}}, "required": ["a"],
          "additionalProperties": False}, True),
        # A field with a default (the SDK leaves it out of required), at any depth.
        ({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"],
          "additionalProperties": False}, False),
        ({"type": "object", "properties": {"a": {"type": "array", "items": {
            "type": "object", "properties": {"x": {}}, "required": []}}},
          "required": ["a"], "additionalProperties": False}, False),
        # Open to other properties.
        ({"type": "object", "properties": {"a": {}}, "required": ["a"]}, False),
        # Data that looks like an object schema is not one.
        ({"type": "object", "properties": {"a": {"default": {"properties": {"z": 1}}}},
          "required": ["a"], "additionalProperties": False}, True),
        ({"type": "string"}, True),
    ],
)  # fmt: skip
def test_a_schema_openai_strict_mode_refuses_goes_as_a_hint(
    schema: dict[str, Any], strict: bool
) -> None:
    # OpenAI's strict mode refuses (a 400, a 502 to the client) an object that does not
    # require every property or allows others; Anthropic's structured outputs take it.
    fmt = {"type": "json_schema", "schema": schema}
    got = chat(messages=[{"role": "user", "content": "x"}], output_config={"format": fmt})
    assert got["response_format"]["json_schema"] == {
        "name": "output",
        "schema": schema,
        "strict": strict,
    }


def test_an_assistant_turn_of_thinking_only_is_left_out() -> None:
    """Its thinking is dropped, and an assistant message with neither content nor tool calls
    is one chat providers refuse (a 502 to the client): the turn goes with its blocks."""
    thinking = {"type": "thinking", "thinking": "...", "signature": "s"}
    redacted = {"type": "redacted_thinking", "data": "abc"}
    got = chat(messages=[
        {"role": "user", "content": "Think about it."},
        {"role": "assistant", "content": [thinking, redacted]},
        {"role": "user", "content": "Now answer."},
        {"role": "assistant", "content": [thinking]},  # a prefill of nothing
    ])  # fmt: skip
    assert got["messages"] == [
        {"role": "user", "content": "Think about it."},
        {"role": "user", "content": "Now answer."},
    ]
    # With nothing else to answer, it is the request's mistake, not an empty chat request.
    with pytest.raises(APIError) as err:
        chat(messages=[{"role": "assistant", "content": [thinking]}])
    assert err.value.status == 400 and err.value.param == "messages"


def test_count_tokens_requests_need_no_max_tokens() -> None:
    req = parse_request({"model": "m", "messages": [{"role": "user", "content": "x"}]},
                        CountTokensRequest)  # fmt: skip
    assert to_chat(req)["messages"] == [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens", None),
        ({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens", None),
        ({"max_tokens": 5, "messages": "hello"}, "messages", None),
        ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": 5}]}, "messages[0].content", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
         "messages[0].content[0].type", "unsupported_parameter"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]},
         "messages[0].content[0].source", "unsupported_parameter"),
        ({"max_tokens": 5, "messages": [{"role": "assistant", "content": [
            {"type": "tool_use", "name": "f"}]}]}, "messages[0].content[0]", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "content": "x"}]}]}, "messages[0].content[0].tool_use_id", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "system": [{"type": "image"}]}, "system[0]", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "tools": [{"name": "f"}]}, "tools[0].input_schema", None),
        # A tool's input is an object, as Anthropic requires.
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "tools": [{"name": "f", "input_schema": {"type": "string"}}]},
         "tools[0].input_schema.type", None),
        # Empty text, as a string or a block: refused, as Anthropic refuses it.
        ({"max_tokens": 5, "messages": [{"role": "user", "content": ""}]},
         "messages[0].content", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "x"}, {"type": "text", "text": ""}]}]},
         "messages[0].content[1]", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "tool_choice": {"type": "any"}}, "tool_choice", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
          "tool_choice": {"type": "sometimes"}}, "tool_choice.type", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "system": "only a system prompt"} | {"messages": [{"role": "user", "content": []}]},
         "messages[0].content", None),
        # An empty user turn mid-conversation: refused, as Anthropic does, not left out.
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"},
          {"role": "assistant", "content": "y"}, {"role": "user", "content": []}]},
         "messages[2].content", None),
        # Known fields are checked strictly, as Anthropic checks them.
        ({"max_tokens": "10", "messages": [{"role": "user", "content": "x"}]}, "max_tokens", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stream": "true"},
         "stream", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": "0.5"},
         "temperature", None),
        # Neither a string nor a list of blocks: the field, not pydantic's union member.
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "system": 5},
         "system", None),
        # Dropped or sent on as they came, before: a user id that is not a string (the
        # request's spend lost its user), a tool's input that is not an object (arguments
        # that are a JSON string), a description or a parallel-use flag of another type.
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "metadata": {"user_id": 5}}, "metadata.user_id", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant",
          "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}]},
         "messages[1].content[0].input", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [
          {"name": "f", "description": 3, "input_schema": {"type": "object"}}]},
         "tools[0].description", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
          "tool_choice": {"type": "auto", "disable_parallel_tool_use": "x"}},
         "tool_choice.disable_parallel_tool_use", None),
        # Four at most: the limit of the chat APIs the request is routed to.
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "stop_sequences": list("abcde")}, "stop_sequences", None),
        # A structured output the translation cannot ask a chat model for (it was dropped).
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "output_config": {"format": {"type": "regex"}}}, "output_config.format.type",
         "unsupported_parameter"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "output_format": {"type": "json_object"}}, "output_format.type",
         "unsupported_parameter"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "output_config": {"format": {"type": "json_schema", "schema": "x"}}},
         "output_config.format.schema", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "output_config": {"format": "json"}}, "output_config.format", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "output_config": "json"}, "output_config", None),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
          "output_format": {"type": "json_schema", "schema": {"type": "object"}}},
         "output_format", None),
    ],
)  # fmt: skip
def test_refusals_name_the_field(body: dict[str, Any], param: str, code: str | None) -> None:
    with pytest.raises(APIError) as err:
        to_chat(parse_request({"model": "m", **body}))
    assert err.value.status == 400 and err.value.param == param
    assert err.value.message.startswith(f"{param}: ")
    assert err.value.code == code


def test_a_system_message_mid_conversation_stays_where_it_is() -> None:
    """Anthropic's mid-conversation system messages (a beta Claude Code uses)."""
    got = chat(
        system="Top.",
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "Agents available: none."},
            {"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
            {"role": "user", "content": "go"},
        ],
    )
    assert [(m["role"], m["content"]) for m in got["messages"]] == [
        ("system", "Top."),
        ("user", "hi"),
        ("system", "Agents available: none."),
        ("system", "Be terse."),
        ("user", "go"),
    ]
    with pytest.raises(APIError) as err:
        chat(messages=[{"role": "system", "content": [{"type": "image"}]}])
    assert err.value.param == "messages[0].content[0]"


def field_at(body: Any, param: str) -> Any:
    """What the client sent at ``param`` (``messages[2].content[0]``): a KeyError or an
    IndexError if it sent nothing there."""
    for name, index in re.findall(r"\.?([^.\[]+)|\[(\d+)\]", param):
        body = body[int(index)] if index else body[name]
    return body


def test_an_error_about_a_chat_message_names_the_block_it_came_from() -> None:
    """The chat messages are not the request's one for one: the system prompt comes first,
    tool results become tool messages of their own (their images a part of the user message
    after them), a turn of thinking only is left out. An error the chat service finds in a
    chat message names the turn or block (and its field) the client sent, never a chat
    index."""
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/map.png"}}
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "s"}
    body: dict[str, Any] = {
        "model": "xrouter",
        "max_tokens": 100,
        "system": "Be brief.",
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather here?"}, image]},
            {"role": "assistant", "content": [
                thinking,
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}},
                {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "sunny"}, image]},
                {"type": "tool_result", "tool_use_id": "t2", "content": "rain"},
                {"type": "text", "text": "Thanks"}]},
            {"role": "assistant", "content": [thinking]},
            {"role": "user", "content": "And tomorrow?"},
        ],
    }  # fmt: skip
    req = parse_request(body)
    roles = [m["role"] for m in to_chat(req)["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user", "user"]
    expected = {
        "messages[0].content": "system",
        "messages[1].content": "messages[0].content",
        "messages[1].content[1].image_url.url": "messages[0].content[1]",
        "messages[2]": "messages[1]",
        "messages[2].content": "messages[1].content",
        "messages[2].tool_calls[0]": "messages[1].content[2]",
        "messages[2].tool_calls[1].function.name": "messages[1].content[3]",
        "messages[3].content": "messages[2].content[0].content",
        "messages[3].tool_call_id": "messages[2].content[0].tool_use_id",
        "messages[4]": "messages[2].content[1]",
        "messages[5].content": "messages[2].content",
        "messages[5].content[0]": "messages[2].content[0].content[1]",
        "messages[5].content[1]": "messages[2].content[2]",
        "messages[6].content": "messages[4].content",
        # No such chat message, or none named: the messages as a whole.
        "messages[7].content": "messages",
        "messages": "messages",
    }
    for param, client in expected.items():
        assert client_param(req, param) == client, param
        field_at(body, client)  # the client sent it

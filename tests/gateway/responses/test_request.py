"""A Responses API request as the chat request it is routed as: worked examples of each
item, tool and format the translation takes, and of what it refuses."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway.errors import APIError
from gateway.responses.request import client_param, parse_request, to_chat


def chat(body: dict[str, Any]) -> dict[str, Any]:
    return to_chat(parse_request({"model": "xrouter", **body}))


def test_a_string_input_with_instructions() -> None:
    out = chat({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 50})
    assert out == {
        "model": "xrouter",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        "stream": False,
        "max_completion_tokens": 50,
    }


def test_a_conversation_of_items() -> None:
    out = chat(
        {
            "input": [
                {"role": "developer", "content": "Use tools."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is in this image?"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AA==",
                         "detail": "low"},
                    ],
                },
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
                {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "zoom", "arguments": ""},
                {"type": "function_call_output", "call_id": "c1", "output": "a cat"},
                {"type": "function_call_output", "call_id": "c2",
                 "output": [{"type": "input_text", "text": "a tabby"}]},
            ]
        }
    )  # fmt: skip
    assert out["messages"] == [
        {"role": "developer", "content": "Use tools."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA==",
                                                    "detail": "low"}},
            ],
        },
        # The calls that follow the assistant's text join its message, as chat writes it.
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "zoom", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a cat"},
        {"role": "tool", "tool_call_id": "c2", "content": "a tabby"},
    ]  # fmt: skip


def test_calls_without_a_preceding_text_make_their_own_assistant_message() -> None:
    out = chat(
        {
            "input": [
                {"role": "user", "content": "Weather?"},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ]
        }
    )
    assert out["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
        ],
    }


def test_a_turn_s_text_after_its_calls_joins_their_message() -> None:
    """As a model that streams its call before its text gives them back (and the gateway's
    cached streams did): one assistant message, which the tool messages follow."""
    body: dict[str, Any] = {
        "model": "xrouter",
        "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": "rain"},
            {"role": "assistant", "content": "Sunny, then rain."},
        ],
    }  # fmt: skip
    req = parse_request(body)
    call = {"type": "function", "function": {"name": "w", "arguments": "{}"}}
    assert to_chat(req)["messages"] == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.",
         "tool_calls": [{"id": "c1", **call}, {"id": "c2", **call}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        # A text after the outputs is the next turn's.
        {"role": "assistant", "content": "Sunny, then rain."},
    ]  # fmt: skip
    # An error about the merged message names the item each field came from.
    assert client_param(req, "messages[1].content") == "input[2].content"
    assert client_param(req, "messages[1].tool_calls[1]") == "input[3]"
    assert client_param(req, "messages[1]") == "input[1]"


def test_tools_formats_and_settings() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    out = chat(
        {
            "input": "x",
            "tools": [{"type": "function", "name": "f", "description": "d", "parameters": schema,
                       "strict": True}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "n", "schema": schema,
                                "strict": True}},
            "temperature": 0.2,
            "top_p": 0.9,
            "parallel_tool_calls": False,
            "stream": True,
            "user": "u1",
            "safety_identifier": "sid-1",  # the chat API's too: the end user's other name
            "xrouter": {"cost_weight": 2},
            # Responses-only fields that a chat provider would refuse: not forwarded.
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "reasoning": {"effort": "low"},
            "metadata": {"k": "v"},
            "truncation": "auto",
        }
    )  # fmt: skip
    assert out == {
        "model": "xrouter",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                    "parameters": schema, "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "n", "schema": schema, "strict": True}},
        "temperature": 0.2,
        "top_p": 0.9,
        "parallel_tool_calls": False,
        "user": "u1",
        "safety_identifier": "sid-1",
        "xrouter": {"cost_weight": 2},
    }  # fmt: skip
    assert chat({"input": "x", "text": {"format": {"type": "json_object"}}})["response_format"] == {
        "type": "json_object"
    }
    assert "response_format" not in chat({"input": "x", "text": {"format": {"type": "text"}}})
    fn = {"type": "function", "name": "f"}
    assert chat({"input": "x", "tools": [fn], "tool_choice": "required"})["tool_choice"] == (
        "required"
    )


def test_namespaced_and_hosted_tools() -> None:
    fn = {"type": "function", "name": "close_agent", "parameters": {"type": "object"}}
    body = {
        "input": [
            {"role": "user", "content": "x"},
            {"type": "function_call", "call_id": "c1", "namespace": "agents",
             "name": "close_agent", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "closed"},
        ],
        "tools": [
            {"type": "function", "name": "exec", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "agents", "description": "sub-agents",
             "tools": [fn, {"type": "custom", "name": "patch"}]},
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": {"type": "function", "namespace": "agents", "name": "close_agent"},
    }  # fmt: skip
    req = parse_request({"model": "xrouter", **body})
    out = to_chat(req)
    # A namespace's functions are chat functions named <namespace>__<name>; tools no chat
    # model can call (OpenAI-hosted, or not functions) are left out and remembered.
    assert [t["function"]["name"] for t in out["tools"]] == ["exec", "agents__close_agent"]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "agents__close_agent"}}
    assert out["messages"][1]["tool_calls"][0]["function"]["name"] == "agents__close_agent"
    tools = req.tool_map
    assert tools.ignored == ["custom", "web_search"]
    assert tools.call_name("agents__close_agent") == ("agents", "close_agent")
    assert tools.call_name("exec") == (None, "exec")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "conversation": {}}, "conversation"),
        ({"input": "x", "prompt": {"id": "pmpt_1", "variables": {"city": "Paris"}}}, "prompt"),
        ({"input": [{"type": "item_reference", "id": "m"}]}, "input[0].type"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
         "input[0].call_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
         "input[0].content[0]"),
        ({"input": [{"role": "user", "content": 3}]}, "input[0].content"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "x", "tools": [{"type": "namespace", "tools": []}]}, "tools[0].name"),
        ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}},
         "text.format.schema"),
        ({"input": [], "instructions": "only a system prompt"}, "input"),
        # Offered to chat models as <namespace>__<name>: 72 characters, too long for chat.
        ({"input": "x", "tools": [{"type": "namespace", "name": "n" * 40, "tools": [
            {"type": "function", "name": "f" * 30}]}]}, "tools[0].tools[0].name"),
        # Two functions offered to chat models under one name: a call to it is ambiguous.
        ({"input": "x", "tools": [{"type": "function", "name": "ns__f"},
            {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f"}]}]},
         "tools[1].tools[0].name"),
        ({"input": "x", "tools": [
            {"type": "namespace", "name": "a__b", "tools": [{"type": "function", "name": "c"}]},
            {"type": "namespace", "name": "a", "tools": [{"type": "function", "name": "b__c"}]}]},
         "tools[1].tools[0].name"),
        ({"input": "x", "temperature": 3}, "temperature"),
        # Known fields are checked strictly, as OpenAI checks them.
        ({"input": "x", "stream": "yes"}, "stream"),
        ({"input": "x", "max_output_tokens": "10"}, "max_output_tokens"),
        # Neither member of the union: named as the field, not as pydantic's member.
        ({"input": "x", "tool_choice": 5}, "tool_choice"),
    ],
)  # fmt: skip
def test_what_cannot_be_translated_is_a_400_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(APIError) as exc:
        chat(body)
    assert exc.value.status == 400 and exc.value.param == param
    assert exc.value.message.startswith(f"{param}: ")


def field_at(body: Any, param: str) -> Any:
    """What the client sent at ``param`` (``input[2].content[0]``): a KeyError or an
    IndexError if it sent nothing there."""
    for name, index in re.findall(r"\.?([^.\[]+)|\[(\d+)\]", param):
        body = body[int(index)] if index else body[name]
    return body


def test_an_error_about_a_chat_message_names_the_input_item_it_came_from() -> None:
    """The chat messages are not the input items one for one: instructions come first, a
    reasoning item is dropped, a turn's calls join its text's message, a function output's
    images move to a user message after the outputs. An error the chat service finds in a
    chat message names the item (and its field) the client sent, never a chat index."""
    body: dict[str, Any] = {
        "model": "xrouter",
        "instructions": "Be brief.",
        "tools": [{"type": "function", "name": "get_weather", "parameters": {}}],
        "input": [
            {"role": "user", "content": [
                {"type": "input_text", "text": "Weather here?"},
                {"type": "input_image", "image_url": "https://example.com/street.png"}]},
            {"type": "reasoning", "summary": []},
            {"role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_text", "text": "sunny"},
                {"type": "input_image", "image_url": "https://example.com/map.png"}]},
            {"type": "function_call_output", "call_id": "c2", "output": "rain"},
            {"role": "user", "content": "Thanks"},
        ],
    }  # fmt: skip
    req = parse_request(body)
    roles = [m["role"] for m in to_chat(req)["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user", "user"]
    expected = {
        "messages[0].content": "instructions",
        "messages[1].content": "input[0].content",
        "messages[1].content[1].image_url.url": "input[0].content[1]",
        "messages[1].role": "input[0].role",
        "messages[2]": "input[2]",
        "messages[2].content": "input[2].content",
        "messages[2].tool_calls[0]": "input[3]",
        "messages[2].tool_calls[1].function.name": "input[4]",
        "messages[3].content": "input[5].output",
        "messages[3].tool_call_id": "input[5].call_id",
        "messages[4].content": "input[6].output",
        "messages[5].content": "input[5].output[1]",
        "messages[5].content[0]": "input[5].output[1]",
        # A part's type is the client's part's type; its other fields are named otherwise.
        "messages[1].content[1].type": "input[0].content[1].type",
        "messages[6].content": "input[7].content",
        # No such chat message, or none named: the input as a whole.
        "messages[7].content": "input",
        "messages": "input",
    }
    for param, client in expected.items():
        assert client_param(req, param) == client, param
        field_at(body, client)  # the client sent it
    # A string input is the user message's content.
    assert client_param(parse_request({"model": "m", "input": "hi"}), "messages[0].content") == (
        "input"
    )

"""The pre-call prompt-token estimate: high for every script and for what is not text."""

from __future__ import annotations

from typing import Any

import pytest

from router.estimate import (
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    estimate_prompt_tokens,
    message_tokens,
    requested_max_tokens,
)


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def test_text_is_a_token_per_three_bytes_of_utf8() -> None:
    # 30 ASCII characters: 10 tokens; 11 CJK characters (3 bytes each): 11, where a third
    # of the characters would have given 4 for text that tokenizes to about 11.
    assert message_tokens(user("a" * 30)) == MESSAGE_OVERHEAD_TOKENS + 10
    assert message_tokens(user("東京の天気は晴れです。")) == MESSAGE_OVERHEAD_TOKENS + 11
    assert message_tokens(user("")) == MESSAGE_OVERHEAD_TOKENS


def test_a_conversation_adds_its_messages_the_extra_system_prompt_and_the_tools() -> None:
    messages = [{"role": "system", "content": "x" * 9}, user("y" * 9)]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    base = 8 + 2 * (MESSAGE_OVERHEAD_TOKENS + 3)
    assert estimate_prompt_tokens(messages) == base
    assert estimate_prompt_tokens(messages, "z" * 12) == base + MESSAGE_OVERHEAD_TOKENS + 4
    tools_json = '[{"type":"function","function":{"name":"f","parameters":{}}}]'
    assert estimate_prompt_tokens(messages, None, tools) == base + -(-len(tools_json) // 3)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 50}},
    ],
)
def test_an_image_counts_its_fixed_high_price_whatever_its_url(part: dict[str, Any]) -> None:
    text = {"type": "text", "text": "abc"}
    assert message_tokens(user([text, part])) == MESSAGE_OVERHEAD_TOKENS + 1 + IMAGE_TOKENS


def test_audio_counts_by_size() -> None:
    small = {"type": "input_audio", "input_audio": {"data": "A" * 10, "format": "wav"}}
    big = {"type": "input_audio", "input_audio": {"data": "A" * 100_000, "format": "wav"}}
    assert message_tokens(user([big])) - message_tokens(user([small])) == 100


def test_tool_calls_and_their_arguments_count() -> None:
    args = '{"city": "' + "x" * 300 + '"}'
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": args}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert message_tokens(assistant) >= 2 * MESSAGE_OVERHEAD_TOKENS + (len(args) + 7) // 3
    result = {"role": "tool", "tool_call_id": "c1", "content": "y" * 300}
    assert message_tokens(result) == MESSAGE_OVERHEAD_TOKENS + 100


def test_odd_input_is_counted_not_raised() -> None:
    # Parts this gateway does not model count as their JSON; a lone surrogate still counts.
    file_part = {"type": "file", "file": {"file_data": "B" * 90}}
    assert message_tokens(user([file_part])) > 30
    assert message_tokens(user("\ud800")) == MESSAGE_OVERHEAD_TOKENS + 1
    assert estimate_prompt_tokens([user(None), "not a message"]) == 8 + MESSAGE_OVERHEAD_TOKENS  # type: ignore[list-item]


def test_the_requested_maximum_is_the_larger_limit_per_choice() -> None:
    assert requested_max_tokens({}) is None
    assert requested_max_tokens({"max_tokens": None, "n": 3}) is None
    assert requested_max_tokens({"max_tokens": 100}) == 100
    assert requested_max_tokens({"max_completion_tokens": 70, "max_tokens": 20, "n": 2}) == 70

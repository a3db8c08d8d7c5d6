"""Usage a response reports, or an estimate when it reports nothing it can be charged by."""

from __future__ import annotations

from typing import Any

import pytest

from pricing import TokenUsage, estimate_tokens, tokens_for_chars
from router.providers.usage import reported_or_estimated

REQUEST = {"messages": [{"role": "user", "content": "hello there"}]}


def response(usage: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"choices": [{"message": {"role": "assistant", "content": "Hi you"}}]}
    if usage is not None:
        body["usage"] = usage
    return body


def test_reported_counts_are_taken() -> None:
    usage, reported = reported_or_estimated(
        REQUEST, response({"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9})
    )
    assert (usage, reported) == (TokenUsage(7, 2), True)


@pytest.mark.parametrize(
    "usage",
    [
        None,
        {},
        {"total_tokens": 9},  # a total alone: nothing to charge input and output by
        {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        {"prompt_tokens": "many", "completion_tokens": -3},
    ],
)
def test_usage_with_no_count_to_charge_by_is_estimated(usage: Any) -> None:
    got, reported = reported_or_estimated(REQUEST, response(usage))
    assert not reported
    assert got.prompt_tokens >= estimate_tokens("hello there") > 0
    assert got.completion_tokens == estimate_tokens("Hi you") > 0


@pytest.mark.parametrize(
    ("tool_calls", "text"),
    [
        ([{"function": {"name": "f", "arguments": '{"a": 1}'}}], '{"a": 1}'),
        ([{"function": {"name": "f", "arguments": {"a": 1}}}], '{"a": 1}'),  # an object
        ([{"function": "call_x"}], "call_x"),  # a function that is a string
        (["call_x"], "call_x"),  # a call that is a string
        ({"function": {"arguments": "{}"}}, "{}"),  # one call, not a list of them
        ([5], "5"),
        ([{"id": "c"}, None, {"function": None}], ""),  # nothing that holds arguments
    ],
)
def test_a_malformed_tool_call_is_estimated_by_its_text_not_raised_on(
    tool_calls: Any, text: str
) -> None:
    # A router model's malformed call is refused by the loop as a tool error; its tokens
    # are still charged. Without usage, the estimate raised on these (a 500).
    # Four characters of text: a character more or less moves the estimate.
    message = {"role": "assistant", "content": "okay", "tool_calls": tool_calls}
    got, reported = reported_or_estimated(REQUEST, {"choices": [{"message": message}]})
    assert not reported
    assert got.completion_tokens == tokens_for_chars(4 + len(text))

"""Usage a response reports, or an estimate when it reports nothing it can be charged by."""

from __future__ import annotations

from typing import Any

import pytest

from pricing import TokenUsage, estimate_tokens
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

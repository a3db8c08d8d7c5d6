"""What a stream's statistics keep from its chunks: the first choice's text for the answer,
and everything generated (every choice, tool-call arguments) for a usage estimate."""

from __future__ import annotations

from pricing import TokenUsage
from router.providers.base import StreamStats


def chunk(*choices: dict, usage: dict | None = None) -> dict:
    return {"object": "chat.completion.chunk", "choices": list(choices), "usage": usage}


def test_every_choice_and_tool_call_counts_as_generated() -> None:
    st = StreamStats()
    st.observe(chunk({"index": 0, "delta": {"role": "assistant", "content": ""}}))
    st.observe(chunk({"index": 0, "delta": {"content": "Hello"}}))
    st.observe(chunk({"index": 1, "delta": {"content": "Bonjour!"}}))
    st.observe(
        chunk(
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {"index": 0, "function": {"name": "f", "arguments": '{"q": 1}'}},
                        {"index": 1, "function": {"arguments": ""}},
                    ]
                },
            }
        )
    )
    st.observe(chunk({"index": 1, "delta": {}, "finish_reason": "length"}))
    assert st.text == "Hello"  # the answer relayed as the first choice
    assert st.finish_reason is None  # only the first choice's finish counts
    assert (st.generated_parts, st.generated_chars) == (3, 5 + 8 + 8)
    assert st.usage is None and st.chunks == 5


def test_usage_chunk_is_the_providers_count() -> None:
    st = StreamStats()
    st.observe(chunk({"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}))
    st.observe(chunk(usage={"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}))
    assert st.usage == TokenUsage(7, 2) and st.finish_reason == "stop"


def test_a_usage_chunk_with_only_a_total_reports_nothing() -> None:
    # No prompt or completion count to charge by: the stream is estimated as one without
    # usage is (``usage`` stays None), not booked as free.
    st = StreamStats()
    st.observe(chunk({"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}))
    st.observe(chunk(usage={"total_tokens": 9}))
    assert st.usage is None

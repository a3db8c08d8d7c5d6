"""A stream whose deltas carry ``content`` as a list of parts (Mistral's reasoning models:
``thinking`` and ``text`` parts; some OpenAI-compatible servers: ``text`` parts) is
relayed in OpenAI's shape — the text a string, the thinking ``reasoning_content`` — on
both transports, against a scripted upstream on loopback; content that is no string, null
or list of parts is still a bad response."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from router.providers.base import StreamStats
from router.providers.errors import ProviderError
from tests.router.providers.test_failures import BOTH, Transport, client, model
from tests.support.fault_upstream import FaultUpstream, Reply, _answer, chunk, event, fault_upstream

BODY = {"messages": [{"role": "user", "content": "hi"}]}
THINKING = {"type": "thinking", "thinking": [{"type": "text", "text": "Paris, June: "}]}


@pytest.fixture
async def up() -> AsyncIterator[FaultUpstream]:
    async with fault_upstream() as u:
        yield u


def delta_event(delta: dict[str, Any]) -> bytes:
    c = chunk()
    c["choices"][0]["delta"] = delta
    return event(c)


def stream_of(*deltas: dict[str, Any]) -> Reply:
    """A stream of ``deltas`` without a usage chunk (its usage is estimated), then its end."""
    return Reply(
        events=[*map(delta_event, deltas), event(chunk(None, "stop")), b"data: [DONE]\n\n"]
    )


async def relayed(up: FaultUpstream, transport: Transport) -> tuple[list[Any], StreamStats]:
    c, _ = client(model(up.base_url, transport=transport))
    try:
        sc = await c.open_stream("m", dict(BODY))
        deltas = [ch["choices"][0]["delta"] async for ch in sc.chunks if ch.get("choices")]
    finally:
        await c.aclose()
    return deltas, sc.stats


@BOTH
async def test_a_first_delta_of_parts_is_its_text_and_its_reasoning(
    up: FaultUpstream, transport: Transport
) -> None:
    """The natively relayed chunk failed the call (a 502); LiteLLM relayed the list, which
    broke the stream's text (a TypeError joining it)."""
    parts = [THINKING, {"type": "text", "text": "Sunny, "}, {"type": "text", "text": "21C."}]
    up.script(stream_of({"role": "assistant", "content": parts}))
    deltas, stats = await relayed(up, transport)
    first = deltas[0]
    assert (first["content"], first["reasoning_content"]) == ("Sunny, 21C.", "Paris, June: ")
    assert stats.text == "Sunny, 21C." and stats.error_kind is None
    # The usage estimate counts what was generated, the reasoning too (it is billed).
    assert stats.usage is None and stats.generated_chars == len("Sunny, 21C.Paris, June: ")


async def test_parts_mid_stream_are_text_between_strings(up: FaultUpstream) -> None:
    """(Native only: LiteLLM's stream reader drops a delta of parts without a ``role``.)"""
    up.script(
        stream_of(
            {"role": "assistant", "content": ""},
            {"content": [THINKING]},
            {"content": [{"type": "text", "text": "Sunny"}]},
            {"content": ", "},
            {"content": [{"type": "text", "text": "21C."}, {"type": "image_url"}]},
        )
    )
    deltas, stats = await relayed(up, "native")
    assert [d.get("content") for d in deltas] == ["", None, "Sunny", ", ", "21C.", None]
    assert [d.get("reasoning_content") for d in deltas] == [None, "Paris, June: "] + [None] * 4
    assert stats.text == "Sunny, 21C."
    assert stats.generated_chars == len("Paris, June: Sunny, 21C.")


@pytest.mark.parametrize("content", [7, {"text": "hi"}, ["hi"], [{"type": "text"}, "x"]])
async def test_content_that_is_no_string_or_list_of_parts_is_a_bad_response(
    up: FaultUpstream, content: Any
) -> None:
    up.script(stream_of({"role": "assistant", "content": ""}, {"content": content}))
    with pytest.raises(ProviderError) as exc:
        await relayed(up, "native")
    assert exc.value.kind == "bad_response"
    assert "content is not a string" in exc.value.message


async def test_an_answer_of_parts_is_its_text_and_its_reasoning(up: FaultUpstream) -> None:
    """A non-streamed answer's parts were relayed as the list (the chat SDK's ``content``
    is a string); they are what the same answer streamed is. (Native only: LiteLLM's own
    response reader refuses such an answer, a bad response.)"""
    parts = [THINKING, {"type": "text", "text": "Sunny, "}, {"type": "text", "text": "21C."}]
    answer = _answer("")
    answer["choices"][0]["message"]["content"] = parts
    up.script(Reply(body=answer))
    c, _ = client(model(up.base_url, transport="native"))
    try:
        r = await c.complete("m", dict(BODY))
    finally:
        await c.aclose()
    message = r.body["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("Sunny, 21C.", "Paris, June: ")

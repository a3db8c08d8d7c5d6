"""Chat answers as Messages API answers: the message object, the stream of events on chunk
sequences a real upstream sends (text, then parallel tool calls with arguments in pieces),
split at any byte, streams that fail or stop short, and errors."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
import pytest

from gateway.messages.output import EventStream, error_body, from_chat_completion, tool_input
from gateway.messages.request import parse_request
from tests.support.chat_sse import call_delta, delta, sse

RID = "0123456789abcdef"
FINAL = {
    "model": "m1",
    "choices": [],
    "usage": {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 4},
        "cost": 1e-05,
    },
    "xrouter": {"request_id": RID, "policy": "compact"},
}


def req(**extra: Any) -> Any:
    body = {"model": "xrouter", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    return parse_request({**body, **extra})


async def events(body: bytes, pieces: Sequence[int] = (), **extra: Any) -> list[dict[str, Any]]:
    async def chunks() -> AsyncIterator[bytes]:
        for a, b in itertools.pairwise([0, *pieces, len(body)]):
            yield body[a:b]

    raw = b"".join([b async for b in EventStream(req(**extra), RID, "m1").translate(chunks())])
    out = []
    for block in raw.split(b"\n\n"):
        if block:
            kind, data = block.split(b"\n")
            payload = orjson.loads(data.removeprefix(b"data: "))
            assert kind == b"event: " + payload["type"].encode()
            out.append(payload)
    return out


def accumulate(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """The message as Anthropic's SDKs build it from the events, checking that blocks are
    sequential: opened in order, one at a time, every delta for the open one."""
    message = dict(evs[0]["message"])
    message["content"] = []
    partial: dict[int, str] = {}
    open_block: int | None = None
    for e in evs[1:]:
        if e["type"] == "content_block_start":
            assert open_block is None and e["index"] == len(message["content"])
            open_block = e["index"]
            message["content"].append(dict(e["content_block"]))
        elif e["type"] == "content_block_stop":
            assert e["index"] == open_block
            open_block = None
        else:
            assert e["type"] != "content_block_delta" or e["index"] == open_block
        if e["type"] == "content_block_delta":
            d = e["delta"]
            if d["type"] == "text_delta":
                message["content"][e["index"]]["text"] += d["text"]
            else:
                partial[e["index"]] = partial.get(e["index"], "") + d["partial_json"]
        if e["type"] == "content_block_stop":
            if e["index"] in partial:
                message["content"][e["index"]]["input"] = orjson.loads(partial[e["index"]])
        if e["type"] == "message_delta":
            assert open_block is None
            message.update(e["delta"], usage=e["usage"], xrouter=e.get("xrouter"))
    return message


TEXT_THEN_CALLS = sse(
    delta({"role": "assistant", "content": ""}),
    delta({"content": "Checking "}),
    delta({"content": "both."}),
    call_delta(0, id="call_a", name="get_weather"),
    call_delta(0, args='{"ci'),
    call_delta(1, id="call_b", name="get_time"),
    call_delta(0, args='ty": "Paris"}'),  # OpenAI may interleave parallel calls' arguments
    call_delta(1, args='{"tz": "CET"}'),
    delta({}, "tool_calls"),
    FINAL,
)


@pytest.mark.parametrize("every", [0, 13, 1])
async def test_text_then_parallel_calls_in_pieces(every: int) -> None:
    pieces = range(every, len(TEXT_THEN_CALLS), every) if every else ()
    evs = await events(TEXT_THEN_CALLS, pieces)
    kinds = [e["type"] for e in evs]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == 3 and kinds.count("content_block_stop") == 3
    start = evs[0]["message"]
    assert start["id"] == f"msg_{RID}" and start["model"] == "m1" and start["stop_reason"] is None
    message = accumulate(evs)
    assert message["content"] == [
        {"type": "text", "text": "Checking both."},
        {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_b", "name": "get_time", "input": {"tz": "CET"}},
    ]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {
        "input_tokens": 6,  # Anthropic counts cache reads apart
        "output_tokens": 5,
        "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cost": 1e-05,
    }
    assert message["xrouter"] == FINAL["xrouter"]


async def test_the_first_tool_call_streams_live_and_late_text_comes_last() -> None:
    body = sse(
        call_delta(0, id="call_a", name="write_file"),
        call_delta(0, args='{"path": "a.txt", '),
        call_delta(0, args='"text": "hello'),
        delta({"content": "Done."}),  # text after a call started: held for the end
        call_delta(0, args=' world"}'),
        delta({}, "tool_calls"),
        FINAL,
    )
    evs = await events(body)
    kinds = [e["type"] for e in evs]
    # The call's pieces arrive as they came, in its open block, before the answer ends.
    pieces = [e["delta"]["partial_json"] for e in evs if e["type"] == "content_block_delta"
              and e["delta"]["type"] == "input_json_delta"]  # fmt: skip
    assert pieces == ['{"path": "a.txt", ', '"text": "hello', ' world"}']
    assert kinds.index("content_block_delta") < kinds.index("message_delta")
    message = accumulate(evs)
    assert message["content"] == [
        {"type": "tool_use", "id": "call_a", "name": "write_file",
         "input": {"path": "a.txt", "text": "hello world"}},
        {"type": "text", "text": "Done."},
    ]  # fmt: skip


def piece(index: int, **fn: str) -> dict[str, Any]:
    """A tool-call delta with these ``function`` fields only (no id, no type)."""
    return delta({"tool_calls": [{"index": index, "function": fn}]})


async def test_a_call_whose_name_comes_after_its_arguments_waits_for_it() -> None:
    """A block's name is in its content_block_start: a first call whose arguments began
    before its name came started as the tool "" (and kept it)."""
    body = sse(
        delta({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"arguments": '{"city": '}}]}),
        piece(0, name="get_weather", arguments='"Paris"}'),
        delta({}, "tool_calls"),
        FINAL,
    )  # fmt: skip
    message = accumulate(await events(body))
    assert message["content"] == [
        {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {"city": "Paris"}},
    ]


async def test_a_name_piece_after_the_block_started_is_dropped_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = sse(
        call_delta(0, id="call_a", name="get_", args='{"city": '),
        piece(0, name="weather", arguments='"Paris"}'),
        piece(0, name="_now", arguments=""),
        delta({}, "tool_calls"),
        FINAL,
    )
    with caplog.at_level("WARNING", logger="gateway.messages.output"):
        message = accumulate(await events(body))
    assert [(b["name"], b["input"]) for b in message["content"]] == [("get_", {"city": "Paris"})]
    warned = [r.getMessage() for r in caplog.records if r.name == "gateway.messages.output"]
    assert len(warned) == 1 and "'weather'" in warned[0] and "'get_'" in warned[0]


@pytest.mark.parametrize("arguments", ['"What\'s the weather?"', "[1, 2]", "  \n [3]", "not json"])
async def test_arguments_that_are_no_object_stream_as_the_whole_message_has_them(
    arguments: str,
) -> None:
    # A tool_use block's input is an object, and Anthropic's SDKs parse the pieces as one:
    # a model's call with other arguments (a string, a list) is held and sent at the end as
    # the non-streamed message has it, {"_raw": ...}, the live call and a held one alike.
    half = len(arguments) // 2
    body = sse(
        call_delta(0, id="call_a", name="f"),
        call_delta(0, args=arguments[:half]),
        call_delta(1, id="call_b", name="g", args=arguments),
        call_delta(0, args=arguments[half:]),
        delta({}, "tool_calls"),
        FINAL,
    )
    message = accumulate(await events(body))
    assert [b["input"] for b in message["content"]] == [{"_raw": arguments}] * 2
    assert tool_input(arguments) == {"_raw": arguments}


async def test_a_cut_answer_and_ignored_tools() -> None:
    body = sse(delta({"content": "Once upon"}), delta({}, "length"), FINAL)
    evs = await events(body, tools=[{"type": "web_search_20250305", "name": "web_search"}])
    message = accumulate(evs)
    assert message["stop_reason"] == "max_tokens"
    assert message["content"] == [{"type": "text", "text": "Once upon"}]
    assert message["xrouter"]["ignored_tools"] == ["web_search"]


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (sse(delta({"content": "Hal"}), {"error": {"message": "upstream died",
             "type": "upstream_error", "code": "upstream_unavailable"}}), "api_error"),
        (sse(delta({"content": "Hal"}), done=False), "api_error"),  # ended without its last chunk
        # The request's deadline passed mid-stream: Anthropic's own name for a 504.
        (sse(delta({"content": "Hal"}), {"error": {"message": "too slow",
             "type": "upstream_error", "code": "upstream_timeout"}}), "timeout_error"),
    ],
)  # fmt: skip
async def test_a_stream_that_fails_ends_with_an_error_event(body: bytes, kind: str) -> None:
    evs = await events(body)
    assert [e["type"] for e in evs][-1] == "error"
    assert evs[-1]["error"]["type"] == kind and evs[-1]["error"]["message"]
    assert "message_stop" not in [e["type"] for e in evs]


def test_a_completion_as_a_message() -> None:
    chat = {
        "id": f"chatcmpl-{RID}",
        "model": "m2",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "f", "arguments": '{"a": 1}'}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "g", "arguments": "not json"}},
            ]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "cost": 0.5},
        "xrouter": {"request_id": RID},
    }  # fmt: skip
    m = from_chat_completion(req(), chat)
    assert m["id"] == f"msg_{RID}" and m["model"] == "m2" and m["stop_reason"] == "tool_use"
    assert m["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
        {"type": "tool_use", "id": "call_2", "name": "g", "input": {"_raw": "not json"}},
    ]
    assert m["usage"]["input_tokens"] == 3 and m["usage"]["cost"] == 0.5
    # An empty answer is an empty content list; a refusal is text with stop_reason refusal.
    empty = {**chat, "choices": [{"finish_reason": "stop", "message": {"content": ""}}]}
    assert from_chat_completion(req(), empty)["content"] == []
    refused = {**chat, "choices": [{"finish_reason": "content_filter",
                                    "message": {"content": None, "refusal": "No."}}]}  # fmt: skip
    r = from_chat_completion(req(), refused)
    assert r["content"] == [{"type": "text", "text": "No."}] and r["stop_reason"] == "refusal"
    assert tool_input("[1, 2]") == {"_raw": "[1, 2]"} and tool_input(None) == {}


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
     (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"),
     (500, "api_error"), (502, "api_error"), (503, "api_error"), (504, "timeout_error")],
)  # fmt: skip
def test_errors_in_anthropic_s_shape(status: int, kind: str) -> None:
    body = error_body(status, {"message": "m", "type": "x", "param": "p", "code": "c"})
    assert body == {
        "type": "error",
        "error": {"type": kind, "message": "m", "code": "c", "param": "p"},
    }

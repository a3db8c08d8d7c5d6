"""The chat service's SSE as the Responses API's events, on chunk sequences a real upstream
sends (OpenAI streams a tool call's arguments in pieces, parallel calls interleaved), split
at any byte, and on streams that fail or stop short."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from openai.types.responses import Response, ResponseFailedEvent

from gateway.responses.output import EventStream, from_chat_completion
from gateway.responses.request import parse_request
from tests.support.chat_sse import call_delta, delta, sse

RID = "0123456789abcdef"


FINAL = {
    "model": "m1",
    "choices": [],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": 1e-05},
    "xrouter": {"request_id": RID, "policy": "compact"},
}


async def events(body: bytes, pieces: Sequence[int] = (), tools: Any = None) -> list[dict]:
    """Run the translation over ``body`` cut at the byte offsets ``pieces``."""
    req = parse_request({"model": "xrouter", "input": "x", "stream": True, "tools": tools})

    async def chunks() -> AsyncIterator[bytes]:
        cuts = [0, *pieces, len(body)]
        for a, b in itertools.pairwise(cuts):
            yield body[a:b]

    raw = b"".join([b async for b in EventStream(req, RID, 0).translate(chunks())])
    out = []
    for block in raw.split(b"\n\n"):
        if block:
            kind, data = block.split(b"\n")
            event = json.loads(data.removeprefix(b"data: "))
            assert kind == b"event: " + event["type"].encode()
            out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


async def test_parallel_calls_streamed_in_pieces() -> None:
    body = sse(
        delta({"role": "assistant", "content": None}),
        call_delta(0, id="call_a", name="weather", args=""),
        call_delta(0, args='{"city": '),
        call_delta(1, id="call_b", name="time", args='{"tz"'),
        call_delta(0, args='"Paris"}'),
        call_delta(1, args=': "CET"}'),
        delta({}, "tool_calls"),
        FINAL,
    )
    for pieces in ([], [7], list(range(1, len(body), 13))):
        got = await events(body, pieces)
        kinds = [e["type"] for e in got]
        assert kinds[:3] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
        ]
        assert kinds[-1] == "response.completed"
        added = [e for e in got if e["type"] == "response.output_item.added"]
        assert [(e["output_index"], e["item"]["call_id"]) for e in added] == [
            (0, "call_a"),
            (1, "call_b"),
        ]
        done = {e["output_index"]: e["arguments"] for e in got
                if e["type"] == "response.function_call_arguments.done"}  # fmt: skip
        assert done == {0: '{"city": "Paris"}', 1: '{"tz": "CET"}'}
        final = got[-1]["response"]
        assert [(o["name"], o["arguments"]) for o in final["output"]] == [
            ("weather", '{"city": "Paris"}'),
            ("time", '{"tz": "CET"}'),
        ]
        assert final["usage"]["input_tokens"] == 10 and final["usage"]["cost"] == 1e-05
        assert final["model"] == "m1" and final["xrouter"]["policy"] == "compact"


async def test_text_then_a_call_and_a_namespaced_call() -> None:
    tools = [{"type": "namespace", "name": "agents",
              "tools": [{"type": "function", "name": "spawn"}]}]  # fmt: skip
    body = sse(
        delta({"role": "assistant", "content": "Let me "}),
        delta({"content": "check."}),
        call_delta(0, id="c1", name="agents__spawn", args="{}"),
        delta({}, "tool_calls"),
        FINAL,
    )
    got = await events(body, tools=tools)
    final = got[-1]["response"]
    message, call = final["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == "Let me check."
    assert (call["namespace"], call["name"], call["call_id"]) == ("agents", "spawn", "c1")
    text_done = next(e for e in got if e["type"] == "response.output_text.done")
    assert text_done["output_index"] == 0 and text_done["text"] == "Let me check."


async def test_a_call_whose_id_never_comes_waits_for_the_end() -> None:
    """Held for its id while text streams; at the end it is added with the id the JSON
    answer gives it (``call_<request id>_<index>``), a call that started after it behind
    it."""
    body = sse(
        call_delta(0, name="weather", args='{"city": '),
        delta({"content": "Checking."}),
        call_delta(1, id="c2", name="time", args="{}"),
        call_delta(0, args='"Paris"}'),
        delta({}, "tool_calls"),
        FINAL,
    )
    got = await events(body)
    added = [(e["output_index"], e["item"]["id"]) for e in got
             if e["type"] == "response.output_item.added"]  # fmt: skip
    assert added == [(0, f"msg_{RID}"), (1, f"fc_call_{RID}_0"), (2, "fc_c2")]
    final = got[-1]["response"]
    assert [(o["id"], o.get("arguments")) for o in final["output"]] == [
        (f"msg_{RID}", None),
        (f"fc_call_{RID}_0", '{"city": "Paris"}'),
        ("fc_c2", "{}"),
    ]
    Response.model_validate(final)


async def test_a_cut_answer_is_incomplete() -> None:
    body = sse(delta({"content": "Once upon"}), delta({}, "length"), FINAL)
    got = await events(body)
    assert got[-1]["type"] == "response.incomplete"
    final = got[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        # The chat service's error event: an upstream failure after some text.
        (sse(delta({"content": "partial"}),
             {"error": {"message": "upstream reset", "type": "upstream_error",
                        "code": "upstream_error", "param": None}}), "upstream_error"),
        # A chat stream that stops without its final usage chunk.
        (sse(delta({"content": "partial"}), done=False), None),
        # A rate-limited upstream keeps OpenAI's code for it.
        (sse(delta({"content": "partial"}),
             {"error": {"message": "slow down", "type": "server_error",
                        "code": "upstream_rate_limited", "param": None}}), "upstream_rate_limited"),
    ],
)  # fmt: skip
async def test_a_stream_that_fails_ends_with_response_failed(body: bytes, code: str | None) -> None:
    got = await events(body)
    assert got[-1]["type"] == "response.failed"
    failed = got[-1]["response"]
    # The code is one OpenAI's SDK knows; the gateway's own code stays in the message.
    event = ResponseFailedEvent.model_validate(got[-1])
    want = "rate_limit_exceeded" if code == "upstream_rate_limited" else "server_error"
    assert failed["status"] == "failed" and event.response.error is not None
    assert event.response.error.code == want
    assert code is None or f"({code})" in event.response.error.message
    assert failed["output"][0]["content"][0]["text"] == "partial"


async def test_an_empty_streamed_answer_opens_and_closes_its_message() -> None:
    """A client that builds the output from the events must end with what
    ``response.completed`` holds: the empty message is announced, not only in the end."""
    got = await events(sse(delta({"role": "assistant"}), delta({}, "stop"), FINAL))
    kinds = [e["type"] for e in got]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = Response.model_validate(got[-1]["response"])
    assert final.output_text == "" and final.output[0].id == got[2]["item"]["id"]
    assert got[-2]["item"] == got[-1]["response"]["output"][0]
    assert final.usage is not None and final.usage.input_tokens_details.cache_write_tokens == 0


def test_an_empty_completion_is_still_a_message() -> None:
    req = parse_request({"model": "xrouter", "input": "x"})
    chat = {
        "id": f"chatcmpl-{RID}",
        "created": 1,
        "model": "m1",
        "choices": [{"message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}],
        "usage": FINAL["usage"],
    }
    out = from_chat_completion(req, chat)
    Response.model_validate(out)  # every field OpenAI's SDK requires, usage's included
    assert out["id"] == f"resp_{RID}" and out["status"] == "completed"
    assert out["output"][0]["content"][0]["text"] == ""
    assert out["completed_at"] >= out["created_at"] and out["user"] is None


def test_the_user_is_echoed_and_only_a_completed_response_has_completed_at() -> None:
    req = parse_request({"model": "xrouter", "input": "x", "user": "u-42"})
    chat = {
        "id": f"chatcmpl-{RID}",
        "created": 1,
        "model": "m1",
        "choices": [{"message": {"role": "assistant", "content": "ab"}, "finish_reason": "length"}],
        "usage": FINAL["usage"],
    }
    out = from_chat_completion(req, chat)
    assert out["user"] == "u-42"
    assert out["status"] == "incomplete" and out["completed_at"] is None


async def test_a_streamed_refusal_is_a_refusal_part() -> None:
    body = sse(
        delta({"role": "assistant", "content": None, "refusal": ""}),
        delta({"refusal": "I can't "}),
        delta({"refusal": "help with that."}),
        delta({}, "stop"),
        FINAL,
    )
    got = await events(body)
    kinds = [e["type"] for e in got]
    assert "response.output_text.delta" not in kinds
    assert [e["delta"] for e in got if e["type"] == "response.refusal.delta"] == [
        "I can't ",
        "help with that.",
    ]
    done = next(e for e in got if e["type"] == "response.refusal.done")
    assert done["refusal"] == "I can't help with that." and done["content_index"] == 0
    [message] = got[-1]["response"]["output"]
    assert message["content"] == [{"type": "refusal", "refusal": "I can't help with that."}]


def test_a_completion_with_a_refusal() -> None:
    req = parse_request({"model": "xrouter", "input": "x"})
    message = {"role": "assistant", "content": None, "refusal": "No."}
    chat = {
        "id": f"chatcmpl-{RID}",
        "created": 1,
        "model": "m1",
        "choices": [{"message": message, "finish_reason": "stop"}],
        "usage": FINAL["usage"],
    }
    [item] = from_chat_completion(req, chat)["output"]
    assert item["content"] == [{"type": "refusal", "refusal": "No."}]


def piece(index: int, **fn: str) -> dict[str, Any]:
    """A tool-call delta with these ``function`` fields only (no id, no type)."""
    return delta({"tool_calls": [{"index": index, "function": fn}]})


def names_said(got: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each function call's name as output_item.added, output_item.done and the completed
    response say it, by call id."""
    said: dict[str, list[str]] = {}
    for e in got:
        if e["type"] in ("response.output_item.added", "response.output_item.done"):
            if e["item"]["type"] == "function_call":
                said.setdefault(e["item"]["call_id"], []).append(e["item"]["name"])
    for o in got[-1]["response"]["output"]:
        said[o["call_id"]].append(o["name"])
    return said


async def test_a_name_piece_after_the_call_was_added_is_dropped_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The name is in output_item.added, which the SDK's snapshot keeps: a piece that came
    after the arguments began (the call was added then) changed the name in .done and in
    the response only. The name added stays; the piece is logged, once per call."""
    body = sse(
        call_delta(0, id="c1", name="get_", args='{"city": '),
        piece(0, name="weather", arguments='"Paris"}'),
        piece(0, name="_now", arguments=""),
        delta({}, "tool_calls"),
        FINAL,
    )
    with caplog.at_level("WARNING", logger="gateway.responses.output"):
        got = await events(body)
    assert names_said(got) == {"c1": ["get_", "get_", "get_"]}
    assert got[-1]["response"]["output"][0]["arguments"] == '{"city": "Paris"}'
    warned = [r.getMessage() for r in caplog.records if r.name == "gateway.responses.output"]
    assert len(warned) == 1 and "'weather'" in warned[0] and "'get_'" in warned[0]


async def test_a_call_whose_name_comes_after_its_arguments_waits_for_it() -> None:
    """A call whose arguments began before its name came was added with the name "", which
    its name then replaced in .done and the response; it waits for its name, as for its
    id, and is added with it."""
    body = sse(
        delta({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                               "function": {"arguments": '{"city": '}}]}),
        piece(0, name="weather", arguments='"Paris"}'),
        delta({}, "tool_calls"),
        FINAL,
    )  # fmt: skip
    got = await events(body)
    assert names_said(got) == {"c1": ["weather", "weather", "weather"]}
    pieces = [e["delta"] for e in got if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(pieces) == '{"city": "Paris"}'

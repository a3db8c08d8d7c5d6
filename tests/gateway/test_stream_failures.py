"""Streams that fail on the upstream's side, through all three APIs: the client gets the
API's own error event (never a cut connection), the ledger row says what failed and keeps
the call, and the gateway logs no traceback."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from router.outcomes import OutcomeRecord
from tests.gateway.conftest import Upstream, hang_up_at, ledger_rows, longest_answer
from tests.support.gateway import Gateway

MODEL = "llama-3.2-3b-instruct"
PROMPT = "Name three primary colours."


def sse(gw: Gateway, path: str, body: dict[str, Any]) -> tuple[str, list[tuple[str, Any]]]:
    """The request id and the stream's (event name, data) pairs, read raw."""
    events: list[tuple[str, Any]] = []
    name = "message"
    with httpx.stream("POST", f"{gw.url}{path}", json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        request_id = r.headers["x-xrouter-request-id"]
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and line != "data: [DONE]":
                events.append((name, json.loads(line[6:])))
                name = "message"
    return request_id, events


def test_a_malformed_chunk_mid_stream_ends_in_an_error_event(
    gateway: Gateway, upstream: Upstream
) -> None:
    upstream.fault(MODEL, "bad-event=3")
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    texts = []
    with pytest.raises(openai.APIError) as exc:
        for chunk in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPT}], stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                texts.append(chunk.choices[0].delta.content)
    assert len(texts) == 3  # what came before the bad event reached the client
    assert "invalid stream event" in str(exc.value)
    # The Responses and Messages APIs end the same failure with their own failure events.
    upstream.fault(MODEL, "bad-event=3")
    body = {"model": MODEL, "input": PROMPT, "stream": True}
    request_id, events = sse(gateway, "/v1/responses", body)
    assert events[-1][0] == "response.failed"
    assert ledger_rows(gateway, request_id)[0][0] == 502
    upstream.fault(MODEL, "bad-event=3")
    body = {"model": MODEL, "max_tokens": 200, "stream": True}
    body["messages"] = [{"role": "user", "content": PROMPT}]
    request_id, events = sse(gateway, "/v1/messages", body)
    assert events[-1][0] == "error" and events[-1][1]["error"]["type"] == "api_error"
    (status, _, _), calls = ledger_rows(gateway, request_id)
    assert status == 502 and calls[-1][0] == MODEL and calls[-1][4] is not None
    assert "Traceback" not in gateway.log()


def test_a_stream_whose_usage_chunk_is_malformed_books_its_call_as_failed(
    gateway: Gateway, upstream: Upstream
) -> None:
    """The answer came to its finish_reason, then the upstream's usage chunk was malformed:
    the request fails (502), and its call is booked as the failure it was, not as ok."""
    upstream.fault(MODEL, "bad-usage")
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": True}
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", json=body) as r:
        request_id = r.headers["x-request-id"]
        events = [
            json.loads(line[6:])
            for line in r.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
    finished = [c["choices"][0]["finish_reason"] for c in events if c.get("choices")]
    assert "stop" in finished and "invalid stream event" in events[-1]["error"]["message"]
    (status, _, _), calls = ledger_rows(gateway, request_id)
    assert status == 502
    assert [(c[0], c[4]) for c in calls] == [(MODEL, "bad_response")]


def test_a_malformed_answer_is_a_clean_502(gateway: Gateway, upstream: Upstream) -> None:
    # Not streamed: a body that is JSON but not a completion is the upstream's fault,
    # said in the OpenAI shape and logged with the call.
    upstream.fault(MODEL, "bad-event=0")
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}
    r = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=30)
    assert r.status_code == 502 and "invalid response" in r.json()["error"]["message"]
    (status, _, _), calls = ledger_rows(gateway, r.headers["x-xrouter-request-id"])
    assert status == 502 and [(c[0], c[4]) for c in calls] == [(MODEL, "bad_response")]


def test_a_stream_that_cannot_open_keeps_its_failed_call_in_the_ledger(
    gateway: Gateway, upstream: Upstream
) -> None:
    upstream.fault(MODEL, "status=500", count=10)
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    r = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=30)
    assert r.status_code == 502, r.text
    (status, _, cost), calls = ledger_rows(gateway, r.headers["x-xrouter-request-id"])
    assert (status, cost) == (502, 0)
    assert [(c[0], c[4]) for c in calls] == [(MODEL, "upstream_5xx")]


# Bug: an upstream stream that sent its role chunk and broke off was relayed as a failed
# answer: the stream counted as open at that chunk, though the client had seen nothing.
def test_a_stream_that_breaks_off_before_its_first_word_is_retried(
    gateway: Gateway, upstream: Upstream
) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(model=MODEL, messages=messages)
    upstream.reset()
    upstream.fault(MODEL, "cut-stream=0")  # the role chunk, then the connection closes
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and chunks[-1].usage is not None
    assert upstream.stats()["requests"][MODEL] == 2
    (status, _, _), calls = ledger_rows(gateway, chunks[0].id.removeprefix("chatcmpl-"))
    assert status == 200 and [(c[0], c[4]) for c in calls] == [(MODEL, None)]


@pytest.mark.parametrize(
    ("path", "text_event"),
    [("/v1/responses", "response.output_text.delta"), ("/v1/messages", "content_block_delta")],
)
def test_a_translated_stream_abandoned_mid_way_keeps_its_call(
    gateway: Gateway,
    upstream: Upstream,
    demo_table: list[OutcomeRecord],
    path: str,
    text_event: str,
) -> None:
    # The client hangs up after the first piece of text: the call it was reading is in the
    # row (the relay closes before the row is built), charged for what was generated. The
    # model's longest recorded answer, so that the stream is still going when the hang-up
    # lands (a short one could be all sent by then on a loaded machine: a 200, not a 499).
    prompt = longest_answer(demo_table, MODEL).text
    body: dict[str, Any] = {"model": MODEL, "stream": True}
    if path == "/v1/responses":
        body["input"] = prompt
    else:
        body |= {"max_tokens": 4096, "messages": [{"role": "user", "content": prompt}]}
    request_id = hang_up_at(gateway.url, path, body, text_event)
    (status, _, cost), calls = ledger_rows(gateway, request_id)
    assert status == 499 and cost > 0
    assert [c[0] for c in calls] == [MODEL] and calls[0][1] == cost

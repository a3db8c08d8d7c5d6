"""``GET /v1/generation``: what a request cost and how it was served, read back from the
ledger by any id its response carried (as OpenRouter's generation stats)."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from router.outcomes import OutcomeRecord
from tests.gateway.conftest import abandon_stream, longest_answer
from tests.support.gateway import ADMIN_KEY, Gateway
from tests.support.sdk import extra

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
MODEL = "gemma-2-9b-it"


def stats(gw: Gateway, request_id: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    return httpx.get(
        f"{gw.base_url}/generation", params={"id": request_id}, headers=headers, timeout=30
    )


def test_a_routed_request_reads_back_as_it_was_charged(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    c = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    resp = c.chat.completions.create(
        model="xrouter", messages=[{"role": "user", "content": demo_table[3].text}], user="u-7"
    )
    meta = extra(resp)["xrouter"]
    # Right after the answer: the row may still be queued behind the response.
    r = stats(gateway, resp.id)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert data["id"] == meta["request_id"] and resp.id == f"chatcmpl-{data['id']}"
    assert (data["model"], data["requested_model"], data["policy"]) == (
        resp.model,
        "xrouter",
        "compact",
    )
    assert (data["api"], data["status"], data["streamed"], data["cancelled"]) == (
        "chat",
        200,
        False,
        False,
    )
    assert data["user"] == "u-7"
    assert data["total_cost"] == pytest.approx(extra(resp.usage)["cost"], abs=1e-9)
    assert data["total_cost"] == pytest.approx(sum(c["cost"] for c in data["calls"]), abs=1e-9)
    assert (data["tokens_prompt"], data["tokens_completion"]) == (
        resp.usage.prompt_tokens if resp.usage else None,
        resp.usage.completion_tokens if resp.usage else None,
    )
    assert [(c["model"], c["role"], c["status"]) for c in data["calls"]] == [
        (resp.model, "downstream", "ok")
    ]
    assert data["decision"]["actions"] == [resp.model] == meta["decision"]["actions"]
    assert stats(gateway, meta["request_id"]).json() == r.json()  # the bare id too


def test_a_stream_read_without_its_usage_chunk_still_has_its_cost(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    rec = longest_answer(demo_table, MODEL)
    with httpx.stream(
        "POST",
        f"{gateway.base_url}/chat/completions",
        json={"model": MODEL, "stream": True, "messages": [{"role": "user", "content": rec.text}]},
        timeout=30,
    ) as s:
        request_id = s.headers["x-xrouter-request-id"]
        for _ in s.iter_lines():
            pass
    data = stats(gateway, request_id).json()["data"]
    assert data["streamed"] and data["status"] == 200 and data["policy"] == "passthrough"
    assert data["total_cost"] > 0 and data["tokens_completion"] > 0

    # A client that hung up: its request says so, with what it used.
    cut = abandon_stream(gateway.base_url, MODEL, rec.text)
    deadline = time.monotonic() + 10
    r = stats(gateway, cut)
    while r.status_code == 404 and time.monotonic() < deadline:
        time.sleep(0.1)  # the hang-up is seen after the client left
        r = stats(gateway, cut)
    data = r.json()["data"]
    assert (data["status"], data["cancelled"]) == (499, True)


def test_responses_and_messages_ids_name_their_requests(gateway: Gateway) -> None:
    question = "What is the capital of France?"
    resp = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    r = resp.responses.create(model=MODEL, input=question)
    msg = anthropic.Anthropic(
        base_url=gateway.url, api_key="unused", max_retries=0
    ).messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": question}])
    for answer_id, api in ((r.id, "responses"), (msg.id, "messages")):
        got = stats(gateway, answer_id)
        assert got.status_code == 200, got.text
        assert (got.json()["data"]["api"], got.json()["data"]["model"]) == (api, MODEL)


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({}, 400, None),
        ({"id": "has spaces"}, 400, None),
        ({"id": "x" * 200}, 400, None),
        ({"id": "chatcmpl-0000"}, 404, "request_not_found"),
    ],
)
def test_bad_and_unknown_ids(
    gateway: Gateway, params: dict[str, Any], status: int, code: str | None
) -> None:
    r = httpx.get(f"{gateway.base_url}/generation", params=params)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == "id" and (code is None or err["code"] == code)
    if status == 404:  # named as it was sent, prefix and all
        assert err["message"] == f"no request {params['id']!r} in the ledger", err


def test_only_the_key_that_made_a_request_reads_it(secured: Gateway) -> None:
    def key() -> str:
        r = httpx.post(
            f"{secured.url}/admin/keys", json={"alias": f"g{time.time_ns()}"}, headers=ADMIN
        )
        assert r.status_code == 201, r.text
        return str(r.json()["key"])

    mine, theirs = key(), key()
    c = openai.OpenAI(base_url=secured.base_url, api_key=mine, max_retries=0)
    resp = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}]
    )
    assert stats(secured, resp.id, mine).status_code == 200
    other = stats(secured, resp.id, theirs)
    # Another key's request is "not found", exactly as an id that does not exist.
    assert other.status_code == 404 and other.json()["error"]["code"] == "request_not_found"
    assert stats(secured, resp.id).status_code == 401

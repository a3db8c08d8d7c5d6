"""Load shedding end to end: ``xrouter serve`` with ``server.max_in_flight`` under uvicorn,
the replay upstream made slow, and the real OpenAI and Anthropic SDKs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.conftest import Upstream
from tests.support.gateway import Gateway, gateway_config, start_gateway

MODEL = "mistral-small-24b-instruct-2501-bf16"
LIMIT = 2


@pytest.fixture(scope="module")
def bounded(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("shedding")
    cfg = gateway_config(tmp, upstream.base_url, server={"max_in_flight": LIMIT})
    gw = start_gateway(tmp, cfg)
    yield gw
    gw.stop()


def _metric(gw: Gateway, name: str) -> float:
    for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} series")


def _ask(gw: Gateway, stream: bool = False) -> str:
    c = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "slow"}]
    if stream:
        chunks = c.chat.completions.create(model=MODEL, messages=messages, stream=True)
        return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    return (
        c.chat.completions.create(model=MODEL, messages=messages).choices[0].message.content or ""
    )


def _wait_in_flight(gw: Gateway, n: int) -> None:
    deadline = time.monotonic() + 10
    while _metric(gw, "xrouter_requests_in_flight") < n:
        assert time.monotonic() < deadline, "the slow requests never got in flight"
        time.sleep(0.02)


def test_requests_over_the_bound_are_shed_at_once_and_the_rest_answered(
    bounded: Gateway, upstream: Upstream
) -> None:
    upstream.fault(MODEL, "latency=1500", count=LIMIT)
    shed_before = _metric(bounded, 'xrouter_requests_shed_total{api="chat"}')
    with ThreadPoolExecutor(LIMIT) as pool:
        slow = [pool.submit(_ask, bounded, stream) for stream in (False, True)]
        _wait_in_flight(bounded, LIMIT)
        # Over the bound: refused at once, retryable, in each API's own shape.
        t0 = time.monotonic()
        with pytest.raises(openai.InternalServerError) as exc:
            _ask(bounded)
        assert time.monotonic() - t0 < 1.0
        r = exc.value.response
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert exc.value.code == "overloaded" and r.headers["x-request-id"]
        claude = anthropic.Anthropic(base_url=bounded.url, api_key="unused", max_retries=0)
        with pytest.raises(anthropic.OverloadedError) as over:
            claude.messages.create(
                model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
            )
        assert over.value.status_code == 529 and over.value.request_id
        assert over.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        # The operator's endpoints are not model requests: they keep answering.
        assert httpx.get(f"{bounded.url}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{bounded.url}/v1/models", timeout=5).status_code == 200
        assert all(f.result(timeout=30) for f in slow)  # the admitted ones, answered
    assert _metric(bounded, 'xrouter_requests_shed_total{api="chat"}') - shed_before == 1
    assert _metric(bounded, 'xrouter_requests_shed_total{api="messages"}') >= 1
    # Their answers done (the stream's last event included), the slots are free again.
    deadline = time.monotonic() + 5
    while _metric(bounded, "xrouter_requests_in_flight") != 0:
        assert time.monotonic() < deadline, "slots still held after the answers"
        time.sleep(0.02)
    assert _ask(bounded) and _ask(bounded, stream=True)


def test_the_sdk_retries_a_shed_request_and_gets_in(bounded: Gateway, upstream: Upstream) -> None:
    upstream.fault(MODEL, "latency=1200", count=LIMIT)
    with ThreadPoolExecutor(LIMIT) as pool:
        slow = [pool.submit(_ask, bounded) for _ in range(LIMIT)]
        _wait_in_flight(bounded, LIMIT)
        # Shed, then retried after retry-after (1 s) by the SDK itself, once a slot is free.
        c = openai.OpenAI(base_url=bounded.base_url, api_key="unused", max_retries=3)
        answer = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert answer.choices[0].message.content
        assert all(f.result(timeout=30) for f in slow)

"""W3C Trace Context end to end: ``xrouter serve`` under uvicorn in front of a scripted
OpenAI-compatible upstream that records the headers of every call it gets; the real OpenAI
and Anthropic SDKs send the trace headers as an instrumented application would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.support.gateway import Gateway, gateway_config, start_gateway
from tests.support.scripted_upstream import ScriptedUpstream, scripted_upstream

MODEL = "mistral-small-24b-instruct-2501-bf16"
TRACE = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "congo=t61rcWkgMzE",
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, ScriptedUpstream]]:
    tmp = tmp_path_factory.mktemp("trace")
    with scripted_upstream(tmp) as up:
        # The llm router's own model is served by the same upstream.
        router = {"watch_files": False, "circuit_breaker": {"failures": 0}}
        router["llm"] = {"base_url": up.base_url}
        gw = start_gateway(tmp, gateway_config(tmp, up.base_url, router=router))
        try:
            yield gw, up
        finally:
            gw.stop()


def _calls_for(up: ScriptedUpstream, prompt: str) -> list[dict[str, str]]:
    """The headers of the upstream calls made for ``prompt``."""
    bodies, headers = up.requests(), up.headers()
    return [
        h
        for b, h in zip(bodies, headers, strict=True)
        if any(m.get("content") == prompt for m in b.get("messages") or [])
    ]


def _bodies_for(up: ScriptedUpstream, prompt: str) -> list[dict[str, object]]:
    return [
        b for b in up.requests() if any(m.get("content") == prompt for m in b.get("messages") or [])
    ]


def _oai(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize(
    ("model", "stream"),
    [
        ("xrouter/cascade", False),  # several calls for one request: each carries it
        ("xrouter/cascade", True),
        ("xrouter/llm", False),  # the router model's own call
    ],
)
def test_the_trace_context_reaches_every_upstream_call(
    setup: tuple[Gateway, ScriptedUpstream], model: str, stream: bool
) -> None:
    gw, up = setup
    prompt = f"traced, {model}, stream={stream}"
    answer = _oai(gw).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        stream=stream,
        extra_headers=TRACE,
    )
    if stream:
        assert "".join(c.choices[0].delta.content or "" for c in answer if c.choices)  # type: ignore[union-attr]
    calls = _calls_for(up, prompt)
    assert calls
    if model == "xrouter/llm":
        assert any(b.get("model") == "xrouter-router" for b in _bodies_for(up, prompt))
    for h in calls:
        assert (h.get("traceparent"), h.get("tracestate")) == (
            TRACE["traceparent"],
            TRACE["tracestate"],
        )


def test_the_messages_api_forwards_it_too(setup: tuple[Gateway, ScriptedUpstream]) -> None:
    gw, up = setup
    client = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)
    client.messages.create(
        model=MODEL,
        max_tokens=32,
        messages=[{"role": "user", "content": "traced, messages"}],
        extra_headers={"traceparent": TRACE["traceparent"]},
    )
    [h] = _calls_for(up, "traced, messages")
    assert h["traceparent"] == TRACE["traceparent"] and "tracestate" not in h


def test_no_context_or_a_malformed_one_forwards_nothing(
    setup: tuple[Gateway, ScriptedUpstream],
) -> None:
    gw, up = setup
    cases = {
        "untraced": {},
        "malformed": {"traceparent": "00-not-a-trace-01", "tracestate": "congo=t61rcWkgMzE"},
    }
    for prompt, headers in cases.items():
        _oai(gw).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], extra_headers=headers
        )
        [h] = _calls_for(up, prompt)
        assert "traceparent" not in h and "tracestate" not in h
    # Two traceparent headers are no valid context either.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "twice"}]}
    twice = [("traceparent", TRACE["traceparent"])] * 2
    httpx.post(f"{gw.base_url}/chat/completions", json=body, headers=twice).raise_for_status()
    [h] = _calls_for(up, "twice")
    assert "traceparent" not in h


def test_forwarding_can_be_turned_off(tmp_path: Path) -> None:
    with scripted_upstream(tmp_path) as up:
        cfg = gateway_config(tmp_path, up.base_url, server={"forward_trace_context": False})
        gw = start_gateway(tmp_path, cfg)
        try:
            _oai(gw).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "off"}], extra_headers=TRACE
            )
        finally:
            gw.stop()
        [h] = _calls_for(up, "off")
    assert "traceparent" not in h

"""Fault and latency injection through the three channels: the ``x-replay-fault`` header, the
``/_replay/faults`` control API and a ``[[replay:...]]`` marker in the prompt."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from router.outcomes import OutcomeRecord
from tests.gateway.replay.conftest import ReplayServer

MODEL = "llama-3.1-8b-instruct"
OTHER = "gemma-2-9b-it"
PROMPT = "Tell me a long story about routers and their many cheap and expensive models."

# A channel turns (fault, server) into the kwargs of one request that carries the fault.
Channel = Callable[[str, ReplayServer], dict[str, Any]]


def _header(fault: str, server: ReplayServer) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": PROMPT}],
        "extra_headers": {"x-replay-fault": fault},
    }


def _queued(fault: str, server: ReplayServer) -> dict[str, Any]:
    r = server.http.post("/_replay/faults", json={"model": MODEL, "fault": fault, "count": 1})
    r.raise_for_status()
    return {"messages": [{"role": "user", "content": PROMPT}]}


def _marker(fault: str, server: ReplayServer) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"{PROMPT} [[replay:{fault}]]"}]}


CHANNELS = pytest.mark.parametrize(
    "channel", [_header, _queued, _marker], ids=["header", "api", "marker"]
)


@CHANNELS
@pytest.mark.parametrize(
    ("status", "error"),
    [
        (503, openai.InternalServerError),
        (429, openai.RateLimitError),
        (400, openai.BadRequestError),
    ],
)
def test_status_fault(
    client: openai.OpenAI,
    replay: ReplayServer,
    channel: Channel,
    status: int,
    error: type[Exception],
) -> None:
    with pytest.raises(error) as exc:
        client.chat.completions.create(model=MODEL, **channel(f"status={status}", replay))
    assert isinstance(exc.value, openai.APIStatusError) and exc.value.status_code == status
    body = exc.value.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}
    # The fake secret is there on purpose, for the gateway's sanitizer tests.
    assert (
        "sk-replay-SECRET-123" in body["message"]
        and "http://10.1.2.3:9/internal" in body["message"]
    )
    # One request, one fault: the next plain request succeeds.
    ok = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}])
    assert ok.choices[0].message.content
    stats = replay.http.get("/_replay/stats").json()
    assert stats["requests"] == {MODEL: 2} and stats["faults"] == {"status": 1}


@CHANNELS
def test_rate_limit_fault_names_its_wait(
    client: openai.OpenAI, replay: ReplayServer, channel: Channel
) -> None:
    with pytest.raises(openai.RateLimitError) as exc:
        client.chat.completions.create(model=MODEL, **channel("rate-limit=2.5", replay))
    assert exc.value.response.headers["retry-after"] == "2.5"
    assert exc.value.code == "rate_limit_exceeded"
    assert replay.http.get("/_replay/stats").json()["faults"] == {"rate-limit": 1}


def test_queued_faults_are_listed_as_written(replay: ReplayServer) -> None:
    for fault in ("rate-limit=30", "bad-usage", "no-usage", "timeout=2", "no-stream"):
        replay.http.post("/_replay/faults", json={"model": MODEL, "fault": fault})
    assert replay.http.get("/_replay/faults").json() == {
        "queued": {MODEL: ["rate-limit=30", "bad-usage", "no-usage", "timeout=2", "no-stream"]}
    }


@CHANNELS
def test_timeout_fault(client: openai.OpenAI, replay: ReplayServer, channel: Channel) -> None:
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.5).chat.completions.create(
            model=MODEL, **channel("timeout", replay)
        )
    assert time.monotonic() - started < 5
    assert client.chat.completions.create(model=MODEL, **_header("latency=1", replay)).choices


@CHANNELS
def test_drop_fault(client: openai.OpenAI, replay: ReplayServer, channel: Channel) -> None:
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model=MODEL, **channel("drop", replay))
    assert replay.http.get("/_replay/stats").json()["faults"] == {"drop": 1}


@CHANNELS
def test_no_usage_fault(client: openai.OpenAI, replay: ReplayServer, channel: Channel) -> None:
    r = client.chat.completions.create(model=MODEL, **channel("no-usage", replay))
    assert r.choices[0].message.content and r.usage is None
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            stream=True,
            stream_options={"include_usage": True},
            **channel("no-usage", replay),
        )
    )
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)


@CHANNELS
@pytest.mark.parametrize("after", [0, 3])
def test_cut_stream_fault(
    client: openai.OpenAI, replay: ReplayServer, channel: Channel, after: int
) -> None:
    received: list[Any] = []
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for chunk in client.chat.completions.create(
            model=MODEL, stream=True, **channel(f"cut-stream={after}", replay)
        ):
            received.append(chunk)
    assert received[0].choices[0].delta.role == "assistant"
    assert len([c for c in received if c.choices and c.choices[0].delta.content]) == after
    assert all(c.choices[0].finish_reason is None for c in received)
    # The same fault on a non-streaming request drops the connection.
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model=MODEL, **channel(f"cut-stream={after}", replay))


@CHANNELS
@pytest.mark.parametrize("after", [0, 3])
def test_bad_event_fault(replay: ReplayServer, channel: Channel, after: int) -> None:
    # Read raw: the fault exists to send what no SDK would parse.
    kwargs = channel(f"bad-event={after}", replay)
    body = {"model": MODEL, "messages": kwargs["messages"], "stream": True}
    headers = kwargs.get("extra_headers", {})
    with replay.http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    bad = events.index('{"choices": [null]}')
    content = [e for e in events[:bad] if '"content":"' in e and '"content":""' not in e]
    assert len(content) == after and events[-1] == "[DONE]"
    kwargs = channel(f"bad-event={after}", replay)  # a queued fault is used up: queue again
    r2 = replay.http.post(
        "/v1/chat/completions",
        json={**body, "stream": False},
        headers=kwargs.get("extra_headers", {}),
    )
    assert r2.status_code == 200 and r2.json() == {"choices": [None]}


def test_latency_header_global_and_marker_keeps_recorded_answer(
    client: openai.OpenAI, demo_records: list[OutcomeRecord]
) -> None:
    rec = demo_records[3]
    out = rec.outcomes[MODEL]
    started = time.monotonic()
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": rec.text}],
        extra_headers={"x-replay-latency-ms": "250"},
    )
    assert time.monotonic() - started >= 0.25
    assert resp.choices[0].message.content == out.response
    started = time.monotonic()
    marked = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"[[replay:latency=200]]{rec.text}"}]
    )
    assert time.monotonic() - started >= 0.2
    # The marker is stripped before the lookup, so the known prompt still replays its record.
    assert marked.choices[0].message.content == out.response
    assert marked.usage is not None and marked.usage.completion_tokens == out.completion_tokens


def test_control_api_queue_semantics(client: openai.OpenAI, replay: ReplayServer) -> None:
    msg = [{"role": "user", "content": PROMPT}]
    r = replay.http.post(
        "/_replay/faults", json={"model": MODEL, "fault": "status=503", "count": 2}
    )
    assert r.json() == {"queued": {MODEL: ["status=503", "status=503"]}}
    replay.http.post(
        "/_replay/faults", json={"model": "*", "fault": "status=502"}
    ).raise_for_status()
    # The other model is untouched by MODEL's faults but takes the wildcard one.
    with pytest.raises(openai.InternalServerError) as exc:
        client.chat.completions.create(model=OTHER, messages=msg)  # type: ignore[arg-type]
    assert exc.value.status_code == 502
    assert client.chat.completions.create(model=OTHER, messages=msg).choices  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model=MODEL, messages=msg)  # type: ignore[arg-type]
    assert client.chat.completions.create(model=MODEL, messages=msg).choices  # type: ignore[arg-type]
    assert replay.http.get("/_replay/stats").json()["requests"] == {OTHER: 2, MODEL: 3}

    replay.http.post("/_replay/faults", json={"fault": "drop", "count": 5}).raise_for_status()
    assert replay.http.get("/_replay/faults").json() == {"queued": {"*": ["drop"] * 5}}
    assert replay.http.delete("/_replay/faults").json() == {"cleared": 5}
    assert client.chat.completions.create(model=MODEL, messages=msg).choices  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": MODEL, "fault": "explode"}, 400),
        ({"model": MODEL, "fault": "status=200"}, 400),
        ({"model": MODEL, "fault": "rate-limit=-1"}, 400),
        ({"model": MODEL, "fault": "rate-limit"}, 400),
        ({"model": MODEL, "fault": "drop", "count": 0}, 400),
        ({"model": "no-such-model", "fault": "drop"}, 404),
    ],
)
def test_control_api_rejects_bad_faults(
    replay: ReplayServer, body: dict[str, Any], status: int
) -> None:
    r = replay.http.post("/_replay/faults", json=body)
    assert r.status_code == status and set(r.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    assert replay.http.get("/_replay/faults").json() == {"queued": {}}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"extra_headers": {"x-replay-fault": "explode"}},
        {"extra_headers": {"x-replay-latency-ms": "soon"}},
        {"extra_headers": {"x-replay-latency-ms": "inf"}},
        {"messages": [{"role": "user", "content": "[[replay:status=99]] hi"}]},
    ],
)
def test_bad_fault_in_request_is_a_400(client: openai.OpenAI, kwargs: dict[str, Any]) -> None:
    kwargs = {"messages": [{"role": "user", "content": "hi"}], **kwargs}
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, **kwargs)
    assert isinstance(exc.value.body, dict) and exc.value.body["code"] == "invalid_replay_fault"

"""Upstream failures the two transports must treat alike, against a scripted upstream on
loopback (tests/support/fault_upstream.py): what the replay upstream cannot send — a
``retry-after`` of ``nan``, a stream that ends before its first event, keep-alive comments
and nothing else, an event of megabytes."""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Literal

import pytest

from pricing import ModelPrice
from router.pool import ModelPool, PoolModel
from router.providers import native
from router.providers.client import DownstreamClient
from router.providers.errors import ProviderError, parse_retry_after, retry_delay
from tests.support.fault_upstream import FaultUpstream, Reply, chunk, event, fault_upstream

Transport = Literal["native", "litellm"]
BOTH = pytest.mark.parametrize("transport", ["native", "litellm"])
BODY = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def up() -> AsyncIterator[FaultUpstream]:
    async with fault_upstream() as u:
        yield u


def model(
    base: str,
    *,
    transport: Transport = "native",
    retries: int = 1,
    timeout: float = 5.0,
    concurrency: int = 8,
) -> PoolModel:
    return PoolModel(
        name="m",
        provider="openai",
        upstream_model="m",
        api_base=base,
        api_key="sk-test-key-should-not-leak",
        transport=transport,
        price=ModelPrice(input=Decimal("1"), output=Decimal("2")),
        max_output_tokens=256,
        timeout_s=timeout,
        max_retries=retries,
        max_concurrency=concurrency,
        fallbacks=(),
        description="",
    )


class Recorder:
    def __init__(self) -> None:
        self.sleeps: list[float] = []
        self.retries: list[str] = []

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)

    def on_retry(self, m: str, kind: str) -> None:
        self.retries.append(kind)

    def on_fallback(self, m: str) -> None:
        pass

    def on_upstream_error(self, m: str, kind: str) -> None:
        pass

    def on_circuit(self, m: str, state: str) -> None:
        pass

    def on_deployment(self, m: str, deployment: str, ok: bool) -> None:
        pass


def client(pm: PoolModel) -> tuple[DownstreamClient, Recorder]:
    rec = Recorder()
    return DownstreamClient(ModelPool([pm]), events=rec, sleep=rec.sleep), rec


def test_only_a_finite_non_negative_retry_after_is_taken() -> None:
    for bad in ("nan", "NaN", "inf", "-inf", "-1", "soon", "Wed, 21 Oct 2015 07:28:00 GMT", ""):
        assert parse_retry_after(bad) is None, bad
    assert parse_retry_after("1.5") == 1.5 and parse_retry_after("0") == 0.0
    # A ProviderError built elsewhere with a bad value still never reaches the sleep as one.
    err = ProviderError("rate_limited", "x", retry_after=math.nan)
    assert 0 <= retry_delay(0, err, 0.1, 2.0) <= 0.1


@BOTH
@pytest.mark.parametrize("value", ["nan", "inf", "-3"])
async def test_a_retry_after_that_is_no_wait_is_ignored(
    up: FaultUpstream, transport: Transport, value: str
) -> None:
    # uvloop's sleep raises on nan: taken as given, it was a raw 500 instead of a retry.
    up.script(Reply(status=429, headers={"retry-after": value}))
    c, rec = client(model(up.base_url, transport=transport))
    r = await c.complete("m", dict(BODY))
    assert r.attempts == 2 and rec.retries == ["rate_limited"]
    assert len(rec.sleeps) == 1 and math.isfinite(rec.sleeps[0]) and 0 <= rec.sleeps[0] <= 0.1
    await c.aclose()


@BOTH
async def test_both_transports_map_408_and_keep_retry_after(
    up: FaultUpstream, transport: Transport
) -> None:
    # The native path took a 408 for a client error (not retried), LiteLLM for a timeout.
    up.script(Reply(status=408, headers={"retry-after": "1.5"}))
    c, rec = client(model(up.base_url, transport=transport, retries=0))
    with pytest.raises(ProviderError) as exc:
        await c.complete("m", dict(BODY))
    assert exc.value.kind == "timeout" and exc.value.retryable
    assert exc.value.retry_after == 1.5  # LiteLLM's errors dropped it
    await c.aclose()
    # Retried after the upstream's retry-after (capped by the backoff's maximum as always).
    up.script(Reply(status=429, headers={"retry-after": "1.5"}))
    c, rec = client(model(up.base_url, transport=transport, retries=1))
    r = await c.complete("m", dict(BODY))
    assert r.attempts == 2 and rec.sleeps == [1.5]
    up.script(Reply(status=503, headers={"retry-after": "60"}))
    r = await c.complete("m", dict(BODY))
    assert r.attempts == 2 and rec.sleeps == [1.5, 2.0]
    await c.aclose()


@BOTH
@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "bad_request"), (413, "bad_request"),
     (401, "upstream_4xx"), (403, "upstream_4xx"), (409, "upstream_4xx")],
)  # fmt: skip
async def test_both_transports_tell_a_refused_request_from_refused_credentials(
    up: FaultUpstream, transport: Transport, status: int, kind: str
) -> None:
    # A 400 is the client's request (the gateway answers 400), a 401 the gateway's key
    # (a 502); neither is retried, the same on both transports.
    up.script(Reply(status=status))
    c, rec = client(model(up.base_url, transport=transport, retries=2))
    with pytest.raises(ProviderError) as exc:
        await c.complete("m", dict(BODY))
    assert (exc.value.kind, exc.value.status, exc.value.retryable) == (kind, status, False)
    assert rec.retries == [] and up.calls == 1
    assert "sk-test-key-should-not-leak" not in exc.value.message
    await c.aclose()


async def test_a_422_is_a_bad_request_natively_and_retried_without_its_params_by_litellm(
    up: FaultUpstream,
) -> None:
    up.script(Reply(status=422))
    c, _ = client(model(up.base_url, retries=2))
    with pytest.raises(ProviderError) as exc:
        await c.complete("m", dict(BODY))
    assert (exc.value.kind, up.calls) == ("bad_request", 1)
    await c.aclose()
    # LiteLLM (drop_params) asks once more without what the 422 named; a second 422 leaves
    # it without an answer, which it returns as None: a bad response here, not a crash.
    for stream in (False, True):
        up.script(Reply(status=422), Reply(status=422))
        c, _ = client(model(up.base_url, transport="litellm", retries=0))
        with pytest.raises(ProviderError) as exc:
            if stream:
                sc = await c.open_stream("m", dict(BODY))
                [_ async for _ in sc.chunks]
            else:
                await c.complete("m", dict(BODY))
        assert exc.value.kind == "bad_response" and "no answer" in exc.value.message
        await c.aclose()
    assert up.calls == 5


@BOTH
async def test_a_stream_closed_before_its_first_event_is_a_connection_failure(
    up: FaultUpstream, transport: Transport
) -> None:
    # LiteLLM made up a finish chunk for it: an empty answer, counted a success.
    up.script(Reply(events=[]))
    c, rec = client(model(up.base_url, transport=transport))
    sc = await c.open_stream("m", dict(BODY))
    text = "".join(
        [
            (ch["choices"][0]["delta"].get("content") or "")
            async for ch in sc.chunks
            if ch["choices"]
        ]
    )
    assert sc.attempts == 2 and rec.retries == ["connection"] and up.calls == 2
    assert text == "Hello there."
    await c.aclose()


@BOTH
async def test_a_stream_cut_mid_answer_is_a_connection_failure(
    up: FaultUpstream, transport: Transport
) -> None:
    up.script(Reply.chunks(["a", "b"], done=False))
    c, _ = client(model(up.base_url, transport=transport))
    sc = await c.open_stream("m", dict(BODY))
    with pytest.raises(ProviderError) as exc:
        async for _ in sc.chunks:
            pass
    assert exc.value.kind == "connection" and sc.stats.text == "ab"
    await c.aclose()


@BOTH
async def test_keep_alive_comments_do_not_hold_a_stream_past_its_timeout(
    up: FaultUpstream, transport: Transport
) -> None:
    # Each comment used to restart the read timeout: the first chunk was awaited forever.
    up.script(Reply(events=[b": keep-alive\n\n"] * 20 + [event(chunk("late"))], gap_s=0.15))
    c, _ = client(model(up.base_url, transport=transport, retries=0, timeout=0.6))
    t = time.perf_counter()
    with pytest.raises(ProviderError) as exc:
        await c.open_stream("m", dict(BODY))
    assert exc.value.kind == "timeout" and "no data within 0.6s" in exc.value.message
    assert time.perf_counter() - t < 2.0
    await c.aclose()


async def test_a_large_stream_event_is_relayed_and_an_oversized_one_is_a_bad_response(
    up: FaultUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 600 KB in one delta (a big tool call, an image): over aiohttp's 512 KiB line limit,
    # whose LineTooLong is not a ClientError and reached the client as a raw 500.
    big = "x" * 600_000
    up.script(Reply.chunks([big, "!"]))
    c, _ = client(model(up.base_url))
    sc = await c.open_stream("m", dict(BODY))
    _ = [ch async for ch in sc.chunks]
    assert sc.stats.text == big + "!"
    # Past the limit: a bad response, not retried (it would come again), not an exception.
    monkeypatch.setattr(native, "MAX_EVENT_BYTES", 256 * 1024)
    up.calls = 0
    up.script(Reply.chunks([big]))
    with pytest.raises(ProviderError) as exc:
        await c.open_stream("m", dict(BODY))
    assert exc.value.kind == "bad_response" and "over" in exc.value.message and up.calls == 1
    # Mid-stream too: the stream ends with the error, the slot comes back.
    up.script(Reply.chunks(["ok", big]))
    sc = await c.open_stream("m", dict(BODY))
    with pytest.raises(ProviderError) as exc:
        async for _ in sc.chunks:
            pass
    assert exc.value.kind == "bad_response"
    assert not c._sem[("m", None)].locked()
    await c.aclose()


async def test_a_stream_closed_unread_gives_back_its_slot(up: FaultUpstream) -> None:
    c, _ = client(model(up.base_url, concurrency=1))
    sem = c._sem[("m", None)]
    sc = await c.open_stream("m", dict(BODY))
    assert sem.locked()
    await sc.aclose()  # never read: the client left before the relay started
    assert not sem.locked()
    await sc.aclose()  # closing twice gives back nothing twice
    assert not sem.locked() and sem._value == 1
    # A stream dropped without being closed at all is given back when collected.
    sc = await asyncio.wait_for(c.open_stream("m", dict(BODY)), 2)
    assert sem.locked()
    del sc
    gc.collect()
    assert not sem.locked()
    sc = await asyncio.wait_for(c.open_stream("m", dict(BODY)), 2)
    await sc.aclose()
    await c.aclose()


@BOTH
@pytest.mark.parametrize("stream", [False, True])
async def test_a_connection_dropped_before_any_answer_is_a_connection_failure(
    up: FaultUpstream, transport: Transport, stream: bool
) -> None:
    # LiteLLM reported a plain request's dropped connection as an upstream 500.
    up.script(Reply(drop=True), Reply(drop=True))
    c, rec = client(model(up.base_url, transport=transport, retries=1))
    with pytest.raises(ProviderError) as exc:
        if stream:
            sc = await c.open_stream("m", dict(BODY))
            async for _ in sc.chunks:
                pass
        else:
            await c.complete("m", dict(BODY))
    assert exc.value.kind == "connection" and exc.value.status is None
    assert rec.retries == ["connection"] and up.calls == 2  # retried as one
    assert "sk-test-key-should-not-leak" not in str(exc.value)
    await c.aclose()

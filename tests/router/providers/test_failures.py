"""Upstream failures the two transports must treat alike, against a scripted upstream on
loopback (tests/support/fault_upstream.py): what the replay upstream cannot send — a
``retry-after`` of ``nan``, a stream that ends before its first event, keep-alive comments
and nothing else, an event of megabytes."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import time
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from typing import Literal

import httpx
import pytest
from aiohttp import web

from pricing import ModelPrice
from router.health import BreakerConfig, CircuitBreakers
from router.pool import ModelPool, PoolModel
from router.providers import native
from router.providers.client import DownstreamClient, StreamCall
from router.providers.errors import ProviderError, parse_retry_after, retry_delay
from tests.support.fault_upstream import USAGE, FaultUpstream, Reply, chunk, event, fault_upstream
from tests.support.replay import replay_root, start_replay_upstream, stop_replay_upstream

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
    # Retried after the upstream's retry-after, when it is within the backoff's maximum.
    up.script(Reply(status=429, headers={"retry-after": "1.5"}))
    c, rec = client(model(up.base_url, transport=transport, retries=1))
    r = await c.complete("m", dict(BODY))
    assert r.attempts == 2 and rec.sleeps == [1.5]
    # A longer wait is not cut short: the call moves on at once (to another deployment or a
    # fallback; here there is none), with the upstream's retry-after on its error.
    up.script(Reply(status=503, headers={"retry-after": "60"}))
    with pytest.raises(ProviderError) as exc:
        await c.complete("m", dict(BODY))
    assert exc.value.attempts == 1 and exc.value.retry_after == 60 and rec.sleeps == [1.5]
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


def role_chunk() -> dict:
    """The chunk OpenAI opens every stream with: a role, an empty content, nothing else."""
    c = chunk("")
    c["choices"][0]["delta"]["role"] = "assistant"
    return c


async def read_text(sc: StreamCall) -> str:
    return "".join(
        [
            (ch["choices"][0]["delta"].get("content") or "")
            async for ch in sc.chunks
            if ch["choices"]
        ]
    )


# Bug: the stream counted as open at its first chunk, the role alone: an upstream that sent
# it and broke off was relayed as a cut answer, never retried, though the client had seen
# nothing yet.
@BOTH
async def test_a_stream_that_breaks_off_after_its_role_is_retried(
    up: FaultUpstream, transport: Transport
) -> None:
    up.script(Reply(events=[event(role_chunk()), event(role_chunk())]))  # then stops
    c, rec = client(model(up.base_url, transport=transport))
    sc = await c.open_stream("m", dict(BODY))
    assert await read_text(sc) == "Hello there."
    assert sc.attempts == 2 and rec.retries == ["connection"] and up.calls == 2
    await c.aclose()


@BOTH
async def test_a_stream_that_said_something_is_not_retried(
    up: FaultUpstream, transport: Transport
) -> None:
    # Its first word reached the caller with the head: a break after it is the answer's.
    up.script(Reply(events=[event(role_chunk()), event(chunk("a"))]))
    c, rec = client(model(up.base_url, transport=transport))
    sc = await c.open_stream("m", dict(BODY))
    with pytest.raises(ProviderError) as exc:
        await read_text(sc)
    assert exc.value.kind == "connection" and sc.stats.text == "a"
    assert sc.attempts == 1 and rec.retries == [] and up.calls == 1
    await c.aclose()


async def test_a_stream_of_a_role_and_a_finish_is_an_empty_answer(up: FaultUpstream) -> None:
    up.script(
        Reply(
            events=[
                event(role_chunk()),
                event(chunk(None, "stop")),
                event(chunk(usage=USAGE)),
                b"data: [DONE]\n\n",
            ]
        )
    )
    c, rec = client(model(up.base_url))
    sc = await c.open_stream("m", dict(BODY))
    assert await read_text(sc) == "" and sc.stats.finish_reason == "stop"
    assert sc.attempts == 1 and rec.retries == []
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


# Malformed answers, alike on both transports: a bad response (a 502
# ``upstream_bad_response``), not retried on the model that sent it (it would send it
# again), not counted by its circuit breaker, and the call falls back. LiteLLM reported
# its own parse failures as an upstream 500 or a lost connection: retried, counted, and
# said with the parser's words ("Expecting property name enclosed in double quotes").


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, httpx.Client]]:
    """The replay upstream, for its malformed-answer faults (``bad-event``, ``bad-usage``);
    pool models call its ``REPLAYED`` model."""
    proc, base = start_replay_upstream(tmp_path_factory.mktemp("replay"))
    with httpx.Client(base_url=replay_root(base), timeout=10) as ctl:
        yield base, ctl
    stop_replay_upstream(proc)


REPLAYED = "llama-3.2-3b-instruct"


def replayed(base: str, transport: Transport) -> PoolModel:
    return dataclasses.replace(model(base, transport=transport, retries=2), upstream_model=REPLAYED)


def with_fallback(pm: PoolModel) -> tuple[DownstreamClient, Recorder, CircuitBreakers]:
    """A client for ``pm`` (falling back to ``f``, the same upstream) whose circuit
    breaker opens at the first failure it counts."""
    rec = Recorder()
    breakers = CircuitBreakers(BreakerConfig(failures=1, cooldown_s=60))
    pool = ModelPool([dataclasses.replace(pm, fallbacks=("f",)), dataclasses.replace(pm, name="f")])
    c = DownstreamClient(pool, events=rec, sleep=rec.sleep, breakers=breakers)
    return c, rec, breakers


async def fails_then_falls_back(c: DownstreamClient, stream: bool) -> tuple[ProviderError, str]:
    """The first attempt's error and the text the fallback answered with."""
    if stream:
        sc = await c.open_stream("m", dict(BODY))
        _ = [ch async for ch in sc.chunks]
        assert sc.model.name == "f"
        errors, text = sc.errors, sc.stats.text
    else:
        r = await c.complete("m", dict(BODY))
        assert r.model == "f"
        errors, text = r.errors, r.body["choices"][0]["message"]["content"]
    assert [e.model for e in errors] == ["m"]
    return errors[0], text


@BOTH
@pytest.mark.parametrize("stream", [False, True])
async def test_both_transports_call_an_answer_that_is_not_a_completion_a_bad_response(
    replay: tuple[str, httpx.Client], transport: Transport, stream: bool
) -> None:
    # bad-event=0: a body that is no completion or, streamed, the role chunk and then an
    # event that is no chunk — nothing had reached the caller: the fallback answers.
    base, ctl = replay
    ctl.delete("/_replay/faults")
    ctl.post("/_replay/faults", json={"model": REPLAYED, "fault": "bad-event=0", "count": 1})
    c, rec, breakers = with_fallback(replayed(base, transport))
    err, text = await fails_then_falls_back(c, stream=stream)
    assert (err.kind, err.status, err.retryable) == ("bad_response", None, False)
    # Not LiteLLM's "Invalid response object Traceback … 'NoneType' object is not subscriptable".
    what = "stream event" if stream else "response"
    assert err.message.startswith(f"upstream m sent an invalid {what}")
    assert "NoneType" not in err.message
    assert rec.retries == [] and text  # not retried on m: the fallback answered
    assert breakers.state("m") == "closed"  # not counted by the circuit
    await c.aclose()


async def test_a_stream_answered_with_one_json_body_is_a_bad_response(
    replay: tuple[str, httpx.Client],
) -> None:
    # A server that ignores `stream: true` sent no `data:` line: the stream read as "closed
    # early", a connection failure — retried on the same server, and counted by its circuit.
    base, ctl = replay
    ctl.delete("/_replay/faults")
    ctl.post("/_replay/faults", json={"model": REPLAYED, "fault": "no-stream", "count": 1})
    c, rec, breakers = with_fallback(replayed(base, "native"))
    err, text = await fails_then_falls_back(c, stream=True)
    assert (err.kind, err.retryable) == ("bad_response", False)
    assert "answered a stream request with a JSON body" in err.message
    assert rec.retries == [] and text  # the fallback answered
    assert breakers.state("m") == "closed"
    await c.aclose()


@BOTH
@pytest.mark.parametrize("fault", ["bad-event=1", "bad-usage"])
async def test_both_transports_end_a_stream_on_a_malformed_event_with_a_bad_response(
    replay: tuple[str, httpx.Client], transport: Transport, fault: str
) -> None:
    # After its first word a stream is no longer retried: it ends with the error, which
    # names the event, not LiteLLM's "'NoneType' object has no attribute 'delta'".
    base, ctl = replay
    ctl.delete("/_replay/faults")
    ctl.post("/_replay/faults", json={"model": REPLAYED, "fault": fault, "count": 1})
    c, _, breakers = with_fallback(replayed(base, transport))
    sc = await c.open_stream("m", dict(BODY))
    with pytest.raises(ProviderError) as exc:
        async for _ in sc.chunks:
            pass
    assert (exc.value.kind, exc.value.status) == ("bad_response", None)
    assert exc.value.message.startswith("upstream m sent an invalid stream event")
    assert "NoneType" not in exc.value.message
    # Opened on its first word, then ended by the bad event.
    assert sc.stats.chunks >= 2 and sc.stats.error_kind == "bad_response" and sc.stats.text
    if fault == "bad-usage":
        assert sc.stats.finish_reason == "stop"  # the answer was whole; its usage was not
    assert breakers.state("m") == "closed"
    await c.aclose()


@BOTH
@pytest.mark.parametrize(
    ("reply", "stream", "what"),
    [
        # "Expecting property name enclosed in double quotes", said LiteLLM, as a 500.
        (Reply(events=[b"{not json"], headers={"Content-Type": "application/json"}), False,
         "response"),
        # A stream whose first event is not a chunk: nothing reached the client yet.
        (Reply(events=[event(b'{"choices": [null]}'), b"data: [DONE]\n\n"]), True,
         "stream event"),
        (Reply(events=[b"data: {not json\n\n", b"data: [DONE]\n\n"]), True, "stream event"),
    ],
)  # fmt: skip
async def test_both_transports_fall_back_from_an_answer_they_cannot_read(
    up: FaultUpstream, transport: Transport, reply: Reply, stream: bool, what: str
) -> None:
    up.script(reply)
    c, rec, breakers = with_fallback(model(up.base_url, transport=transport, retries=2))
    err, text = await fails_then_falls_back(c, stream)
    assert (err.kind, err.status) == ("bad_response", None)
    assert err.message.startswith(f"upstream m sent an invalid {what}")
    assert "Expecting" not in err.message and "NoneType" not in err.message
    assert rec.retries == [] and up.calls == 2 and text == "Hello there."
    assert breakers.state("m") == "closed"
    await c.aclose()


@BOTH
async def test_an_error_status_whose_body_is_not_json_is_still_that_status(
    transport: Transport,
) -> None:
    # A proxy's HTML 502: the upstream's trouble (retried, counted), not a bad response,
    # though its body does not parse either.
    async def bad_gateway(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=502, text="<html>bad gateway</html>", content_type="text/html")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", bad_gateway)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    c, rec = client(model(base, transport=transport, retries=1))
    try:
        with pytest.raises(ProviderError) as exc:
            await c.complete("m", dict(BODY))
    finally:
        await c.aclose()
        await runner.cleanup()
    assert (exc.value.kind, exc.value.status) == ("upstream_5xx", 502)
    assert rec.retries == ["upstream_5xx"]


async def test_a_litellm_call_refused_before_it_went_out_is_not_the_upstreams_trouble(
    up: FaultUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An openai/ model without an api_key: LiteLLM refuses it ("Missing credentials")
    # before sending anything, and called that an upstream 500 — retried, counted by the
    # circuit breaker. It is the gateway's setup, as an upstream's 401 would be.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    keyless = dataclasses.replace(model(up.base_url, transport="litellm", retries=2), api_key=None)
    for stream in (False, True):
        rec = Recorder()
        breakers = CircuitBreakers(BreakerConfig(failures=1, cooldown_s=60))
        c = DownstreamClient(ModelPool([keyless]), events=rec, sleep=rec.sleep, breakers=breakers)
        with pytest.raises(ProviderError) as exc:
            if stream:
                await c.open_stream("m", dict(BODY))
            else:
                await c.complete("m", dict(BODY))
        assert (exc.value.kind, exc.value.status, exc.value.retryable) == (
            "upstream_4xx", None, False,
        )  # fmt: skip
        assert "Missing credentials" in exc.value.message
        assert rec.retries == [] and breakers.state("m") == "closed"
        await c.aclose()
    assert up.calls == 0  # nothing went out

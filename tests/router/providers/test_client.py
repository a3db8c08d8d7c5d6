"""DownstreamClient against a real replay upstream with injected faults: retries with
backoff, fallbacks, usage from the provider, streaming, and the LiteLLM transport."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from decimal import Decimal
from typing import Literal

import httpx
import pytest

from pricing import ModelPrice, estimate_tokens
from router.health import BreakerConfig, CircuitBreakers
from router.pool import ModelPool, PoolModel
from router.providers.base import InFlight
from router.providers.client import DownstreamClient
from router.providers.errors import ProviderError, sanitize
from tests.support.replay import replay_root, start_replay_upstream, stop_replay_upstream

A, B = "gemma-2-9b-it", "llama-3.3-70b-instruct"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, httpx.Client]]:
    proc, base = start_replay_upstream(tmp_path_factory.mktemp("up"))
    with httpx.Client(base_url=replay_root(base), timeout=10) as ctl:
        yield base, ctl
    stop_replay_upstream(proc)


@pytest.fixture(autouse=True)
def _reset(upstream: tuple[str, httpx.Client]) -> None:
    upstream[1].delete("/_replay/faults")
    upstream[1].post("/_replay/reset")


def model(
    name: str,
    base: str,
    *,
    transport: Literal["native", "litellm"] = "native",
    retries: int = 2,
    fallbacks: tuple[str, ...] = (),
    timeout: float = 5.0,
) -> PoolModel:
    return PoolModel(
        name=name,
        provider="openai",
        upstream_model=name,
        api_base=base,
        api_key="sk-test-key-should-not-leak",
        transport=transport,
        price=ModelPrice(input=Decimal("0.1"), output=Decimal("0.2")),
        max_output_tokens=256,
        timeout_s=timeout,
        max_retries=retries,
        max_concurrency=8,
        fallbacks=fallbacks,
        description="",
    )


class Events:
    def __init__(self) -> None:
        self.retries: list[tuple[str, str]] = []
        self.fallbacks: list[str] = []
        self.errors: list[tuple[str, str]] = []
        self.deployments: list[tuple[str, str, bool]] = []

    def on_retry(self, m: str, kind: str) -> None:
        self.retries.append((m, kind))

    def on_fallback(self, m: str) -> None:
        self.fallbacks.append(m)

    def on_upstream_error(self, m: str, kind: str) -> None:
        self.errors.append((m, kind))

    def on_circuit(self, m: str, state: str) -> None:
        # Part of CallEvents, but the client never calls it: circuit changes reach the
        # gateway through CircuitBreakers(on_change=...), which these tests do not wire.
        pass

    def on_deployment(self, m: str, deployment: str, ok: bool) -> None:
        self.deployments.append((m, deployment, ok))


def make(
    base: str,
    *,
    transport: Literal["native", "litellm"] = "native",
    retries: int = 2,
    timeout: float = 5.0,
) -> tuple[DownstreamClient, Events]:
    ev = Events()
    pool = ModelPool(
        [
            model(A, base, transport=transport, retries=retries, fallbacks=(B,), timeout=timeout),
            model(B, base, transport=transport, retries=retries, timeout=timeout),
        ]
    )
    sleeps: list[float] = []

    async def no_sleep(s: float) -> None:
        sleeps.append(s)

    return DownstreamClient(pool, events=ev, sleep=no_sleep), ev


BODY = {"messages": [{"role": "user", "content": "hello there"}]}


async def test_usage_and_cost_come_from_the_provider(upstream: tuple[str, httpx.Client]) -> None:
    c, _ = make(upstream[0])
    r = await c.complete(A, BODY)
    assert r.model == A and r.attempts == 1
    assert r.usage.prompt_tokens == r.body["usage"]["prompt_tokens"]
    assert r.cost_micros == ModelPrice(input=Decimal("0.1"), output=Decimal("0.2")).cost_micros(
        r.usage
    )
    await c.aclose()


async def test_a_response_without_usage_is_charged_an_estimate(
    upstream: tuple[str, httpx.Client], caplog: pytest.LogCaptureFixture
) -> None:
    base, ctl = upstream
    ctl.post("/_replay/faults", json={"model": A, "fault": "no-usage", "count": 2})
    c, _ = make(base)
    r = await c.complete(A, BODY)
    assert "usage" not in r.body
    text = r.body["choices"][0]["message"]["content"]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (
        estimate_tokens("hello there"),
        estimate_tokens(text),
    )
    price = ModelPrice(input=Decimal("0.1"), output=Decimal("0.2"))
    assert r.cost_micros == price.cost_micros(r.usage) > 0
    # A stream that finishes without its usage chunk is complete, charged an estimate.
    sc = await c.open_stream(A, BODY)
    _ = [ch async for ch in sc.chunks]
    assert sc.usage_estimated and sc.stats.finish_reason == "stop"
    assert sc.usage().completion_tokens == max(
        len(sc.stats.text_parts), estimate_tokens(sc.stats.text)
    )
    assert "returned no usage" in caplog.text
    await c.aclose()


async def test_a_litellm_response_without_usage_is_charged_an_estimate(
    upstream: tuple[str, httpx.Client],
) -> None:
    # LiteLLM fills in a usage of zeros when the upstream sends none: it was charged $0.
    base, ctl = upstream
    ctl.post("/_replay/faults", json={"model": A, "fault": "no-usage", "count": 1})
    c, _ = make(base, transport="litellm")
    r = await c.complete(A, BODY)
    text = r.body["choices"][0]["message"]["content"]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (
        estimate_tokens("hello there"),
        estimate_tokens(text),
    )
    assert r.cost_micros == ModelPrice(input=Decimal("0.1"), output=Decimal("0.2")).cost_micros(
        r.usage
    )
    assert r.cost_micros > 0 and "usage" not in r.body
    await c.aclose()


@pytest.mark.parametrize("reported", [True, False])
async def test_a_litellm_stream_without_usage_is_charged_an_estimate(
    upstream: tuple[str, httpx.Client], caplog: pytest.LogCaptureFixture, reported: bool
) -> None:
    # Streaming, LiteLLM makes up a missing usage with its own tokenizer (not zeros): the
    # call is still charged the estimate, flagged as one, as on the native transport.
    base, ctl = upstream
    if not reported:
        ctl.post("/_replay/faults", json={"model": A, "fault": "no-usage", "count": 1})
    c, _ = make(base, transport="litellm")
    sc = await c.open_stream(A, BODY)
    with caplog.at_level("WARNING"):
        chunks = [ch async for ch in sc.chunks]
        usage = sc.usage()
    assert sc.usage_estimated is not reported
    assert any("usage" in ch for ch in chunks) is reported
    if reported:
        native, _ = make(base)
        plain = await native.complete(A, BODY)
        assert usage == plain.usage  # the upstream's own count, as it reports it unstreamed
        await native.aclose()
    else:
        assert usage.prompt_tokens == estimate_tokens("hello there")
        assert usage.completion_tokens == max(
            len(sc.stats.text_parts), estimate_tokens(sc.stats.text)
        )
    # Said once per model, by the stream read to its end (this client made no plain call).
    assert (f"upstream {A} returned no usage" in caplog.text) is not reported
    await c.aclose()


async def test_retryable_failures_are_retried_then_succeed(
    upstream: tuple[str, httpx.Client],
) -> None:
    base, ctl = upstream
    ctl.post("/_replay/faults", json={"model": A, "fault": "status=503", "count": 2})
    c, ev = make(base)
    r = await c.complete(A, BODY)
    assert r.model == A and r.attempts == 3 and r.fallback_from is None
    assert ev.retries == [(A, "upstream_5xx")] * 2
    assert ctl.get("/_replay/stats").json()["requests"][A] == 3
    await c.aclose()


async def test_exhausted_retries_fall_back(upstream: tuple[str, httpx.Client]) -> None:
    base, ctl = upstream
    ctl.post("/_replay/faults", json={"model": A, "fault": "status=429", "count": 3})
    c, ev = make(base)
    r = await c.complete(A, BODY)
    assert r.model == B and r.fallback_from == A and r.attempts == 4
    assert ev.fallbacks == [A]
    await c.aclose()


async def test_streams_retry_and_fall_back_as_plain_calls_do(
    upstream: tuple[str, httpx.Client], caplog: pytest.LogCaptureFixture
) -> None:
    # One loop makes both kinds of call's attempts: the same retries, the same fallback,
    # the same count of attempts, the same events and the same log line.
    base, ctl = upstream
    seen = []
    for stream in (False, True):
        ctl.post("/_replay/faults", json={"model": A, "fault": "status=429", "count": 3})
        c, ev = make(base)
        caplog.clear()
        with caplog.at_level("INFO", logger="router.providers.client"):
            if stream:
                sc = await c.open_stream(A, BODY)
                [ch async for ch in sc.chunks]
                got = (sc.model.name, sc.fallback_from, sc.attempts)
            else:
                r = await c.complete(A, BODY)
                got = (r.model, r.fallback_from, r.attempts)
        assert f"falling back from {A} to {B}" in caplog.text
        seen.append((got, ev.retries, ev.fallbacks))
        await c.aclose()
    assert seen[0] == seen[1] == ((B, A, 4), [(A, "rate_limited")] * 2, [A])


async def test_a_call_that_fails_says_how_many_attempts_it_made_and_why(
    upstream: tuple[str, httpx.Client],
) -> None:
    # A (3 tries) fails every time and B's circuit is open: the call ends with A's own
    # error, not B's "not called", and counts the three attempts that reached an upstream.
    base, ctl = upstream
    clock = [0.0]
    pool = ModelPool([model(A, base, fallbacks=(B,), retries=2), model(B, base)])
    breakers = CircuitBreakers(BreakerConfig(failures=5, cooldown_s=30), clock=lambda: clock[0])
    for _ in range(5):
        breakers.record_failure(B, "timeout")

    async def no_sleep(s: float) -> None:
        pass

    c = DownstreamClient(pool, events=Events(), sleep=no_sleep, breakers=breakers)
    for stream in (False, True):
        breakers.record_success(A)
        ctl.post("/_replay/faults", json={"model": A, "fault": "status=500", "count": 3})
        with pytest.raises(ProviderError) as exc:
            if stream:
                await c.open_stream(A, BODY)
            else:
                await c.complete(A, BODY)
        assert (exc.value.kind, exc.value.attempts) == ("upstream_5xx", 3), stream
    await c.aclose()


async def test_non_retryable_4xx_falls_back_without_retrying(
    upstream: tuple[str, httpx.Client],
) -> None:
    base, ctl = upstream
    ctl.post("/_replay/faults", json={"model": A, "fault": "status=400", "count": 1})
    c, ev = make(base)
    r = await c.complete(A, BODY)
    assert r.model == B and ev.retries == []
    await c.aclose()


async def test_timeouts_and_drops_raise_sanitized_errors(
    upstream: tuple[str, httpx.Client],
) -> None:
    base, ctl = upstream
    ctl.post("/_replay/faults", json={"model": B, "fault": "timeout=30", "count": 1})
    c, _ = make(base, retries=0, timeout=0.5)
    with pytest.raises(ProviderError) as ei:
        await c.complete(B, BODY)
    assert ei.value.kind == "timeout"
    ctl.post("/_replay/faults", json={"model": B, "fault": "status=500", "count": 1})
    with pytest.raises(ProviderError) as ei:
        await c.complete(B, BODY)
    assert ei.value.kind == "upstream_5xx"
    assert "sk-replay" not in ei.value.message and "10.1.2.3" not in ei.value.message
    ctl.post("/_replay/faults", json={"model": B, "fault": "drop", "count": 1})
    with pytest.raises(ProviderError) as ei:
        await c.complete(B, BODY)
    assert ei.value.kind == "connection"
    await c.aclose()


async def test_stream_retries_before_first_chunk_and_reports_usage(
    upstream: tuple[str, httpx.Client],
) -> None:
    base, ctl = upstream
    ctl.post("/_replay/faults", json={"model": A, "fault": "status=502", "count": 1})
    c, ev = make(base)
    sc = await c.open_stream(A, BODY)
    chunks = [ch async for ch in sc.chunks]
    assert sc.attempts == 2 and ev.retries == [(A, "upstream_5xx")]
    assert sc.stats.usage is not None and sc.stats.usage.completion_tokens > 0
    assert not sc.usage_estimated and sc.usage() == sc.stats.usage
    assert sc.stats.text and any(ch.get("choices") for ch in chunks)
    assert sc.cost_micros() > 0
    await c.aclose()


async def test_cut_stream_is_an_error(upstream: tuple[str, httpx.Client]) -> None:
    base, ctl = upstream
    ctl.post("/_replay/faults", json={"model": B, "fault": "cut-stream=1", "count": 1})
    c, _ = make(base)
    sc = await c.open_stream(
        B,
        {
            "messages": [
                {"role": "user", "content": "a longer question that gets a longer answer " * 3}
            ]
        },
    )
    with pytest.raises(ProviderError):
        async for _ in sc.chunks:
            pass
    # The upstream was paid for what it sent before breaking off: with no usage chunk the
    # call is charged an estimate (prompt characters / 4, the relayed text), never zero.
    assert sc.usage_estimated and sc.stats.text
    usage = sc.usage()
    assert usage.prompt_tokens == estimate_tokens(
        "a longer question that gets a longer answer " * 3
    )
    assert usage.completion_tokens == max(len(sc.stats.text_parts), estimate_tokens(sc.stats.text))
    assert (sc.stats.generated_parts, sc.stats.generated_chars) == (
        len(sc.stats.text_parts),
        len(sc.stats.text),
    )
    assert sc.cost_micros() == sc.model.price.cost_micros(usage) > 0
    await c.aclose()


async def test_litellm_transport_calls_the_same_upstream(
    upstream: tuple[str, httpx.Client],
) -> None:
    base, ctl = upstream
    c, _ = make(base, transport="litellm")
    r = await c.complete(A, BODY)
    assert r.model == A and r.usage.completion_tokens > 0
    assert r.body["choices"][0]["message"]["content"]
    # In OpenAI's shape, as the native transport relays it: LiteLLM's objects dumped without
    # their Nones dropped the nullable fields OpenAI always sends, and added their own.
    choice = r.body["choices"][0]
    assert choice["logprobs"] is None and choice["message"]["refusal"] is None
    assert "provider_specific_fields" not in str(r.body)
    ctl.post("/_replay/faults", json={"model": A, "fault": "status=503", "count": 1})
    r = await c.complete(A, BODY)
    assert r.attempts == 2
    sc = await c.open_stream(B, BODY)
    chunks = [ch async for ch in sc.chunks]
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    assert text and sc.stats.usage is not None
    # Every choice of every chunk has its finish_reason, null until the last.
    reasons = [c["finish_reason"] for ch in chunks for c in ch["choices"]]
    assert reasons[-1] == "stop" and set(reasons[:-1]) == {None}
    await c.aclose()


def test_sanitize_strips_secrets_urls_and_addresses() -> None:
    msg = "bad key sk-abcdef1234567890 at https://internal.corp:8443/v1?sig=abc from 10.0.0.5:9000; Authorization: Bearer xyz.abc api_key=hunter2"
    out = sanitize(msg, "hunter2")
    for leak in ("sk-abcdef", "internal.corp", "10.0.0.5", "xyz.abc", "hunter2"):
        assert leak not in out
    # Keys the gateway was not configured with (a provider SDK read them from the
    # environment) in the shapes providers give them, and basic auth and passwords.
    others = (
        "key AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW rejected; groq gsk_0123456789abcdefABCDEF "
        "hf_abcdefghijklmnopqrstuv; Authorization: Basic dXNlcjpwYXNzd29yZA== password=s3cr3t!"
    )
    out = sanitize(others)
    for leak in ("AIzaSy", "gsk_0123", "hf_abcdef", "dXNlcjpw", "s3cr3t"):
        assert leak not in out, out
    assert "rejected" in out and "password=[redacted]" in out
    # The sentence around a URL survives it.
    assert sanitize("failed (upstream m at http://10.1.2.3:8000/v1). Retry.") == (
        "failed (upstream m at [redacted]). Retry."
    )


async def test_an_open_circuit_skips_the_model_then_a_probe_closes_it(
    upstream: tuple[str, httpx.Client],
) -> None:
    """With A's upstream failing, two failed attempts open A's circuit: later requests go
    straight to the fallback without calling A; after the cooldown one request probes A."""
    base, ctl = upstream
    clock = [0.0]
    ev = Events()
    pool = ModelPool([model(A, base, fallbacks=(B,), retries=1), model(B, base, retries=1)])
    breakers = CircuitBreakers(BreakerConfig(failures=2, cooldown_s=30), clock=lambda: clock[0])

    async def no_sleep(s: float) -> None:
        pass

    c = DownstreamClient(pool, events=ev, sleep=no_sleep, breakers=breakers)
    ctl.post("/_replay/faults", json={"model": A, "fault": "status=500", "count": 100})
    first = await c.complete(A, BODY)
    assert first.model == B and first.attempts == 3  # A twice, then B
    assert first.fallback_reason == "upstream_5xx"  # A was called and failed
    assert breakers.state(A) == "open"
    second = await c.complete(A, BODY)
    assert second.model == B and second.attempts == 1 and second.fallback_from == A
    assert [e.kind for e in second.errors] == ["circuit_open"]
    assert second.fallback_reason == "circuit_open"  # A was never called
    stream = await c.open_stream(A, BODY)
    assert stream.model.name == B and [e.kind for e in stream.errors] == ["circuit_open"]
    assert stream.fallback_reason == "circuit_open"
    _ = [ch async for ch in stream.chunks]
    assert ctl.get("/_replay/stats").json()["requests"][A] == 2  # never called again
    assert ev.errors.count((A, "circuit_open")) == 2
    # With every model open, a call fails at once with circuit_open.
    breakers.record_failure(B, "timeout")
    breakers.record_failure(B, "timeout")
    with pytest.raises(ProviderError) as exc:
        await c.complete(A, BODY)
    assert exc.value.kind == "circuit_open" and "temporarily" in exc.value.message
    # The cooldown passes and A recovers: the next request probes A and closes its circuit.
    ctl.delete("/_replay/faults")
    clock[0] += 30
    probe = await c.complete(A, BODY)
    assert probe.model == A and probe.fallback_from is None and probe.fallback_reason is None
    assert breakers.state(A) == "closed"
    await c.aclose()


async def test_a_call_whose_fallback_failed_too_says_why_it_left_the_model_asked_for(
    upstream: tuple[str, httpx.Client],
) -> None:
    """The error a call gives up with is its last model's: a fallback's, once the chain went
    on to one. Its ``fallback_reason`` says why the call left the model asked for, so a
    model its circuit kept away is told from one that was called and failed; the call's
    ``InFlight`` says it too while a fallback has the request."""
    base, ctl = upstream
    pool = ModelPool([model(A, base, fallbacks=(B,)), model(B, base)])
    breakers = CircuitBreakers(BreakerConfig(failures=1, cooldown_s=30), clock=lambda: 0.0)
    c = DownstreamClient(pool, breakers=breakers)
    ctl.post("/_replay/faults", json={"model": "*", "fault": "status=401", "count": 100})
    called = InFlight()
    with pytest.raises(ProviderError) as exc:
        await c.complete(A, BODY, in_flight=called)
    # A 401 is the gateway's setup, not the upstream's trouble: no circuit opens.
    assert (exc.value.model, exc.value.fallback_reason) == (B, "upstream_4xx")
    assert called.fallback_reason == "upstream_4xx"
    breakers.record_failure(A, "timeout")  # A's circuit opens
    for open_call in (c.complete, c.open_stream):
        kept_away = InFlight()
        with pytest.raises(ProviderError) as exc:
            await open_call(A, BODY, in_flight=kept_away)
        assert (exc.value.kind, exc.value.model) == ("upstream_4xx", B)
        assert exc.value.fallback_reason == kept_away.fallback_reason == "circuit_open"
    # A call that never went on to a fallback has no reason to give.
    with pytest.raises(ProviderError) as exc:
        await c.complete(B, BODY)
    assert exc.value.fallback_reason is None
    assert ctl.get("/_replay/stats").json()["requests"][A] == 1
    await c.aclose()


@pytest.mark.parametrize("transport", ["native", "litellm"])
async def test_streams_cut_mid_answer_open_the_circuit_and_cool_the_deployment(
    upstream: tuple[str, httpx.Client], transport: Literal["native", "litellm"]
) -> None:
    """A stream that breaks off after its first chunk can't be retried (its text reached
    the client), but it is a failed attempt: it counts against the circuit and cools the
    deployment down. Success was booked at the first chunk, so a model that cut every
    answer short never opened its circuit."""
    base, ctl = upstream
    m = model(A, base, transport=transport, retries=0)
    deployments = tuple(dataclasses.replace(m, deployment=d) for d in ("a", "b"))
    pool = ModelPool([dataclasses.replace(m, deployments=deployments)])
    ev = Events()
    breakers = CircuitBreakers(BreakerConfig(failures=2, cooldown_s=30))
    c = DownstreamClient(pool, events=ev, breakers=breakers)
    ctl.post("/_replay/faults", json={"model": A, "fault": "cut-stream=1", "count": 2})
    for i in range(2):
        sc = await c.open_stream(A, BODY)
        with pytest.raises(ProviderError) as exc:
            async for _ in sc.chunks:
                pass
        assert exc.value.kind == "connection" and sc.attempts == 1
        cooling = {"a", "b"} if i else {sc.model.deployment}
        assert set(c.balancer.cooling()[A]) == cooling
    assert ev.errors == [(A, "connection")] * 2
    assert [ok for *_, ok in ev.deployments] == [False, False]
    assert breakers.state(A) == "open"
    with pytest.raises(ProviderError) as exc:
        await c.open_stream(A, BODY)
    assert exc.value.kind == "circuit_open"
    await c.aclose()


async def test_a_probe_answered_with_a_client_error_closes_the_circuit(
    upstream: tuple[str, httpx.Client],
) -> None:
    """The upstream answered the half-open probe, with a 400 for that request: it is up. The
    probe slot was kept, and the model refused, for another full cooldown."""
    base, ctl = upstream
    clock = [0.0]
    breakers = CircuitBreakers(BreakerConfig(failures=1, cooldown_s=30), clock=lambda: clock[0])
    c = DownstreamClient(ModelPool([model(A, base, retries=0)]), breakers=breakers)
    ctl.post("/_replay/faults", json={"model": A, "fault": "status=503", "count": 1})
    with pytest.raises(ProviderError):
        await c.complete(A, BODY)
    assert breakers.state(A) == "open"
    clock[0] += 30
    ctl.post("/_replay/faults", json={"model": A, "fault": "status=400", "count": 1})
    with pytest.raises(ProviderError) as exc:
        await c.open_stream(A, BODY)
    assert exc.value.kind == "bad_request"
    assert breakers.state(A) == "closed"
    sc = await c.open_stream(A, BODY)
    assert [ch async for ch in sc.chunks]
    await c.aclose()
